"""The dashboard's pictures in ``docs/``, taken from a real run in Debian's Chromium.

Runs the ``kv-pressure`` demo scenario (a healthy phase, then the same load with a KV cache
too small) into a fresh store, serves it, launches the dashboard and saves, 1600 px wide:

- ``docs/dashboard_overview_kv_pressure.png``: the Overview of the fault phase (the
  verdict banner, the red TTFT tile, TTFT p99 over queue, KV cache and batch);
- ``docs/dashboard_overview_healthy.png``: the Overview of the healthy phase;
- ``docs/dashboard_correlate.png``: the Correlate page over both phases (2300 px high).

Each page is taken once it is drawn (script run ended, every chart drawn, the main thread
quiet; as ``dashboard_rerun.py`` times it).

    python bench/dashboard_screenshots.py [--out docs] [--requests-per-phase 40]
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dashboard_rerun import _PAGE_CLOCK_JS, CHROMIUM, _start_server, _visit_seconds  # noqa: E402
from scratch import scratch_folder  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VIEWPORT = {"width": 1600, "height": 1000}


def _query(start: datetime, end: datetime) -> str:
    def iso(instant: datetime) -> str:
        return instant.replace(microsecond=0).isoformat().replace("+00:00", "Z")

    return urlencode({"start": iso(start), "end": iso(end), "refresh": "0", "tz": "UTC"})


def take(out: Path, requests_per_phase: int = 40) -> list[Path]:
    """Run the scenario, take the three pictures into ``out``; returns their paths."""
    from playwright.sync_api import sync_playwright

    from inferpath.dashboard.launch import launch_dashboard, wait_until_ready
    from inferpath.demo.processes import free_port
    from inferpath.demo.scenarios import ScenarioOptions, run_scenario

    with scratch_folder(None, "inferpath-dashboard-shots-") as folder:
        store_url = f"chdb://{folder / 'store'}"
        outcome = run_scenario(
            "kv-pressure",
            ScenarioOptions(requests_per_phase=requests_per_phase, store_url=store_url, log_dir=folder / "logs"),
            log=lambda _: None,
        )
        (healthy_start, healthy_end), (fault_start, fault_end) = outcome.baseline_window, outcome.fault_window
        server = _start_server(store_url, folder)
        port = free_port()
        dashboard = launch_dashboard(server.url, port=port, log_path=folder / "streamlit.log")
        url = f"http://127.0.0.1:{port}"
        incident_end = fault_end + timedelta(seconds=5)
        # (file, page path, title, window, window height in px)
        shots = [
            ("dashboard_overview_kv_pressure.png", "", "Overview", fault_start, incident_end, 1000),
            ("dashboard_overview_healthy.png", "", "Overview", healthy_start, healthy_end, 1000),
            ("dashboard_correlate.png", "correlate", "Correlate", healthy_start, incident_end, 2300),
        ]
        written = []
        try:
            wait_until_ready(url, timeout_seconds=90, process=dashboard)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
                )
                context = browser.new_context(viewport=VIEWPORT)
                context.add_init_script(_PAGE_CLOCK_JS)
                page = context.new_page()
                for name, path, title, start, end, height in shots:
                    # The app scrolls inside its own pane: a tall window, not a full-page shot.
                    page.set_viewport_size({**VIEWPORT, "height": height})
                    _visit_seconds(page, f"{url}/{path}?{_query(start, end)}", title)
                    out.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(out / name))
                    written.append(out / name)
                browser.close()
        finally:
            dashboard.terminate()
            dashboard.wait(timeout=15)
            server.stop()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    parser.add_argument("--requests-per-phase", type=int, default=40)
    args = parser.parse_args(argv)
    for path in take(args.out, args.requests_per_phase):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
