"""Fixture: a real inferpath server holding the recorded vLLM capture (see ``capture_server.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest

from inferpath.config import Settings

from capture_server import CAPTURE, PROTOBUF, FedServer, capture_time, metrics_body


@pytest.fixture(scope="module")
def fed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FedServer]:
    """Start a server, post the capture's traces and gauges, flush, yield, stop."""
    if not CAPTURE.is_dir():
        pytest.skip(f"recorded vLLM capture {CAPTURE} is not present")
    from inferpath.collectors.prometheus import scrape_samples
    from inferpath.server.runtime import serve_in_thread

    store = tmp_path_factory.mktemp("dashboard") / "store"
    running = serve_in_thread(Settings(store_url=f"chdb://{store}", assembly_settle_seconds=0.5),
                              port=0)
    try:
        with httpx.Client(base_url=running.url, timeout=30.0) as http:
            trace_files = sorted((CAPTURE / "otlp").glob("*.pb"))
            for body_path in trace_files:
                response = http.post("/v1/traces", content=body_path.read_bytes(), headers=PROTOBUF)
                assert response.status_code == 200, (body_path.name, response.text)
            scrapes = sorted(CAPTURE.glob("metrics_*.prom"))
            samples = [sample for path in scrapes for sample in scrape_samples(
                path.read_text(), "vllm", timestamp=capture_time(path))]
            response = http.post("/v1/metrics", content=metrics_body(samples), headers=PROTOBUF)
            assert response.status_code == 200, response.text
            flushed = http.post("/api/v1/flush").json()
            assert flushed["ok"], flushed
        # Requests started before their spans were posted, and the scrapes run alongside:
        # a window from a little before the first scrape to after the last post covers all.
        first = min(capture_time(scrapes[0]), capture_time(trace_files[0]))
        last = max(capture_time(scrapes[-1]), capture_time(trace_files[-1]))
        start = first.replace(second=0, microsecond=0) - timedelta(minutes=2)
        end = last.replace(second=0, microsecond=0) + timedelta(minutes=2)
        yield FedServer(running.url, start, end, flushed["requests_inserted_total"])
    finally:
        running.stop()
