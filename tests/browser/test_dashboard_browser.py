"""Every dashboard page in a real headless Chromium, fed by a short demo run.

Uses the system Chromium (Debian's ``chromium`` package) through Playwright; nothing is
downloaded. Screenshots land in ``test-artifacts/dashboard_<page>.png`` at the repository
root. The demo run is the ``kv-pressure`` scenario when it exists (see ``conftest.py``), so
the Correlate page must show the queue rising inside the TTFT spike it marks.
"""

from __future__ import annotations

import base64
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np
import pytest
from capture_server import free_port

from inferpath.dashboard.launch import launch_dashboard, wait_until_ready
from inferpath.dashboard.saturation import SPIKE_FILL

if TYPE_CHECKING:  # the fixture's type; a runtime import of "conftest" would be ambiguous
    from tests.browser.conftest import DemoServer

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
RENDER_TIMEOUT_MS = 60_000

# (url path, page title, section headers that must show, screenshot name)
PAGES = [
    ("", "Overview", ["Endpoint class: interactive", "Latency per stage"], "overview"),
    ("correlate", "Correlate", ["Latency and engine state", "Spikes"], "correlate"),
    ("breakdown", "Breakdown", ["TTFT by stage", "E2E by stage", "Overhead per hop"], "breakdown"),
    ("requests", "Slowest requests", [], "requests"),
    ("gpus", "GPUs and engines", ["GPUs", "Engines", "Missing signals", "Over time"], "gpus"),
    ("diagnosis", "Diagnosis", [], "diagnosis"),
    ("alerts", "Alerts", [], "alerts"),
    ("whatif", "What-if", [], "whatif"),
]
WIDE = {"width": 1600, "height": 1400}
"""A 1600 px wide window, as the slowest-requests table and the brush are specified at."""


@pytest.fixture(scope="module")
def browser(demo_server: DemoServer):
    # The demo run (asyncio.run) must happen before Playwright's sync API starts its event
    # loop in this thread, hence the dependency.
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def dashboard_url(demo_server: DemoServer, tmp_path_factory: pytest.TempPathFactory):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    process = launch_dashboard(demo_server.url, port=port, log_path=log_path)
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


def _query(server: DemoServer, **extra: str) -> str:
    # A custom window around the run, UTC, no live refresh so the page settles.
    params = {
        "start": server.start.isoformat().replace("+00:00", "Z"),
        "end": server.end.isoformat().replace("+00:00", "Z"),
        "refresh": "0",
        "tz": "UTC",
        **extra,
    }
    return "?" + "&".join(f"{key}={value}" for key, value in params.items())


def _open(browser, url: str, viewport: dict | None = None):
    page = browser.new_page(viewport=viewport or {"width": 1400, "height": 2200})
    page.goto(url, wait_until="domcontentloaded")
    return page


def _settle(page) -> None:
    # Streamlit shows its status widget while a script run is in flight.
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=RENDER_TIMEOUT_MS
    )
    page.wait_for_timeout(1500)  # plotly draws after the run's last delta arrives


def _no_raw_api_text(page) -> None:
    # No HTTP status, no JSON body, no Python repr of one: every failure is a sentence.
    text = page.inner_text("body")
    for raw in ("HTTP 4", "HTTP 5", '{"', "[{", "'loc'", "Traceback"):
        assert raw not in text, (raw, text[:2000])


def _no_exception(page) -> None:
    exceptions = page.locator('[data-testid="stException"]')
    assert exceptions.count() == 0, exceptions.first.inner_text()
    errors = page.locator('[data-testid="stAlertContentError"]')
    assert errors.count() == 0, errors.first.inner_text()
    assert "Page not found" not in page.content()


