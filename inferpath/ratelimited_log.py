"""Repeated log lines, said at most once per interval: the one rate limiter of inferpath's logs.

- :class:`RateLimitedLog`: for a problem inferpath itself reports (a refused export, a
  failed scrape, a failed insert, an unreachable server): one line per interval, and the
  next line says how many were suppressed meanwhile.
- :class:`RateLimitFilter`: for loggers inferpath does not call itself (the OpenTelemetry
  exporter logs once per failed batch): one record per (logger, level) per interval, the
  rest dropped and counted.

Both use the monotonic clock unless given another (tests, a poller's own clock).
:func:`configure_logging` is the log set-up of inferpath's long-running processes (the
server, the collector agent).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["QUIET_LOGGERS", "RateLimitFilter", "RateLimitedLog", "configure_logging"]

QUIET_LOGGERS = ("httpx", "httpcore")
"""Libraries that log every HTTP call at INFO: the collectors' scrapes made two such lines a
second, which buried inferpath's own messages. They keep WARNING and above."""


def configure_logging(level: int = logging.INFO) -> None:
    """Log records of ``level`` and above to stderr, one line each with time, level and
    logger; :data:`QUIET_LOGGERS` only from WARNING, so inferpath's own INFO lines stand out."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))


def _check_interval(interval_seconds: float) -> None:
    if not interval_seconds >= 0:
        raise ValueError(f"interval_seconds must be >= 0, got {interval_seconds!r}")


class RateLimitedLog:
    """At most one line per ``interval_seconds`` (``clock``: seconds, default the monotonic
    clock) on ``logger``; the next line after a quiet spell says how many were suppressed
    since the last one. Thread-safe: the lines are formatted and written outside the lock.
    Raises ``ValueError`` for a negative interval."""

    def __init__(
        self, logger: logging.Logger, interval_seconds: float = 10.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        _check_interval(interval_seconds)
        self._logger = logger
        self._interval_seconds = interval_seconds
        self._clock = clock
        self._last = float("-inf")
        self._suppressed = 0
        self._lock = threading.Lock()

    def log(self, level: int, message: str, *args: Any) -> bool:
        """Log ``message % args`` at ``level`` unless a line went out less than the interval
        ago (then count it); True when it was logged."""
        now = self._clock()
        with self._lock:
            if now - self._last < self._interval_seconds:
                self._suppressed += 1
                return False
            suppressed, self._last, self._suppressed = self._suppressed, now, 0
        suffix = f" ({suppressed} similar message{'s' * (suppressed != 1)} suppressed)" if suppressed else ""
        self._logger.log(level, message + suffix, *args)
        return True

    def warning(self, message: str, *args: Any) -> bool:
        """:meth:`log` at ``WARNING``."""
        return self.log(logging.WARNING, message, *args)


class RateLimitFilter(logging.Filter):
    """A filter letting one record per (logger name, level) through every
    ``interval_seconds`` (monotonic clock); the others are dropped and counted in
    ``suppressed_total``. Add it to the loggers to quiet (``logger.addFilter``). Thread-safe.
    Raises ``ValueError`` for a negative interval."""

    def __init__(self, interval_seconds: float = 30.0) -> None:
        super().__init__()
        _check_interval(interval_seconds)
        self.interval_seconds = interval_seconds
        self.suppressed_total = 0
        self._last: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno)
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_seconds:
                self.suppressed_total += 1
                return False
            self._last[key] = now
            return True
