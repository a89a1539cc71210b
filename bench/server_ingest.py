"""Benchmark: sustained OTLP/HTTP ingest into embedded chDB with zero loss, against a raw
clickhouse-connect insert of the same rows, plus span end → visible latency.

In one run:

1. the server (``python -m inferpath.server``, its own process, a fresh chDB folder) takes
   ``--clients`` concurrent exporters posting pre-built protobuf bodies of
   ``--spans-per-request`` spans for ``--seconds``; every body is retried until its 200, as an
   OTLP exporter does. Throughput = spans acknowledged (200 = committed) per second.
2. meanwhile a probe posts a one-span trace every 200 ms, with the span's end = now, and
   polls ``GET /api/v1/traces/{id}`` until it is there: span end → visible latency.
3. after a graceful stop, the store is opened here and counted: acknowledged spans missing
   (loss) and spans stored twice must both be 0.
4. the reference: the same rows (decoded once) inserted with clickhouse-connect alone,
   in batches of the same size, into another database of the same chDB folder.

``python bench/server_ingest.py [--seconds 60] [--clients 4] [--spans-per-request 1000]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server.otlp_factory import trace_body  # noqa: E402

from inferpath.server.otlp import decode_trace_request  # noqa: E402
from inferpath.storage.rows import SPAN_COLUMNS  # noqa: E402
from inferpath.storage.store import Store  # noqa: E402

PROTOBUF = {"content-type": "application/x-protobuf"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(store_url: str, port: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "inferpath.server", "--port", str(port), "--store", store_url],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("server did not start")


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def run(seconds: float = 60.0, clients: int = 4, spans_per_request: int = 1000, bodies: int | None = None,
        workdir: str | None = None) -> dict:
    """Run the benchmark; returns the figures as a dict (also printed by ``main``)."""
    spans_per_trace = 10
    # Enough distinct bodies for ~20k spans/s (more than this machine sustains); if they run
    # out first, ``all_bodies_used`` says so and the rate is a lower bound.
    count = bodies or max(clients * 4, int(seconds * 20_000 / spans_per_request) + clients)
    prepared = [trace_body(spans_per_trace=spans_per_trace, traces=spans_per_request // spans_per_trace)
                for _ in range(count)]
    folder = Path(workdir or tempfile.mkdtemp(prefix="inferpath-bench-"))
    store_url = f"chdb://{folder / 'store'}"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = _start(store_url, port)
    acked: list[int] = []
    retries = [0]
    next_body = iter(range(count))
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    visible_seconds: list[float] = []

    def exporter() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while time.monotonic() < stop_at:
                with lock:
                    index = next(next_body, None)
                if index is None:
                    return
                while True:
                    response = http.post("/v1/traces", content=prepared[index][0], headers=PROTOBUF)
                    if response.status_code == 200:
                        with lock:
                            acked.append(index)
                        break
                    retries[0] += 1
                    time.sleep(float(response.headers.get("retry-after", "0.1")))

    def probe() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while time.monotonic() < stop_at:
                # The factory's root span lasts 560 ms: start it so that it ends now.
                ended_ns = time.time_ns()
                body, ids = trace_body(spans_per_trace=1, start_ns=ended_ns - 560_000_000, service_name="probe")
                trace_id = next(iter(ids))
                http.post("/v1/traces", content=body, headers=PROTOBUF)
                while http.get(f"/api/v1/traces/{trace_id}").status_code != 200:
                    time.sleep(0.005)
                visible_seconds.append((time.time_ns() - ended_ns) / 1e9)
                time.sleep(0.2)

    started = time.monotonic()
    threads = [threading.Thread(target=exporter) for _ in range(clients)] + [threading.Thread(target=probe)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    server.send_signal(signal.SIGTERM)
    server.wait(120)
    acked_spans = len(acked) * spans_per_request
    expected = {s for i in acked for spans in prepared[i][1].values() for s in spans}
    with Store.open(store_url) as store:
        rows, distinct = store.query("SELECT count(), uniqExact(SpanId) FROM otel_traces"
                                     " WHERE ServiceName = 'bench-engine'")[0]
        stored = {r[0] for r in store.query("SELECT SpanId FROM otel_traces WHERE ServiceName = 'bench-engine'")}
    lost = len(expected - stored)
    # Reference: the same rows, decoded once, inserted by clickhouse-connect alone.
    batches = [[s.to_insert_row() for s in decode_trace_request(prepared[i][0], content_type="application/x-protobuf",
                                                                  content_encoding=None).spans] for i in acked]
    with Store.open(f"{store_url}?database=rawref") as ref:
        client = ref._client  # the bare clickhouse-connect client: no checks, no dedup token
        raw_started = time.monotonic()
        for batch in batches:
            client.insert("otel_traces", batch, column_names=list(SPAN_COLUMNS))
        raw_seconds = time.monotonic() - raw_started
    raw_rate = sum(len(b) for b in batches) / raw_seconds if raw_seconds else float("nan")
    result = {
        "seconds": round(elapsed, 1), "clients": clients, "spans_per_request": spans_per_request,
        "acked_spans": acked_spans, "server_spans_per_second": round(acked_spans / elapsed),
        "raw_insert_spans_per_second": round(raw_rate), "ratio": round(acked_spans / elapsed / raw_rate, 3),
        "lost_spans": lost, "stored_twice": int(rows) - int(distinct), "retries_503": retries[0],
        "visible_p50_seconds": round(_p(visible_seconds, 0.5), 4),
        "visible_p99_seconds": round(_p(visible_seconds, 0.99), 4), "probes": len(visible_seconds),
        "all_bodies_used": len(acked) == count,
    }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--spans-per-request", type=int, default=1000)
    args = parser.parse_args()
    result = run(args.seconds, args.clients, args.spans_per_request)
    print(json.dumps(result, indent=2))
    print(f"server {result['server_spans_per_second']} spans/s vs raw clickhouse-connect "
          f"{result['raw_insert_spans_per_second']} spans/s: ratio {result['ratio']}; lost {result['lost_spans']}, "
          f"stored twice {result['stored_twice']}; span end -> visible p99 {result['visible_p99_seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
