"""Benchmark: every dashboard page's read-API queries over a large store (default 10M spans).

Fills a fresh embedded store with :mod:`synthetic` (``--spans`` spans over one day, with an
incident at 55-60 % of it), serves it with the real inferpath server on loopback, and times,
for each window (``--windows``, hours back from the end of the data) and each page, the
read-API calls the page makes on a first (uncached) render — the same routes and parameters
as ``dashboard/pages.py``. Reference, same run, same window: ``GET /api/v1/requests/count``,
the simplest read-API query over the window (one ``count()`` of the request rows, FINAL).

Prints, per window and page: the median and best of ``--repeat`` rounds (rounds interleave
pages and the reference), and the ratio to the reference. Exit 1 when a page's median is
above ``--limit-ms`` (default 300 ms).
``python bench/dashboard_queries.py [--spans 10000000] [--windows 1,12,24] [--repeat 5]``
``--store DIR`` reuses a filled store folder (it is filled when empty).
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

DATA_DURATION = timedelta(days=1)
MAX_POINTS = 600
ENGINE_GAUGES = (
    "queue_depth",
    "running_requests",
    "kv_cache_usage_ratio",
    "gpu_utilization_ratio",
    "gpu_memory_used_bytes",
)


def dashboard_step_seconds(duration_seconds: float) -> int:
    """The step the dashboard's time picker gives a window (``dashboard.timerange``)."""
    from inferpath.dashboard.timerange import step_seconds_for

    return step_seconds_for(duration_seconds)


def page_calls(start: datetime, end: datetime, trace_id: str, spike: tuple[str, str] | None) -> dict:
    """Page name → the read-API calls (path, params) its first render makes."""
    window = {"start": start.isoformat(), "end": end.isoformat()}
    step = dashboard_step_seconds((end - start).total_seconds())
    views = {**window, "max_points": MAX_POINTS, "step_seconds": step}
    correlate = [("/api/v1/views/correlate", views)]
    if spike is not None:  # choosing the first spike lists its slowest requests
        correlate.append(("/api/v1/requests", {"start": spike[0], "end": spike[1], "limit": 20, "order": "slowest"}))
    return {
        "overview": [("/api/v1/views/latency", views), ("/api/v1/summary", window)],
        "correlate": correlate,
        "breakdown": [("/api/v1/views/breakdown", window)],
        "slowest": [("/api/v1/requests", {**window, "limit": 100, "order": "slowest"})],
        "trace": [(f"/api/v1/traces/{trace_id}", {})],
        "gpus": [("/api/v1/views/fleet", window)]
        + [("/api/v1/timeseries/gauge", {**window, "metric": m, "step_seconds": step}) for m in ENGINE_GAUGES],
        "diagnosis": [("/api/v1/diagnosis", window)],
        "alerts": [("/api/v1/alerts", {})],
    }


def _timed(http: httpx.Client, calls: list[tuple[str, dict]]) -> float:
    started = time.perf_counter()
    for path, params in calls:
        response = http.get(path, params=params)
        if response.status_code == 404 and path == "/api/v1/alerts":
            continue  # no alert rules configured: the page says so
        if response.status_code == 422 and path == "/api/v1/diagnosis":
            continue  # no baseline before the data's first day: the page says so
        response.raise_for_status()
    return time.perf_counter() - started


def run(
    spans: int = 10_000_000,
    windows_hours: tuple[float, ...] = (1.0, 12.0, 24.0),
    repeat: int = 5,
    store_dir: str | None = None,
    incident_window: bool = False,
) -> dict:
    """Fill (unless filled), then time each page per window; returns the figures in ms.

    Windows end at the data's end; with ``incident_window`` one more, ``1h incident``, ends
    at the end of the synthetic incident (``synthetic.INCIDENT``), so the diagnosis finds
    degraded measures and reads its evidence, as an SRE's window during an incident does.
    Without ``store_dir`` the store is filled in a temporary folder, removed afterwards."""
    with scratch_folder(store_dir, "inferpath-bench-") as folder:
        return _run(folder, spans, windows_hours, repeat, incident_window)


