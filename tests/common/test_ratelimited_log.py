"""The one rate limiter of inferpath's logs (inferpath/ratelimited_log.py): the filter for
other libraries' loggers and the injectable clock. The suppressed-count suffix of
RateLimitedLog is tested with the receiver's refusal log (tests/server/test_refusal_log.py)."""

from __future__ import annotations

import logging
import time

import pytest

from inferpath.ratelimited_log import RateLimitedLog, RateLimitFilter


def test_filter_lets_one_record_per_logger_and_level_through(caplog: pytest.LogCaptureFixture) -> None:
    chatty, other = logging.getLogger("inferpath.tests.chatty"), logging.getLogger("inferpath.tests.other")
    limit = RateLimitFilter(interval_seconds=0.3)
    for logger in (chatty, other):
        logger.addFilter(limit)
    try:
        with caplog.at_level(logging.INFO):
            for n in range(5):
                chatty.warning("batch %d failed", n)
                chatty.info("retrying %d", n)
                other.warning("other %d", n)
            time.sleep(0.35)
            chatty.warning("batch 5 failed")
    finally:
        for logger in (chatty, other):
            logger.removeFilter(limit)
    assert [r.getMessage() for r in caplog.records] == ["batch 0 failed", "retrying 0", "other 0", "batch 5 failed"]
    assert limit.suppressed_total == 12


def test_log_on_a_given_clock() -> None:
    now = [100.0]
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("inferpath.tests.clocked")
    logger.addHandler(Collect())
    logger.propagate = False
    log = RateLimitedLog(logger, interval_seconds=60.0, clock=lambda: now[0])
    assert log.warning("off: %s", "no driver") is True
    now[0] += 59.0
    assert log.warning("off: %s", "no driver") is False
    now[0] += 1.0
    assert log.warning("off: %s", "still") is True
    assert lines == ["off: no driver", "off: still (1 similar message suppressed)"]
    with pytest.raises(ValueError, match="interval_seconds"):
        RateLimitFilter(interval_seconds=-1)
