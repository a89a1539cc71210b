"""Smoke run of ``bench/dashboard_memory.py``: a few live refreshes of a page with four
charts, the RSS figures read, and every chart drawing the points the server sent."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

BENCH = Path(__file__).resolve().parents[2] / "bench" / "dashboard_memory.py"


def test_dashboard_memory_bench_smoke() -> None:
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("/usr/bin/chromium is absent (apt-get install -y chromium)")
    spec = importlib.util.spec_from_file_location("dashboard_memory", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    figures = bench.run(refreshes=8, warmup=3, points=300, interval_seconds=0.5, limit_mb=50.0, timeout_seconds=120.0)
    # Four charts with data (300 one-second samples each) plus GPU memory with none.
    assert sorted(figures["plotted_points"])[-4:] == [300, 300, 300, 300]
    assert figures["rss_warm_bytes"] > 50 * 2**20  # a Streamlit server, not a stray pid
    assert figures["ok"], figures