def _run(folder: Path, spans: int, windows_hours: tuple[float, ...], repeat: int, incident_window: bool) -> dict:
    settings = Settings(store_url=f"chdb://{folder / 'store'}")
    with serve_in_thread(settings, port=0) as running:
        store = running.runtime.store
        filled = store.query("SELECT count() FROM otel_traces")[0][0]
        fill = None
        if filled == 0:  # the day before the current hour, well inside the retention
            data_start = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) - DATA_DURATION
            fill = synthetic.fill(store, spans=spans, start=data_start, duration=DATA_DURATION)
        data_start = store.query("SELECT toStartOfHour(min(timestamp)) FROM inferpath_requests")[0][0]
        data_end = data_start + DATA_DURATION
        running.runtime.refresh_rollups()
        stored = {
            "spans": store.query("SELECT count() FROM otel_traces")[0][0],
            "requests": store.query("SELECT count() FROM inferpath_requests FINAL")[0][0],
        }
        trace_id = store.query("SELECT any(trace_id) FROM inferpath_requests")[0][0]
        results: dict = {"stored": stored, "fill": fill, "windows": {}}
        with httpx.Client(base_url=running.url, timeout=300) as http:
            incident_end = data_start + DATA_DURATION * synthetic.INCIDENT[1]
            windows = [(f"{hours:g}h", data_end - timedelta(hours=hours), data_end) for hours in windows_hours]
            if incident_window:
                windows.append(("1h incident", incident_end - timedelta(hours=1), incident_end))
            for label, start, end in windows:
                hours = (end - start).total_seconds() / 3600
                window = {"start": start.isoformat(), "end": end.isoformat()}
                spikes = http.get(
                    "/api/v1/views/correlate",
                    params={**window, "max_points": MAX_POINTS, "step_seconds": dashboard_step_seconds(hours * 3600)},
                ).json()["spikes"]
                spike = (spikes[0]["start"], spikes[0]["end"]) if spikes else None
                calls = page_calls(start, end, trace_id, spike)
                reference = [("/api/v1/requests/count", window)]
                timings: dict[str, list[float]] = {name: [] for name in ["reference", *calls]}
                for page in calls.values():  # warm-up: first queries load marks and caches
                    _timed(http, page)
                for _ in range(repeat):
                    timings["reference"].append(_timed(http, reference))
                    for name, page in calls.items():
                        timings[name].append(_timed(http, page))
                ref = statistics.median(timings["reference"])
                results["windows"][label] = {
                    name: {
                        "median_ms": statistics.median(t) * 1e3,
                        "best_ms": min(t) * 1e3,
                        "ratio": statistics.median(t) / ref if ref else None,
                    }
                    for name, t in timings.items()
                }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--windows", default="1,12,24", help="window lengths in hours, comma-separated")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--store", default=None, help="store folder to reuse (filled when empty)")
    parser.add_argument("--limit-ms", type=float, default=300.0)
    parser.add_argument(
        "--incident-window", action="store_true", help="also time a 1 h window ending at the synthetic incident's end"
    )
    args = parser.parse_args(argv)
    results = run(
        args.spans, tuple(float(h) for h in args.windows.split(",")), args.repeat, args.store, args.incident_window
    )
    print(json.dumps({"stored": results["stored"], "fill": results["fill"]}))
    failed = False
    for window, pages in results["windows"].items():
        print(f"\nwindow {window} (reference: /api/v1/requests/count)")
        print(f"{'page':<12} {'median ms':>10} {'best ms':>9} {'ratio':>7}")
        for name, figures in pages.items():
            over = name != "reference" and figures["median_ms"] > args.limit_ms
            failed |= over
            print(
                f"{name:<12} {figures['median_ms']:>10.1f} {figures['best_ms']:>9.1f}"
                f" {figures['ratio']:>7.2f}{'  over ' + str(args.limit_ms) + ' ms' if over else ''}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
