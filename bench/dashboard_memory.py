"""Dashboard server memory under live refresh: N auto-refreshes of a page with four charts
of ~5k points each; the Streamlit server's RSS after N must stay within 50 MB of its RSS
after the warm-up (the same run's reference).

Real parts only: an inferpath server on embedded chDB fed over OTLP/HTTP with four gauges
(``queue_depth``, ``running_requests``, ``kv_cache_usage_ratio``,
``gpu_utilization_ratio``) sampled once a second, the dashboard as ``streamlit run``, and
Debian's Chromium (Playwright as a driver) holding the "GPUs and engines" page open with
``?points=<points>&refresh=<interval>``. Refreshes are counted from the page's own run
counter; RSS is read from ``/proc/<pid>/status`` (Linux).

    python bench/dashboard_memory.py                       # 500 refreshes, 50 warm-up, 5000 points
    python bench/dashboard_memory.py --refreshes 12 --warmup 4 --points 500   # a smoke run

Exit code 0 when the growth is within ``--limit-mb``, 1 otherwise.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratch import scratch_folder  # noqa: E402  (a sibling module of the benchmarks)

GAUGES = ("queue_depth", "running_requests", "kv_cache_usage_ratio", "gpu_utilization_ratio")
CHROMIUM = "/usr/bin/chromium"


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes, from ``/proc/<pid>/status``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def gauges_body(start: datetime, points: int) -> bytes:
    """OTLP metrics with ``points`` one-second samples of each of :data:`GAUGES`."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    request = ExportMetricsServiceRequest()
    resource_metrics = request.resource_metrics.add()
    resource_metrics.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="vllm")))
    scope = resource_metrics.scope_metrics.add()
    start_ns = int(start.timestamp()) * 1_000_000_000
    for index, name in enumerate(GAUGES):
        metric = scope.metrics.add()
        metric.name = name
        for second in range(points):
            point = metric.gauge.data_points.add()
            point.time_unix_nano = start_ns + second * 1_000_000_000
            # A wave, so consecutive buckets differ and every chart redraws real data.
            point.as_double = 0.5 + 0.4 * math.sin(second / (30 + index))
            point.attributes.append(KeyValue(key="engine", value=AnyValue(string_value="0")))
    return request.SerializeToString()


def run(
    refreshes: int, warmup: int, points: int, interval_seconds: float, limit_mb: float, timeout_seconds: float
) -> dict:
    """Run the benchmark; returns RSS figures in bytes, timings and ``ok``.

    Raises ``RuntimeError`` when the page stops refreshing before ``refreshes``.
    """
    with scratch_folder(None, "inferpath-dashboard-memory-") as folder:
        return _run(folder, refreshes, warmup, points, interval_seconds, limit_mb, timeout_seconds)


def _run(
    folder: Path,
    refreshes: int,
    warmup: int,
    points: int,
    interval_seconds: float,
    limit_mb: float,
    timeout_seconds: float,
) -> dict:
    from playwright.sync_api import sync_playwright

    from inferpath.config import Settings
    from inferpath.dashboard.launch import launch_dashboard, wait_until_ready
    from inferpath.demo.processes import free_port
    from inferpath.server.runtime import serve_in_thread

    server = serve_in_thread(Settings(store_url=f"chdb://{folder / 'store'}"), port=0)
    dashboard = None
    try:
        end = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=1)
        start = end - timedelta(seconds=points)
        with httpx.Client(base_url=server.url, timeout=120.0) as http:
            response = http.post(
                "/v1/metrics", content=gauges_body(start, points), headers={"Content-Type": "application/x-protobuf"}
            )
            response.raise_for_status()
            assert http.post("/api/v1/flush").json()["ok"]
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        dashboard = launch_dashboard(server.url, port=port, log_path=folder / "streamlit.log")
        wait_until_ready(url, timeout_seconds=90, process=dashboard)
        query = (
            f"gpus?start={start.isoformat().replace('+00:00', 'Z')}"
            f"&end={end.isoformat().replace('+00:00', 'Z')}&points={points}"
            f"&refresh={interval_seconds}&tz=UTC"
        )
        figures: dict = {"refreshes": refreshes, "warmup": warmup, "points": points}
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.goto(f"{url}/{query}", wait_until="domcontentloaded")
            deadline = time.monotonic() + timeout_seconds
            seen, t_warm = 0, None
            while seen < refreshes or t_warm is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"only {seen} of {refreshes} refreshes in {timeout_seconds} s"
                        + ("" if t_warm else ", the charts never all drawn")
                    )
                texts = page.locator('[data-testid="stCaptionContainer"]').all_inner_texts()
                runs = [int(m.group(1)) for t in texts for m in [re.search(r"run (\d+)", t)] if m]
                seen = max(runs, default=seen)
                if t_warm is None and seen >= warmup:
                    plotted = page.evaluate(
                        "() => [...document.querySelectorAll('.js-plotly-plot')]"
                        ".map(gd => gd.data.reduce((n, t) => n + (t.x ? t.x.length : 0), 0))"
                    )
                    # The run counter is drawn before the charts: on a busy machine the
                    # warm-up run's charts may not be in the page yet; look again next poll.
                    if sum(1 for n in plotted if n) >= len(GAUGES):
                        figures["plotted_points"] = plotted
                        figures["rss_warm_bytes"], t_warm = rss_bytes(dashboard.pid), time.monotonic()
                page.wait_for_timeout(100)
            figures["rss_end_bytes"] = rss_bytes(dashboard.pid)
            figures["seconds_per_refresh"] = (time.monotonic() - t_warm) / max(refreshes - warmup, 1)
            browser.close()
        growth = figures["rss_end_bytes"] - figures["rss_warm_bytes"]
        figures["growth_bytes"] = growth
        figures["ok"] = growth <= limit_mb * 2**20
        return figures
    finally:
        if dashboard is not None:
            dashboard.terminate()
            dashboard.wait(timeout=15)
        server.stop()


def main(argv: list[str] | None = None) -> int:
    """Command line: run, print the figures and the ratio to the warm reference."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--refreshes", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--points", type=int, default=5000)
    parser.add_argument("--interval", type=float, default=0.25, help="refresh interval, s")
    parser.add_argument("--limit-mb", type=float, default=50.0)
    parser.add_argument("--timeout", type=float, default=1800.0, help="whole run, s")
    args = parser.parse_args(argv)
    figures = run(args.refreshes, args.warmup, args.points, args.interval, args.limit_mb, args.timeout)
    warm, end = figures["rss_warm_bytes"], figures["rss_end_bytes"]
    print(f"points plotted per chart: {figures.get('plotted_points')}")
    print(f"streamlit RSS after {args.warmup} refreshes (reference): {warm / 2**20:.1f} MB")
    print(f"streamlit RSS after {args.refreshes} refreshes: {end / 2**20:.1f} MB")
    print(
        f"growth {figures['growth_bytes'] / 2**20:+.1f} MB (limit {args.limit_mb:.0f} MB), "
        f"ratio {end / warm:.3f}; {figures['seconds_per_refresh'] * 1000:.0f} ms per refresh"
    )
    print("PASS" if figures["ok"] else "FAIL")
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