@pytest.mark.parametrize(("path", "title", "sections", "shot"), PAGES, ids=[shot for *_, shot in PAGES])
def test_page_renders_without_exception(
    browser, dashboard_url: str, demo_server: DemoServer, path: str, title: str, sections: list[str], shot: str
) -> None:
    page = _open(browser, f"{dashboard_url}/{path}{_query(demo_server)}")
    try:
        page.get_by_role("heading", name=title, exact=True).wait_for(timeout=RENDER_TIMEOUT_MS)
        page.locator('[data-testid="stCaptionContainer"]').filter(has_text="buckets of").first.wait_for(
            timeout=RENDER_TIMEOUT_MS
        )
        _settle(page)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"dashboard_{shot}.png"), full_page=True)
        _no_exception(page)
        _no_raw_api_text(page)
        for section in sections:
            assert page.get_by_role("heading", name=section, exact=True).count() == 1, section
    finally:
        page.close()


def _plotted(page, index: int = 0) -> dict:
    # What plotly actually drew: the traces' names, x and y, and the layout's shapes.
    plotted = page.evaluate(
        """(i) => { const gd = document.querySelectorAll('.js-plotly-plot')[i];
                    return {data: gd.data.map(t => ({name: t.name, x: t.x, y: t.y})),
                            shapes: (gd.layout.shapes || []).map(s => ({x0: s.x0, x1: s.x1, fill: s.fillcolor})),
                            annotations: (gd.layout.annotations || []).map(a => a.text)}; }""",
        index,
    )
    for trace in plotted["data"]:
        trace["x"], trace["y"] = _values(trace["x"]), _values(trace["y"])
    return plotted


def _values(values):
    # Numbers the dashboard sends as numpy arrays travel as plotly's typed-array spec
    # ({"dtype": "f8", "bdata": base64}); their gaps are NaN. As a list, gaps as None.
    if isinstance(values, dict) and "bdata" in values:
        decoded = np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
        return [None if np.isnan(v) else float(v) for v in decoded.astype(float)]
    return values


def test_correlate_shows_the_queue_rising_inside_the_ttft_spike(
    browser, dashboard_url: str, demo_server: DemoServer
) -> None:
    if demo_server.scenario != "kv-pressure":
        pytest.skip("the kv-pressure scenario is not available; the demo run has no known fault")
    page = _open(browser, f"{dashboard_url}/correlate{_query(demo_server)}")
    try:
        page.locator('[data-testid="stPlotlyChart"]').first.wait_for(timeout=RENDER_TIMEOUT_MS)
        _settle(page)
        plotted = _plotted(page)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard_correlate_kv_pressure.png"), full_page=True)
        assert any(s["fill"] == SPIKE_FILL for s in plotted["shapes"]), "no TTFT spike marked"
        queue = next(t for t in plotted["data"] if t["name"] == "Queue depth (max per step)")
        ttft = next(t for t in plotted["data"] if t["name"] == "TTFT p99")
        samples = [(datetime.fromisoformat(x), y) for x, y in zip(queue["x"], queue["y"]) if y is not None]
        ttft_points = [(datetime.fromisoformat(x), y) for x, y in zip(ttft["x"], ttft["y"]) if y is not None]
        peak_at, peak_ms = max(ttft_points, key=lambda point: point[1])
        # Spike bands, not the objective, capacity or stale shapes.
        bands = [
            (datetime.fromisoformat(shape["x0"]), datetime.fromisoformat(shape["x1"]))
            for shape in plotted["shapes"]
            if shape["fill"] == SPIKE_FILL
        ]
        # One of the marked spike bands holds the TTFT peak (several may be marked).
        holding = [(start, end) for start, end in bands if start <= peak_at < end]
        assert holding, (peak_at, bands)
        spike_start, spike_end = holding[0]
        # TTFT is charted at the step where a request started; the spiking requests waited
        # from then until their first token, so the queue that made them wait is in the band
        # or within one peak TTFT after it (on a loaded machine, scrapes land late).
        waited_until = spike_end + timedelta(milliseconds=peak_ms)
        before = [y for t, y in samples if t < spike_start]
        during = [y for t, y in samples if spike_start <= t < waited_until]
        assert before and during
        # The healthy phase barely queues; under KV pressure the queue builds in the spike.
        assert max(during) > max(before) and max(during) >= 3, (before, during)
        # Choosing the spike lists its slowest traces, each linked to its waterfall.
        page.get_by_text("slowest requests that started in the spike").wait_for()
        links = page.locator('[data-testid="stDataFrame"]')
        assert links.count() == 1
    finally:
        page.close()


