"""Smoke run of ``bench/dashboard_rerun.py`` on the recorded vLLM capture: every page's
cached rerun reaches no server, and the reference makes exactly the page's own calls."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "dashboard_rerun.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("dashboard_rerun", BENCH)
    module = importlib.util.module_from_spec(spec)
    # Its dataclasses look their module up in sys.modules while being defined.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not module.CAPTURE.is_dir():
        pytest.skip(f"recorded vLLM capture {module.CAPTURE} is not present")
    return module


def test_every_page_reruns_from_the_cache(bench) -> None:
    figures = bench.run("capture", rounds=1)
    pages = {page.title: page for page in figures["script"]}
    assert list(pages) == list(bench.PAGE_PATHS)
    for page in pages.values():
        # A cached rerun opened no connection to the server: every loader hit its cache.
        assert page.cached_connections == 0, page
        # A cold rerun opened one connection per call the reference replays.
        assert page.uncached_connections == page.calls, page
        assert len(page.cached_seconds) == len(page.raw_seconds) == 1
        assert 0 < page.cached_seconds[0] < 30
    # The GPUs page reads the fleet view and five gauges. Correlate reads its view, the
    # signals view, the objectives and the 15 minutes before the window (the spike reference);
    # the capture's TTFT stays under the 1 s objective, so no spike's requests are read.
    assert pages["GPUs and engines"].calls == 6 and pages["Correlate"].calls == 4
    assert figures["browser"] is None


@pytest.mark.browser
def test_browser_rerun_is_timed_against_the_floor_app(bench) -> None:
    if not Path(bench.CHROMIUM).exists():
        pytest.skip(f"{bench.CHROMIUM} is absent (apt-get install -y chromium)")
    figures = bench.run("capture", rounds=1, only=["Alerts", "GPUs and engines"], browser=True)
    pages = {page.title: page for page in figures["browser"]}
    assert list(pages) == ["GPUs and engines", "Alerts"]
    for page in pages.values():
        assert len(page.cached_seconds) == len(page.floor_seconds) == len(page.first_seconds) == 1, page
        assert 0 < page.floor_seconds[0] < 30 and 0 < page.cached_seconds[0] < 30 and 0 < page.first_seconds[0] < 60
