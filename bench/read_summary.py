"""Benchmark: read-API latency summary over N stored spans, against one raw quantileExact.

Fills a fresh embedded store with :mod:`synthetic` (``--spans`` spans of 10 per trace, so
N/10 request rows, over one day; generated inside ClickHouse), brings the rollups up to
date, then times in the same run, on the same store, per window (the whole day and its
last hour):

- the reference: one raw clickhouse-connect query, ``quantileExact(0.99)(ttft_ns)`` over the
  window with ``FINAL``, as the reader reads request rows;
- ``GET /api/v1/summary`` over the same window through the real server on loopback
  (request count, and count, mean, p50/p95/p99 of the 14 measures): the day from the
  rollups (DDSketch percentiles), the hour exact;

and checks that the summary's TTFT p99 is within 1 % of ``quantileExact`` and its request
count exact. ``python bench/read_summary.py [--spans 10000000] [--repeat 5] [--store DIR]``
(``--store`` keeps the filled folder for another run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic  # noqa: E402  (a sibling module of the benchmarks)
from scratch import scratch_folder  # noqa: E402

from inferpath.config import Settings  # noqa: E402
from inferpath.server.runtime import serve_in_thread  # noqa: E402

DAY = timedelta(days=1)


def run(spans: int = 10_000_000, repeat: int = 5, workdir: str | None = None) -> dict:
    """Fill (unless the folder is filled), then time the reference and the read API per
    window; returns the figures (ms) per window. Without ``workdir`` the store is filled in
    a temporary folder, removed afterwards."""
    with scratch_folder(workdir, "inferpath-bench-") as folder:
        return _run(folder, spans, repeat)


def _run(folder: Path, spans: int, repeat: int) -> dict:
    with serve_in_thread(Settings(store_url=f"chdb://{folder / 'store'}"), port=0) as running:
        store = running.runtime.store
        fill = None
        if store.query("SELECT count() FROM otel_traces")[0][0] == 0:
            start = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) - DAY
            fill = synthetic.fill(store, spans=spans, start=start, duration=DAY)
        started = time.monotonic()
        running.runtime.refresh_rollups()
        rollup_seconds = time.monotonic() - started
        data_start = store.query("SELECT toStartOfHour(min(timestamp)) FROM inferpath_requests")[0][0]
        stored_spans = store.query("SELECT count() FROM otel_traces")[0][0]
        results: dict = {
            "stored_spans": stored_spans,
            "fill": fill,
            "rollup_pass_seconds": round(rollup_seconds, 2),
            "windows": {},
        }
        with httpx.Client(base_url=running.url, timeout=300) as http:
            for label, (a, b) in {
                "24h": (data_start, data_start + DAY),
                "1h": (data_start + DAY - timedelta(hours=1), data_start + DAY),
            }.items():
                window = {"start": a.isoformat(), "end": b.isoformat()}
                http.get("/api/v1/summary", params=window).raise_for_status()  # warm, as a dashboard would
                raw_times, api_times = [], []
                exact = count = summary = None
                for _ in range(repeat):  # interleaved rounds
                    t0 = time.perf_counter()
                    exact, count = store.query(
                        "SELECT quantileExact(0.99)(ttft_ns), count() FROM inferpath_requests FINAL"
                        " WHERE timestamp >= {a:DateTime64(9, 'UTC')} AND timestamp < {b:DateTime64(9, 'UTC')}",
                        {"a": a, "b": b},
                    )[0]
                    raw_times.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    response = http.get("/api/v1/summary", params=window)
                    api_times.append(time.perf_counter() - t0)
                    response.raise_for_status()
                    summary = response.json()
                ttft = next(m for m in summary["measures"] if m["measure"] == "ttft")
                results["windows"][label] = {
                    "request_count": summary["request_count"],
                    "exact_count": int(count),
                    "percentiles": summary["percentiles"],
                    "raw_quantile_exact_ms": round(1000 * statistics.median(raw_times), 1),
                    "api_summary_ms": round(1000 * statistics.median(api_times), 1),
                    "api_summary_best_ms": round(1000 * min(api_times), 1),
                    "ratio": round(statistics.median(api_times) / statistics.median(raw_times), 2),
                    "p99_relative_deviation": abs(ttft["p99_seconds"] * 1e9 - float(exact)) / float(exact),
                }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--store", default=None, help="store folder to reuse (filled when empty)")
    parser.add_argument(
        "--limit-ms",
        type=float,
        default=None,
        help="exit 1 when a median is above (default: the issue's 100 ms up to 10M spans, else 300 ms)",
    )
    args = parser.parse_args()
    if args.limit_ms is None:
        args.limit_ms = 100.0 if args.spans <= 10_000_000 else 300.0
    result = run(args.spans, args.repeat, args.store)
    print(json.dumps(result, indent=2, default=str))
    failed = False
    for label, figures in result["windows"].items():
        bad = (
            figures["api_summary_ms"] > args.limit_ms
            or figures["p99_relative_deviation"] >= 0.01
            or figures["request_count"] != figures["exact_count"]
        )
        failed |= bad
        print(
            f"{result['stored_spans']} spans, window {label} ({figures['percentiles']}): /api/v1/summary "
            f"{figures['api_summary_ms']} ms (median) vs raw quantileExact {figures['raw_quantile_exact_ms']} ms:"
            f" ratio {figures['ratio']}; p99 deviation {figures['p99_relative_deviation']:.2e}"
            f"{'  FAILED' if bad else ''}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