def test_trace_page_draws_the_waterfall_with_ttft_marks(browser, dashboard_url: str, demo_server: DemoServer) -> None:
    with httpx.Client(base_url=demo_server.url, timeout=30.0) as http:
        rows = http.get(
            "/api/v1/requests",
            params={
                "start": demo_server.start.isoformat(),
                "end": demo_server.end.isoformat(),
                "limit": 1,
                "order": "slowest",
            },
        ).json()["requests"]
    trace_id = rows[0]["trace_id"]
    page = _open(browser, f"{dashboard_url}/trace?trace_id={trace_id}&tz=UTC")
    try:
        page.get_by_role("heading", name="Waterfall").wait_for(timeout=RENDER_TIMEOUT_MS)
        _settle(page)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard_trace.png"), full_page=True)
        _no_exception(page)
        names = [t["name"] for t in _plotted(page)["data"]]
        assert "span" in names and "first token (TTFT)" in names
        assert {"queue", "prefill", "decode"} <= set(names)  # the engine's phases
        spans_bar = next(t for t in _plotted(page)["data"] if t["name"] == "span")
        assert len(spans_bar["y"]) >= 5  # client, gateway, tokenize, retrieval, model, engine
    finally:
        page.close()
    bad = _open(browser, f"{dashboard_url}/trace?trace_id={'0' * 32}")
    try:
        bad.get_by_text("not found").first.wait_for(timeout=RENDER_TIMEOUT_MS)
        assert bad.locator('[data-testid="stException"]').count() == 0
    finally:
        bad.close()


def test_gpus_page_says_what_is_missing_and_why(browser, dashboard_url: str, demo_server: DemoServer) -> None:
    page = _open(browser, f"{dashboard_url}/gpus{_query(demo_server)}")
    try:
        page.get_by_role("heading", name="Missing signals").wait_for(timeout=RENDER_TIMEOUT_MS)
        _settle(page)
        _no_exception(page)
        # GPUs, engines and missing signals each get a table (drawn on a canvas, so the
        # tables' content is checked on the view the page draws them from).
        page.locator('[data-testid="stDataFrame"]').nth(2).wait_for(timeout=RENDER_TIMEOUT_MS)
        assert page.locator('[data-testid="stDataFrame"]').count() == 3
        with httpx.Client(base_url=demo_server.url, timeout=30.0) as http:
            view = http.get(
                "/api/v1/views/fleet",
                params={"start": demo_server.start.isoformat(), "end": demo_server.end.isoformat()},
            ).json()
        from inferpath.dashboard.fleet import fleet_tables

        gpus, engines, missing = fleet_tables(view)
        assert len(gpus) >= 1 and len(engines) >= 1
        # The emulated engine exports no batch-size gauge (vLLM has none): missing, with why.
        batch = missing[missing["signal"] == "batch_size"]
        assert not batch.empty and batch["why"].str.startswith("not exported by").all()
    finally:
        page.close()


def test_an_empty_window_says_no_data_instead_of_drawing_zeros(browser, dashboard_url: str) -> None:
    page = _open(browser, f"{dashboard_url}/correlate?start=2001-01-01T00:00:00Z&end=2001-01-01T00:15:00Z&refresh=0")
    try:
        page.locator('[data-testid="stPlotlyChart"]').first.wait_for(timeout=RENDER_TIMEOUT_MS)
        _settle(page)
        plotted = _plotted(page)
        assert plotted["data"] == []
        assert "no requests in this window" in plotted["annotations"]
        # Every signal says it was not exported, rather than drawing a flat 0.
        assert sum("not exported" in a for a in plotted["annotations"]) == 6
    finally:
        page.close()


