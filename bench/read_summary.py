"""Benchmark: read-API latency summary over N stored requests, against one raw quantileExact.

Fills a fresh embedded store with ``--rows`` request rows spread over one day (synthetic,
log-normal stage times), then times in the same run and on the same store:

- the reference: one raw clickhouse-connect query, ``quantileExact(0.99)(ttft_ns)`` over the
  window (FINAL, as the reader reads);
- ``GET /api/v1/summary`` over the same window through the real server on loopback
  (count, mean, p50/p95/p99 of the 14 measures plus the request count);

and checks that the summary's TTFT p99 is within 1 % of ``quantileExact``.
``python bench/read_summary.py [--rows 1000000] [--repeat 5]``
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread
from inferpath.storage.rows import REQUEST_COLUMNS, RequestRow

MS = 1_000_000
START = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(days=1)


def fill(store, rows: int, seed: int = 7, batch_rows: int = 100_000) -> float:
    """Insert ``rows`` request rows over the day after START; returns seconds spent."""
    rng = random.Random(seed)
    started = time.monotonic()
    batch = []
    for i in range(rows):
        ttft = int(200 * MS * rng.lognormvariate(0, 0.6))
        batch.append(RequestRow(
            timestamp=START + timedelta(seconds=86_000 * i / rows), trace_id=f"{seed:08x}{i:024x}",
            service_name="gateway", endpoint="/v1/chat/completions", endpoint_class="interactive",
            status="ok", http_status_code=200, ttft_ns=ttft, e2e_ns=ttft + int(2e9 * rng.random()),
            itl_ns=int(20 * MS * rng.lognormvariate(0, 0.1)), queue_ns=int(5 * MS * rng.lognormvariate(0, 0.5)),
            prefill_ns=int(40 * MS * rng.lognormvariate(0, 0.2)), updated_at=START).to_insert_row())
        if len(batch) >= batch_rows:
            store.insert("inferpath_requests", batch, REQUEST_COLUMNS)
            batch = []
    if batch:
        store.insert("inferpath_requests", batch, REQUEST_COLUMNS)
    store.command("OPTIMIZE TABLE inferpath_requests FINAL")
    return time.monotonic() - started


def run(rows: int = 1_000_000, repeat: int = 5, workdir: str | None = None) -> dict:
    """Fill, then time the reference and the read API; returns the figures."""
    folder = Path(workdir or tempfile.mkdtemp(prefix="inferpath-bench-"))
    window = {"start": START.isoformat(), "end": (START + timedelta(days=1)).isoformat()}
    with serve_in_thread(Settings(store_url=f"chdb://{folder / 'store'}"), port=0) as running:
        store = running.runtime.store
        fill_seconds = fill(store, rows)
        raw_times, api_times = [], []
        exact = None
        with httpx.Client(base_url=running.url, timeout=120) as http:
            http.get("/api/v1/summary", params=window)  # warm caches once, as a dashboard would
            for _ in range(repeat):
                started = time.perf_counter()
                exact = store.query(
                    "SELECT quantileExact(0.99)(ttft_ns) FROM inferpath_requests FINAL"
                    " WHERE timestamp >= {a:DateTime64(9, 'UTC')} AND timestamp < {b:DateTime64(9, 'UTC')}",
                    {"a": START, "b": START + timedelta(days=1)})[0][0]
                raw_times.append(time.perf_counter() - started)
                started = time.perf_counter()
                summary = http.get("/api/v1/summary", params=window).json()
                api_times.append(time.perf_counter() - started)
    ttft = next(m for m in summary["measures"] if m["measure"] == "ttft")
    deviation = abs(ttft["p99_seconds"] * 1e9 - float(exact)) / float(exact)
    return {
        "rows": rows, "request_count": summary["request_count"], "fill_seconds": round(fill_seconds, 1),
        "raw_quantile_exact_ms": round(1000 * statistics.median(raw_times), 1),
        "api_summary_ms": round(1000 * statistics.median(api_times), 1),
        "api_summary_best_ms": round(1000 * min(api_times), 1),
        "ratio": round(statistics.median(api_times) / statistics.median(raw_times), 2),
        "p99_relative_deviation": deviation,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    result = run(args.rows, args.repeat)
    print(json.dumps(result, indent=2))
    print(f"{result['rows']} rows: /api/v1/summary {result['api_summary_ms']} ms (median) vs raw quantileExact "
          f"{result['raw_quantile_exact_ms']} ms: ratio {result['ratio']}; p99 deviation "
          f"{result['p99_relative_deviation']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
