"""Export that never hurts the service: spans survive a quick worker exit (case 7, and
the pre-fork variant) and a dead collector costs the requests nothing (case 8)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from inferpath.instrumentation import provider
from inferpath.instrumentation.stages import stage

REPO = Path(__file__).resolve().parents[2]


class Collector:
    """A real OTLP/HTTP receiver (protobuf) on 127.0.0.1 that keeps every span it gets."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict, str]] = []  # (resource attributes, span name)
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    resource = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
                    for scope_spans in resource_spans.scope_spans:
                        collector.spans.extend((resource, s.name) for s in scope_spans.spans)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def collector() -> Iterator[Collector]:
    receiver = Collector()
    yield receiver
    receiver.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


WORKER = textwrap.dedent("""
    import sys, uvicorn
    from fastapi import FastAPI
    import inferpath
    from inferpath.instrumentation import provider

    provider.configure("worker", otlp_endpoint=sys.argv[1], schedule_delay_seconds=5.0)
    app = FastAPI()
    inferpath.instrument(app, service_name="worker")

    @app.get("/v1/answer")
    async def answer() -> dict:
        with inferpath.stage("tokenize"):
            pass
        with inferpath.stage("retrieval"):
            pass
        return {"ok": True}

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
""")


def test_case7_worker_exiting_200ms_after_its_request_exports_all_spans(collector, tmp_path) -> None:
    port = closed_port()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    worker = subprocess.Popen(
        [sys.executable, str(script), collector.url, str(port)], stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/v1/answer")
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline and worker.poll() is None, "worker did not start"
                time.sleep(0.05)
        assert response.json() == {"ok": True}
        time.sleep(0.2)
        stopped = time.monotonic()
        worker.send_signal(signal.SIGTERM)  # uvicorn's graceful shutdown, then interpreter exit
        worker.wait(10)
        exit_seconds = time.monotonic() - stopped
    finally:
        if worker.poll() is None:
            worker.kill()
    # uvicorn ends a graceful SIGTERM shutdown by re-raising the signal (no atexit hooks):
    # the spans must have left during the ASGI lifespan shutdown.
    assert worker.returncode in (0, -signal.SIGTERM), worker.stderr.read()[-2000:]
    assert sorted(name for _, name in collector.spans) == ["GET /v1/answer", "retrieval", "tokenize"]
    assert exit_seconds < 2.5  # the 5 s batch delay did not hold the exit


PREFORK = textwrap.dedent("""
    import os, sys
    from inferpath.instrumentation import provider

    provider.configure("prefork", otlp_endpoint=sys.argv[1], schedule_delay_seconds=5.0)
    children = []
    for worker in range(2):
        pid = os.fork()
        if pid == 0:  # a worker: serve, then leave the normal way (atexit runs)
            tracer = provider.get_tracer()
            for n in range(3):
                tracer.start_span(f"worker{worker}-span{n}").end()
            sys.exit(0)
        children.append(pid)
    codes = [os.waitpid(pid, 0)[1] for pid in children]
    sys.exit(1 if any(codes) else 0)
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_case7_provider_built_before_fork_each_worker_exports_its_own(collector, tmp_path) -> None:
    script = tmp_path / "prefork.py"
    script.write_text(PREFORK)
    done = subprocess.run([sys.executable, str(script), collector.url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    by_instance: dict[str, set[str]] = defaultdict(set)
    for resource, name in collector.spans:
        by_instance[resource["service.instance.id"]].add(name)
    assert len(collector.spans) == 6
    assert sorted(map(sorted, by_instance.values())) == [[f"worker{w}-span{n}" for n in range(3)] for w in range(2)]


def test_case8_closed_collector_port_shutdown_within_budget_failures_counted(caplog) -> None:
    port = closed_port()
    failed_before = provider.export_failed_spans_total()
    provider.configure(
        "outage", otlp_endpoint=f"http://127.0.0.1:{port}", schedule_delay_seconds=0.05, export_timeout_seconds=0.5
    )
    tracer = provider.get_tracer()
    with caplog.at_level(logging.INFO):
        for wave in range(3):
            for n in range(100 if wave == 0 else 10):
                tracer.start_span(f"s{n}").end()
            deadline = time.monotonic() + 5
            while provider.export_failed_spans_total() - failed_before < 100 + 10 * wave:
                assert time.monotonic() < deadline, "failed exports were not counted"
                time.sleep(0.05)
        tracer.start_span("last").end()
        started = time.monotonic()
        provider.shutdown(3.0)
        shutdown_seconds = time.monotonic() - started
    assert shutdown_seconds <= 3.5  # the configured budget, well under 5 s
    assert provider.export_failed_spans_total() - failed_before >= 120
    ours = [r for r in caplog.records if "could not be exported" in r.getMessage()]
    exporter = [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
    assert len(ours) == 1  # three failed waves, one line
    assert len(exporter) <= 2  # one per level at most, per 30 s


EXPORT_TIMEOUT_SECONDS = 2.0


def test_case8_requests_during_the_outage_do_not_wait_for_the_export(collector, serve_app) -> None:
    """A collector that accepts connections and never answers holds each export for the whole
    export timeout (2 s); a request that waited for its spans' export would take that long.
    The guard is the median against half that timeout: a hang guard that a loaded machine
    cannot trip. The p99 target (outage <= 1.10x collector up, same run) is measured by
    ``bench/export_outage.py`` (figures in bench/README.md)."""
    from fastapi import FastAPI

    import inferpath

    app = FastAPI()

    @app.get("/v1/answer")
    async def answer() -> dict:
        with stage("retrieval"):
            time.sleep(0.03)  # CPU-side work of the request, as a real handler has
        return {"ok": True}

    def durations_seconds(base_url: str) -> list[float]:
        with httpx.Client() as client:
            client.get(f"{base_url}/v1/answer")
            durations = []
            for _ in range(50):
                started = time.perf_counter()
                client.get(f"{base_url}/v1/answer").raise_for_status()
                durations.append(time.perf_counter() - started)
        return durations

    blackhole = socket.socket()  # the kernel completes each connection; nothing ever answers
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(64)
    up = dict(otlp_endpoint=collector.url, schedule_delay_seconds=0.05, export_timeout_seconds=0.5)
    down = dict(
        otlp_endpoint=f"http://127.0.0.1:{blackhole.getsockname()[1]}",
        schedule_delay_seconds=0.05,
        export_timeout_seconds=EXPORT_TIMEOUT_SECONDS,
    )
    provider.configure("p99", **up)
    inferpath.instrument(app, service_name="p99")
    try:
        with serve_app(app) as base_url:
            baseline_durations = durations_seconds(base_url)
            failed_before = provider.export_failed_spans_total()
            provider.configure("p99", **down)
            outage_durations = durations_seconds(base_url)
            deadline = time.monotonic() + 4 * EXPORT_TIMEOUT_SECONDS + 10
            while provider.export_failed_spans_total() <= failed_before:  # really down
                assert time.monotonic() < deadline, "the exports to the silent collector never failed"
                time.sleep(0.1)
    finally:
        inferpath.uninstrument(app)
        provider.shutdown(2.0)
        blackhole.close()
    assert len(collector.spans) >= 50  # the baseline really exported
    outage_median = statistics.median(outage_durations)
    assert outage_median < EXPORT_TIMEOUT_SECONDS / 2, (outage_median, statistics.median(baseline_durations))
