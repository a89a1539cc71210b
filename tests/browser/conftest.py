"""Fixtures: a real inferpath server holding the recorded vLLM capture (see
``capture_server.py``), and one holding the store of a short demo run."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
import pytest
from capture_server import CAPTURE, PROTOBUF, FedServer, capture_time, metrics_body

from inferpath.config import Settings


@pytest.fixture(scope="module")
def fed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FedServer]:
    """Start a server, post the capture's traces and gauges, flush, yield, stop."""
    if not CAPTURE.is_dir():
        pytest.skip(f"recorded vLLM capture {CAPTURE} is not present")
    from inferpath.collectors.prometheus import scrape_samples
    from inferpath.server.runtime import serve_in_thread

    store = tmp_path_factory.mktemp("dashboard") / "store"
    running = serve_in_thread(Settings(store_url=f"chdb://{store}", assembly_settle_seconds=0.5), port=0)
    try:
        with httpx.Client(base_url=running.url, timeout=30.0) as http:
            trace_files = sorted((CAPTURE / "otlp").glob("*.pb"))
            for body_path in trace_files:
                response = http.post("/v1/traces", content=body_path.read_bytes(), headers=PROTOBUF)
                assert response.status_code == 200, (body_path.name, response.text)
            scrapes = sorted(CAPTURE.glob("metrics_*.prom"))
            samples = [
                sample
                for path in scrapes
                for sample in scrape_samples(path.read_text(), "vllm", timestamp=capture_time(path))
            ]
            response = http.post("/v1/metrics", content=metrics_body(samples), headers=PROTOBUF)
            assert response.status_code == 200, response.text
            flushed = http.post("/api/v1/flush", timeout=120).json()
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


@dataclass(frozen=True)
class DemoServer:
    """A server over the store of a short demo run: ``url``, the run's window, and the
    scenario that ran (``kv-pressure`` when the scenarios exist, else ``None``: plain demo)."""

    url: str
    start: datetime
    end: datetime
    scenario: str | None
    fault_start: datetime | None = None
    fault_end: datetime | None = None
    """The fault phase of the scenario (``None`` for the plain demo)."""


# Module scope: embedded chDB allows one open data folder per process, so this store must be
# closed before another module's fixture opens its own.
@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory, scenario_runs) -> Iterator[DemoServer]:
    """Serve the store of a short demo and yield: the session's ``kv-pressure`` scenario run
    (2 × 60 requests, ~30 s, shared with the scenario suite), else 60 requests of the plain
    demo at 20× speed."""
    from inferpath.server.runtime import serve_in_thread

    base = tmp_path_factory.mktemp("demo-run")
    store_url = f"chdb://{base / 'store'}"
    try:
        from inferpath.demo.scenarios import SCENARIOS
    except ImportError:
        SCENARIOS = {}
    if "kv-pressure" in SCENARIOS:
        outcome = scenario_runs.outcome("kv-pressure")
        store_url = outcome.store_url
        start, end, scenario = outcome.baseline_window[0], outcome.fault_window[1], "kv-pressure"
        fault = outcome.fault_window
    else:
        from inferpath.demo.run import DemoOptions, run_demo

        outcome = run_demo(
            DemoOptions(
                requests=60,
                speed=20.0,
                exit_when_done=True,
                store_url=store_url,
                port=0,
                dashboard=False,
                log_dir=base / "logs",
            )
        )
        start, end, scenario = outcome.window_start, outcome.window_end, None
        fault = (None, None)
    running = serve_in_thread(Settings(store_url=store_url), port=0)
    try:
        yield DemoServer(
            running.url,
            start.replace(microsecond=0) - timedelta(seconds=10),
            end.replace(microsecond=0) + timedelta(seconds=10),
            scenario,
            *fault,
        )
    finally:
        running.stop()