def test_live_refresh_reruns_the_panel_without_reloading(browser, dashboard_url: str, demo_server: DemoServer) -> None:
    page = _open(browser, f"{dashboard_url}/{_query(demo_server, refresh='1')}")
    try:
        caption = page.locator('[data-testid="stCaptionContainer"]').filter(has_text="run ")
        caption.first.wait_for(timeout=RENDER_TIMEOUT_MS)
        first = caption.first.inner_text()
        # The fragment reruns every second on its own; its run counter must move on.
        page.wait_for_function(
            """(first) => [...document.querySelectorAll('[data-testid="stCaptionContainer"]')]
                 .some(e => e.innerText.includes('run ') && e.innerText !== first)""",
            arg=first,
            timeout=20_000,
        )
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()


def _window_query(start: datetime, end: datetime, **extra: str) -> str:
    params = {
        "start": start.isoformat().replace("+00:00", "Z"),
        "end": end.isoformat().replace("+00:00", "Z"),
        "refresh": "0",
        "tz": "UTC",
        **extra,
    }
    return "?" + "&".join(f"{key}={value}" for key, value in params.items())


def test_overview_banner_gives_the_verdict_of_a_fault(browser, dashboard_url: str, demo_server: DemoServer) -> None:
    if demo_server.fault_start is None:
        pytest.skip("the kv-pressure scenario is not available; the demo run has no known fault")
    start = demo_server.fault_start.replace(microsecond=0)
    end = demo_server.fault_end.replace(microsecond=0) + timedelta(seconds=5)
    with httpx.Client(base_url=demo_server.url, timeout=60.0) as http:
        verdict = http.get("/api/v1/diagnosis", params={"start": start.isoformat(), "end": end.isoformat()}).json()
    assert verdict["healthy"] is False, verdict["summary"]  # the fault broke the TTFT objective
    page = _open(browser, f"{dashboard_url}/{_window_query(start, end)}")
    try:
        banner = page.locator(".inferpath-verdict")
        banner.wait_for(timeout=RENDER_TIMEOUT_MS)
        _settle(page)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard_overview_fault.png"))
        _no_exception(page)
        _no_raw_api_text(page)
        # On the Overview alone: degraded, the same top cause as the diagnosis, its first
        # remedy as the action, and a link to the evidence for the same window.
        assert banner.get_attribute("data-verdict") == "degraded"
        assert banner.get_attribute("data-cause") == verdict["top_cause"]
        text = banner.inner_text()
        assert text.startswith("Degraded")
        top = next(c for c in verdict["causes"] if c["cause"] == verdict["top_cause"])
        assert f"Do this: {top['would_help'][0]}" in text
        link = banner.get_by_role("link", name="See the evidence on the Diagnosis page →")
        assert "diagnosis?start=" in link.get_attribute("href")
        # The TTFT tile is red: the objective broke; the figure draws that objective.
        states = page.locator(".inferpath-tile").evaluate_all(
            "tiles => tiles.map(t => [t.innerText.split('\\n')[0], t.dataset.state])"
        )
        assert ["interactive TTFT p99", "broken"] in states, states
        plotted = _plotted(page)
        assert {
            "interactive TTFT p99",
            "Queue depth (max per step)",
            "KV-cache usage (max per step)",
            "Running batch (max per step)",
        } <= {t["name"] for t in plotted["data"]}
        assert "interactive objective 1,000 ms" in plotted["annotations"]
        # A cause the engine model can replay links to the predicted TTFT of its remedy.
        from inferpath.dashboard.whatif import SUGGESTIONS

        whatif_link = banner.locator("a.inferpath-whatif")
        if verdict["top_cause"] not in SUGGESTIONS:
            assert whatif_link.count() == 0
            return
        assert SUGGESTIONS[verdict["top_cause"]].text in whatif_link.inner_text()
        whatif_link.click()
        page.get_by_role("heading", name="What-if", exact=True).wait_for(timeout=RENDER_TIMEOUT_MS)
        page.get_by_role(
            "heading", name=f"Predicted TTFT with {SUGGESTIONS[verdict['top_cause']].text}", exact=True
        ).wait_for(timeout=RENDER_TIMEOUT_MS)
        # The prediction, or the server's reason for refusing one, as a sentence.
        page.locator('[data-testid="stDataFrame"], [data-testid="stAlertContentWarning"]').first.wait_for(
            timeout=180_000
        )
        _settle(page)
        page.screenshot(path=str(ARTIFACTS / "dashboard_whatif.png"))
        _no_exception(page)
        _no_raw_api_text(page)
        caption = page.locator('[data-testid="stCaptionContainer"]').filter(has_text="buckets of").first
        assert f"{start:%Y-%m-%d %H:%M:%S} → {end:%Y-%m-%d %H:%M:%S} UTC" in caption.inner_text()
    finally:
        page.close()


