"""The dashboard in a real headless Chromium, against a real server holding a vLLM capture.

Uses the system Chromium (Debian's ``chromium`` package) through Playwright; nothing is
downloaded. Screenshots land in ``test-artifacts/`` at the repository root.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from inferpath.dashboard.launch import launch_dashboard, wait_until_ready

from capture_server import FedServer, free_port

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
RENDER_TIMEOUT_MS = 60_000

# (url path, page title, section headers that must show, screenshot name)
PAGES = [
    ("", "Overview", ["TTFT and engine queue depth", "Latency per stage"], "overview"),
    ("requests", "Slowest requests", [], "requests"),
    ("engine", "Engine and GPU", [], "engine"),
]


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def dashboard_url(fed_server: FedServer, tmp_path_factory: pytest.TempPathFactory):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    process = launch_dashboard(fed_server.url, port=port, log_path=log_path)
    try:
        wait_until_ready(url, timeout_seconds=90, process=process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def _query(fed_server: FedServer) -> str:
    # A custom window around the capture (it is not "the last hour" when the test runs),
    # and no live refresh so the page settles for the screenshot.
    return (f"?start={fed_server.start.isoformat().replace('+00:00', 'Z')}"
            f"&end={fed_server.end.isoformat().replace('+00:00', 'Z')}&refresh=0")


def _open(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 2200})
    page.goto(url, wait_until="domcontentloaded")
    return page


def _settle(page) -> None:
    # Streamlit shows its status widget while a script run is in flight.
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')",
        timeout=RENDER_TIMEOUT_MS)
    page.wait_for_timeout(1500)  # plotly draws after the run's last delta arrives


@pytest.mark.parametrize(("path", "title", "sections", "shot"), PAGES,
                         ids=[shot for *_, shot in PAGES])
def test_page_renders_without_exception(browser, dashboard_url: str, fed_server: FedServer,
                                        path: str, title: str, sections: list[str],
                                        shot: str) -> None:
    page = _open(browser, f"{dashboard_url}/{path}{_query(fed_server)}")
    try:
        page.get_by_role("heading", name=title, exact=True).wait_for(timeout=RENDER_TIMEOUT_MS)
        page.locator('[data-testid="stCaptionContainer"]').filter(
            has_text="buckets of").first.wait_for(timeout=RENDER_TIMEOUT_MS)
        _settle(page)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"dashboard_{shot}.png"), full_page=True)
        assert page.locator('[data-testid="stException"]').count() == 0, \
            page.locator('[data-testid="stException"]').first.inner_text()
        errors = page.locator('[data-testid="stAlertContentError"]')
        assert errors.count() == 0, errors.first.inner_text()
        assert "Page not found" not in page.content()
        for section in sections:
            assert page.get_by_role("heading", name=section).count() == 1, section
        assert page.title() == "inferpath" or title in page.title()
    finally:
        page.close()


def test_overview_shows_the_capture_in_numbers_chart_and_table(browser, dashboard_url: str,
                                                              fed_server: FedServer) -> None:
    page = _open(browser, f"{dashboard_url}/{_query(fed_server)}")
    try:
        metric_values = page.locator('[data-testid="stMetricValue"]')
        metric_values.first.wait_for(timeout=RENDER_TIMEOUT_MS)
        _settle(page)
        values = metric_values.all_inner_texts()
        assert values[0] == str(fed_server.requests_total)
        assert re.fullmatch(r"\d+ ms", values[1]), values  # TTFT p50 of real requests
        chart = page.locator('[data-testid="stPlotlyChart"]')
        assert chart.count() == 1
        texts = chart.locator(".annotation-text").all_inner_texts()
        assert "no data" not in texts, texts  # both TTFT and queue depth have data
        # One line per statistic of the capture's endpoint class plus the engine's queue.
        assert chart.locator(".scatterlayer .trace").count() >= 4
        assert page.locator('[data-testid="stDataFrame"]').count() == 1
    finally:
        page.close()


def test_an_empty_window_says_no_data_instead_of_drawing_zeros(browser, dashboard_url: str) -> None:
    page = _open(browser, f"{dashboard_url}/?start=2001-01-01T00:00:00Z"
                          f"&end=2001-01-01T00:15:00Z&refresh=0")
    try:
        chart = page.locator('[data-testid="stPlotlyChart"]')
        chart.wait_for(timeout=RENDER_TIMEOUT_MS)
        _settle(page)
        assert chart.locator(".annotation-text").filter(has_text="no data").count() == 2
        assert chart.locator(".scatterlayer .trace").count() == 0
        assert page.locator('[data-testid="stMetricValue"]').first.inner_text() == "0"
    finally:
        page.close()


def test_live_refresh_updates_the_panel_without_reloading(browser, dashboard_url: str,
                                                         fed_server: FedServer) -> None:
    query = _query(fed_server).replace("refresh=0", "refresh=5")
    page = _open(browser, f"{dashboard_url}/{query}")
    try:
        caption = page.locator('[data-testid="stCaptionContainer"]').filter(has_text="updated")
        caption.first.wait_for(timeout=RENDER_TIMEOUT_MS)
        first = caption.first.inner_text()
        # The fragment reruns every 5 s on its own; its "updated" time must move on.
        page.wait_for_function(
            """(first) => [...document.querySelectorAll('[data-testid="stCaptionContainer"]')]
                 .some(e => e.innerText.includes('updated') && e.innerText !== first)""",
            arg=first, timeout=20_000)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert page.locator('[data-testid="stPlotlyChart"]').count() == 1
    finally:
        page.close()
