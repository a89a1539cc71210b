"""What the receiver refuses or drops of a client's exports is said in the server's log, rate-limited."""

from __future__ import annotations

import json
import logging
import math
import time

import httpx
import pytest

from inferpath.config import Settings
from inferpath.ratelimited_log import RateLimitedLog
from inferpath.server.runtime import serve_in_thread

from .otlp_factory import trace_body

PROTOBUF = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}
APP_LOGGER = "inferpath.server.app"


def test_rate_limited_log_says_what_it_suppressed(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("inferpath.tests.ratelimited")
    log = RateLimitedLog(logger, interval_seconds=0.3)
    with caplog.at_level(logging.INFO, logger=logger.name):
        assert log.warning("first %d", 1) is True
        assert log.warning("second %d", 2) is False
        assert log.log(logging.INFO, "third %d", 3) is False
        time.sleep(0.35)
        assert log.log(logging.INFO, "fourth %d", 4) is True
        assert log.warning("fifth") is False
        time.sleep(0.35)
        assert log.warning("sixth") is True
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "first 1"),
        (logging.INFO, "fourth 4 (2 similar messages suppressed)"),
        (logging.WARNING, "sixth (1 similar message suppressed)"),
    ]


def test_rate_limited_log_with_no_interval_logs_every_line(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("inferpath.tests.ratelimited")
    log = RateLimitedLog(logger, interval_seconds=0)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        assert all(log.warning("line %d", n) for n in range(3))
    assert [r.getMessage() for r in caplog.records] == ["line 0", "line 1", "line 2"]


@pytest.mark.parametrize("interval", [-1.0, math.nan])
def test_rate_limited_log_refuses_a_bad_interval(interval: float) -> None:
    with pytest.raises(ValueError, match="interval_seconds"):
        RateLimitedLog(logging.getLogger("x"), interval_seconds=interval)


def _app_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == APP_LOGGER and r.levelno >= logging.WARNING]


def test_refused_and_partly_rejected_exports_are_logged_once_per_interval(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    running = serve_in_thread(Settings(store_url=store_url), port=0)
    try:
        with caplog.at_level(logging.INFO, logger=APP_LOGGER), httpx.Client(base_url=running.url, timeout=30) as http:
            assert http.post("/v1/traces", content=b"\x0a\x05oops", headers=PROTOBUF).status_code == 400
            # A second refusal within the interval: answered and counted, not logged.
            assert http.post("/v1/metrics", content=b"{}", headers={"content-type": "text/csv"}).status_code == 415
            valid = {
                "traceId": "0102030405060708090a0b0c0d0e0f10",
                "spanId": "0102030405060708",
                "name": "ok",
                "startTimeUnixNano": str(time.time_ns()),
                "endTimeUnixNano": str(time.time_ns() + 1000),
            }
            body = {"resourceSpans": [{"scopeSpans": [{"spans": [valid, dict(valid, spanId="0" * 16)]}]}]}
            partial = http.post("/v1/traces", content=json.dumps(body).encode(), headers=JSON)
            assert partial.status_code == 200 and int(partial.json()["partialSuccess"]["rejectedSpans"]) == 1
            fine, _ = trace_body(spans_per_trace=2)
            assert http.post("/v1/traces", content=fine, headers=PROTOBUF).status_code == 200
            assert "inferpath_server_otlp_bad_requests_total 2.0" in http.get("/metrics").text
    finally:
        running.stop()
    lines = _app_lines(caplog)
    assert len(lines) == 2, lines
    refused, rejected = lines
    assert refused.startswith("OTLP traces export from 127.0.0.1:") and " answered 400: " in refused
    assert rejected.startswith("OTLP traces export from 127.0.0.1:")
    assert "stored without what it rejected: 1 span rejected: " in rejected and "spanId is all zeros" in rejected


def test_an_export_without_the_token_is_logged(store_url: str, caplog: pytest.LogCaptureFixture) -> None:
    running = serve_in_thread(Settings(store_url=store_url, token="s3cret"), port=0)
    try:
        with caplog.at_level(logging.INFO, logger=APP_LOGGER), httpx.Client(base_url=running.url, timeout=30) as http:
            body, _ = trace_body(spans_per_trace=2)
            assert http.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 401
            assert (
                http.post(
                    "/v1/traces", content=body, headers={**PROTOBUF, "authorization": "Bearer s3cret"}
                ).status_code
                == 200
            )
    finally:
        running.stop()
    (line,) = _app_lines(caplog)
    assert line.startswith("OTLP export to /v1/traces from 127.0.0.1:") and "answered 401" in line
    assert "s3cret" not in line