def test_diagnosis_of_an_incident_window_without_earlier_data_is_sentences(
    browser, dashboard_url: str, demo_server: DemoServer
) -> None:
    start = (demo_server.fault_start or demo_server.start).replace(microsecond=0)
    end = (demo_server.fault_end or demo_server.end).replace(microsecond=0) + timedelta(seconds=5)
    # The incident alone (nothing before it in the window), then 2 s of it: too few requests.
    for window_start, window_end, expected in ((start, end, None), (start, start + timedelta(seconds=2), "No verdict")):
        page = _open(browser, f"{dashboard_url}/diagnosis{_window_query(window_start, window_end)}")
        try:
            page.locator('[data-testid="stCaptionContainer"]').filter(has_text="buckets of").first.wait_for(
                timeout=RENDER_TIMEOUT_MS
            )
            _settle(page)
            _no_exception(page)
            _no_raw_api_text(page)
            if expected:
                page.get_by_text(expected).first.wait_for(timeout=RENDER_TIMEOUT_MS)
                assert "Widen or move the window" in page.inner_text("body")
        finally:
            page.close()


def test_the_sidebar_holds_the_window_to_the_second(browser, dashboard_url: str, demo_server: DemoServer) -> None:
    start = demo_server.start.replace(microsecond=0) + timedelta(seconds=7)
    end = demo_server.end.replace(microsecond=0) - timedelta(seconds=3)
    page = _open(browser, f"{dashboard_url}/alerts{_window_query(start, end)}")
    try:
        page.get_by_role("textbox", name="Start (UTC)").wait_for(timeout=RENDER_TIMEOUT_MS)
        _settle(page)
        assert page.get_by_role("textbox", name="Start (UTC)").input_value() == f"{start:%Y-%m-%d %H:%M:%S}"
        assert page.get_by_role("textbox", name="End (UTC)").input_value() == f"{end:%Y-%m-%d %H:%M:%S}"
        # The Alerts page follows the window too (its caption names it, to the second).
        caption = page.locator('[data-testid="stCaptionContainer"]').filter(has_text="buckets of")
        assert f"{start:%Y-%m-%d %H:%M:%S} → {end:%Y-%m-%d %H:%M:%S} UTC" in caption.first.inner_text()
        _no_raw_api_text(page)
    finally:
        page.close()


def _window_in_caption(page) -> tuple[str, str]:
    text = page.locator('[data-testid="stCaptionContainer"]').filter(has_text="buckets of").first.inner_text()
    start, rest = text.split(" → ", 1)
    return start, rest[:19]


