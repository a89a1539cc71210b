"""Request latency while the OTLP collector is down: p99 with the collector up (the
reference, same run) against p99 with its port closed, through a real FastAPI app served by
uvicorn on 127.0.0.1 and instrumented by ``inferpath.instrument``.

Each request does 30 ms of CPU-side work inside a stage span, as a real handler would. Rounds
of ``--requests`` requests alternate between the two sides (collector up, then a closed port
with a 0.5 s export timeout), so drifts in outside load hit both; the durations are pooled
into one p99 per side. The ratio is printed with the load average at both ends: on a shared
2-core machine the p99 of a few hundred requests moves by more than 10 % on its own, so read
the ratio from a quiet machine.

    python bench/export_outage.py [--requests 50] [--rounds 3]

Target: outage p99 <= 1.10 x the collector-up p99 of the same run. (CI keeps a hang guard
of the same path in ``tests/instrumentation/test_instrumentation_export.py``.)
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import uvicorn
from fastapi import FastAPI

import inferpath
from inferpath.instrumentation import provider
from inferpath.instrumentation.stages import stage


class _Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server API
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _durations_seconds(base_url: str, requests: int) -> list[float]:
    with httpx.Client() as client:
        client.get(f"{base_url}/v1/answer")
        durations = []
        for _ in range(requests):
            started = time.perf_counter()
            client.get(f"{base_url}/v1/answer").raise_for_status()
            durations.append(time.perf_counter() - started)
    return durations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50, help="requests per side per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    up = dict(
        otlp_endpoint=f"http://127.0.0.1:{sink.server_port}", schedule_delay_seconds=0.05, export_timeout_seconds=0.5
    )
    down = dict(
        otlp_endpoint=f"http://127.0.0.1:{_closed_port()}", schedule_delay_seconds=0.05, export_timeout_seconds=0.5
    )

    app = FastAPI()

    @app.get("/v1/answer")
    async def answer() -> dict:
        with stage("retrieval"):
            time.sleep(0.03)
        return {"ok": True}

    provider.configure("export-outage", **up)
    inferpath.instrument(app, service_name="export-outage")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    base_url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    load_start = os.getloadavg()[0]
    baseline: list[float] = []
    outage: list[float] = []
    failed_before = provider.export_failed_spans_total()
    try:
        for _ in range(args.rounds):
            provider.configure("export-outage", **up)
            baseline += _durations_seconds(base_url, args.requests)
            provider.configure("export-outage", **down)
            outage += _durations_seconds(base_url, args.requests)
            time.sleep(0.7)
    finally:
        inferpath.uninstrument(app)
        provider.shutdown(2.0)
        server.should_exit = True
        thread.join(10)
        sink.shutdown()
    failed = provider.export_failed_spans_total() - failed_before
    p99_up = statistics.quantiles(baseline, n=100)[98]
    p99_down = statistics.quantiles(outage, n=100)[98]
    print(
        f"load average {load_start:.2f} -> {os.getloadavg()[0]:.2f}; "
        f"{len(baseline)} requests per side, {failed} spans failed to export during the outage"
    )
    print(f"collector up:   p50 {statistics.median(baseline) * 1e3:.1f} ms, p99 {p99_up * 1e3:.1f} ms")
    print(f"collector down: p50 {statistics.median(outage) * 1e3:.1f} ms, p99 {p99_down * 1e3:.1f} ms")
    print(f"ratio (down / up p99): {p99_down / p99_up:.3f} (target <= 1.10)")


if __name__ == "__main__":
    main()