def test_a_box_dragged_on_a_time_chart_sets_the_window_of_every_page(
    browser, dashboard_url: str, demo_server: DemoServer
) -> None:
    page = _open(browser, f"{dashboard_url}/correlate{_query(demo_server)}", WIDE)
    try:
        page.locator('[data-testid="stPlotlyChart"] .nsewdrag').first.wait_for(timeout=RENDER_TIMEOUT_MS)
        _settle(page)
        before = _window_in_caption(page)
        # Drag across the middle half of the TTFT row: plotly's box selection along time.
        area = page.locator('[data-testid="stPlotlyChart"] .nsewdrag').first.bounding_box()
        y = area["y"] + area["height"] / 2
        page.mouse.move(area["x"] + area["width"] * 0.25, y)
        page.mouse.down()
        page.mouse.move(area["x"] + area["width"] * 0.75, y, steps=10)
        page.mouse.up()
        page.wait_for_function(
            """(before) => [...document.querySelectorAll('[data-testid="stCaptionContainer"]')]
                 .some(e => e.innerText.includes('buckets of') && !e.innerText.startsWith(before))""",
            arg=before[0],
            timeout=RENDER_TIMEOUT_MS,
        )
        _settle(page)
        _no_exception(page)
        start, end = _window_in_caption(page)
        assert before[0] < start < end < before[1], (before, start, end)
        # The sidebar holds the brushed window to the second, and so does the URL.
        assert page.get_by_role("textbox", name="Start (UTC)").input_value() == start
        assert page.get_by_role("textbox", name="End (UTC)").input_value() == end
        assert "start=" in page.url and "end=" in page.url
        # Another page, chosen in the sidebar, shows the same window.
        page.get_by_role("link", name="Slowest requests").click()
        page.get_by_role("heading", name="Slowest requests", exact=True).wait_for(timeout=RENDER_TIMEOUT_MS)
        page.locator('[data-testid="stCaptionContainer"]').filter(has_text="buckets of").first.wait_for(
            timeout=RENDER_TIMEOUT_MS
        )
        _settle(page)
        assert _window_in_caption(page) == (start, end)
    finally:
        page.close()


def test_slowest_requests_show_queue_prefill_and_decode_without_scrolling(
    browser, dashboard_url: str, demo_server: DemoServer
) -> None:
    page = _open(browser, f"{dashboard_url}/requests{_query(demo_server)}", WIDE)
    try:
        grid = page.locator('[data-testid="stDataFrame"]')
        # The grid keeps an accessible copy of the columns it draws in view (and the next,
        # partly shown); scrolled to its start, the engine's phases must be among them,
        # with a column after decode: decode is whole on screen.
        header = grid.locator("th", has_text="decode ms")
        header.wait_for(state="attached", timeout=RENDER_TIMEOUT_MS)
        _settle(page)
        shown = grid.locator("th").all_inner_texts()
        assert {"queue ms", "prefill ms", "decode ms"} <= set(shown), shown
        assert shown.index("decode ms") < len(shown) - 1, shown
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard_requests_1600.png"))
    finally:
        page.close()


def test_filters_follow_every_page_and_each_page_says_what_it_cannot_filter(
    browser, dashboard_url: str, demo_server: DemoServer
) -> None:
    page = _open(
        browser,
        f"{dashboard_url}/requests{_query(demo_server, endpoint_class='interactive', model='no-such-model')}",
        WIDE,
    )
    try:
        note = page.locator('[data-testid="stAlertContentInfo"]').filter(has_text="Not filtered here")
        page.get_by_role("link", name="Correlate").wait_for(timeout=RENDER_TIMEOUT_MS)
        _settle(page)
        _no_exception(page)
        # /requests takes both the class and the model: nothing to say here.
        assert note.count() == 0, note.first.inner_text()
        page.get_by_role("link", name="Correlate").click()
        page.get_by_role("heading", name="Correlate", exact=True).wait_for(timeout=RENDER_TIMEOUT_MS)
        note.first.wait_for(timeout=RENDER_TIMEOUT_MS)
        _settle(page)
        # The filters came along; the correlate view applies both to its requests, the engine
        # signals beside them take the model filter nowhere (the class means nothing there).
        assert page.get_by_role("textbox", name="Model").input_value() == "no-such-model"
        text = note.first.inner_text()
        assert "model = no-such-model (/views/signals)" in text and "/views/correlate" not in text, text
        assert "endpoint class" not in text, text
        assert "endpoint_class=interactive" in page.url and "model=no-such-model" in page.url
        _no_raw_api_text(page)
    finally:
        page.close()
