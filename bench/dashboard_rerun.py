"""Dashboard: a cached rerun of every page ≤ 150 ms, against the page's raw read-API time.

A *cached rerun* is the page's script run when every read-API loader of
:mod:`inferpath.dashboard.queries` hits ``st.cache_data``: what a user waits for after
touching a widget, or on each live-refresh tick inside the cache TTL. Measured here with
Streamlit's ``AppTest`` running ``dashboard/app.py`` in this process (the script, its
widgets and every element it emits, without a browser's drawing), page by page
(Overview, Correlate, Breakdown, Slowest requests, Trace, GPUs and engines, Diagnosis,
Alerts):

- reference: the page's read-API calls made uncached, exactly as the page made them in its
  cold run (recorded at the client: same routes, same parameters; one fresh
  ``ReadApiClient`` per call as the loaders use);
- cached rerun: ``AppTest.run()`` on that page right after a run that filled the caches;
- uncached rerun (for scale): ``st.cache_data.clear()`` (the loaders) and
  ``st.cache_resource.clear()`` (the figure memo, :mod:`inferpath.dashboard.memo`), then
  ``AppTest.run()``: a page opened cold.

The three are interleaved round by round on one page, so background load hits them alike.
A counting TCP relay sits between the dashboard and the server: a cached rerun must open
no connection to the server (else it was not cached), an uncached rerun one per call.

``--browser`` adds what a user waits: ``streamlit run`` of the dashboard in Debian's
Chromium (Playwright as a driver), the "R" key to the end of the script run as the page
reports it, interleaved with the same reference and with the rerun of a one-title
Streamlit app served alike (the floor Streamlit, the websocket and Chromium cost anyway).

Data (real parts only): an inferpath server in its own process on a fresh embedded chDB,
holding one of:

- ``--dataset demo``: the ``kv-pressure`` demo scenario (about 40 s): every page has
  content (spans of four services, a TTFT spike, a diagnosis verdict);
- ``--dataset capture``: the recorded vLLM capture from ``shared/data/vllm_live_capture``
  posted over OTLP/HTTP (seconds; the smoke test uses it);
- ``--dataset gauges``: four engine gauges, 5000 one-second samples each, shown at 5000
  points per series (the heaviest charts, as ``bench/dashboard_memory.py``).

    python bench/dashboard_rerun.py                       # demo dataset, 7 rounds per page
    python bench/dashboard_rerun.py --browser             # and in Chromium
    python bench/dashboard_rerun.py --dataset capture --rounds 3

Exit code 0 when every page's median cached rerun is within ``--limit-ms``, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratch import scratch_folder  # noqa: E402  (a sibling module of the benchmarks)

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "dashboard" / "app.py"
CAPTURE = REPO / ".." / "shared" / "data" / "vllm_live_capture"
PROTOBUF = {"Content-Type": "application/x-protobuf"}
DEFAULT_POINTS = 600  # the dashboard's default points per series


@dataclass(frozen=True)
class Dataset:
    """A server holding data: its URL, the window the pages show, one trace id to open."""

    server_url: str
    start: datetime
    end: datetime
    trace_id: str
    description: str
    max_points: int = DEFAULT_POINTS


@dataclass
class PageFigures:
    """Per page: seconds of each round (reference, cached rerun, uncached rerun, and in the
    browser the rerun of a one-title Streamlit app: the framework's floor), the read-API
    calls the page makes, and the connections each kind of run opened."""

    title: str
    calls: int = 0
    raw_seconds: list[float] = field(default_factory=list)
    cached_seconds: list[float] = field(default_factory=list)
    uncached_seconds: list[float] = field(default_factory=list)
    floor_seconds: list[float] = field(default_factory=list)
    first_seconds: list[float] = field(default_factory=list)
    cached_connections: int = 0
    uncached_connections: int = 0


class CountingRelay:
    """A loopback TCP relay to ``target`` that counts accepted connections.

    The dashboard's loaders open one connection per read-API call, so the count tells
    whether a rerun reached the server at all. ``url`` is the relay's ``http://`` address.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.connections_total = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                self.connections_total += 1
            upstream = socket.create_connection(self._target)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        """Stop accepting (open pipes end with their peers)."""
        self._listener.close()


def _start_server(store_url: str, folder: Path):
    from inferpath.demo.processes import free_port, start_module

    port = free_port()
    server = start_module(
        "server",
        "inferpath.server",
        ["--port", str(port), "--store", store_url],
        port=port,
        log_path=str(folder / "server.log"),
        extra_env={"INFERPATH_ASSEMBLY_SETTLE_SECONDS": "0.5"},
    )
    server.wait_ready("/healthz")
    return server


def _capture_time(path: Path) -> datetime:
    # File names carry the scrape's wall-clock time in unix nanoseconds.
    return datetime.fromtimestamp(int(path.stem.split("_")[-1]) / 1e9, tz=timezone.utc)


def load_capture(folder: Path, stack: list) -> Dataset:
    """Serve a fresh store in ``folder`` holding the recorded vLLM capture (traces and
    engine gauges). Every loader appends the server it starts to ``stack``; the caller
    stops them. Raises ``FileNotFoundError`` when the capture is absent."""
    from inferpath.collectors.otlp_export import build_request
    from inferpath.collectors.prometheus import scrape_samples

    if not CAPTURE.is_dir():
        raise FileNotFoundError(f"recorded vLLM capture not found at {CAPTURE}")
    server = _start_server(f"chdb://{folder / 'store'}", folder)
    stack.append(server)
    trace_files = sorted((CAPTURE / "otlp").glob("*.pb"))
    scrapes = sorted(CAPTURE.glob("metrics_*.prom"))
    with httpx.Client(base_url=server.url, timeout=60.0) as http:
        for body_path in trace_files:
            http.post("/v1/traces", content=body_path.read_bytes(), headers=PROTOBUF).raise_for_status()
        samples = [
            sample
            for path in scrapes
            for sample in scrape_samples(path.read_text(), "vllm", timestamp=_capture_time(path))
        ]
        # Gauges only, as the collector agent would export them (counters left out).
        gauges = [sample for sample in samples if sample.kind == "gauge"]
        body = build_request([("vllm", gauges)]).SerializeToString()
        http.post("/v1/metrics", content=body, headers=PROTOBUF).raise_for_status()
        if not http.post("/api/v1/flush").json()["ok"]:
            raise RuntimeError("the server did not flush the capture")
        first = min(_capture_time(scrapes[0]), _capture_time(trace_files[0]))
        last = max(_capture_time(scrapes[-1]), _capture_time(trace_files[-1]))
        start = first.replace(second=0, microsecond=0) - timedelta(minutes=2)
        end = last.replace(second=0, microsecond=0) + timedelta(minutes=2)
        slowest = http.get(
            "/api/v1/requests", params={"start": start.isoformat(), "end": end.isoformat(), "limit": 1}
        ).json()["requests"]
    return Dataset(
        server.url,
        start,
        end,
        slowest[0]["trace_id"],
        f"recorded vLLM capture ({len(trace_files)} OTLP bodies, {len(scrapes)} scrapes)",
    )


def load_demo(folder: Path, stack: list, requests_per_phase: int = 40) -> Dataset:
    """Run the ``kv-pressure`` scenario into a fresh store, then serve that store.

    The window is the fault phase, widened so that the window of the same length before it
    (the Diagnosis page's baseline) covers the baseline phase.
    """
    from inferpath.demo.scenarios import ScenarioOptions, run_scenario

    store_url = f"chdb://{folder / 'store'}"
    outcome = run_scenario(
        "kv-pressure",
        ScenarioOptions(requests_per_phase=requests_per_phase, store_url=store_url, log_dir=folder / "logs"),
        log=lambda _: None,
    )
    (baseline_start, _), (fault_start, fault_end) = outcome.baseline_window, outcome.fault_window
    length = max(fault_end - fault_start, fault_start - baseline_start) + timedelta(seconds=2)
    start = fault_start.replace(microsecond=0)
    end = (fault_start + length).replace(microsecond=0) + timedelta(seconds=1)
    server = _start_server(store_url, folder)
    stack.append(server)
    slowest = httpx.get(
        f"{server.url}/api/v1/requests",
        timeout=60.0,
        params={"start": start.isoformat(), "end": end.isoformat(), "limit": 1},
    ).json()["requests"]
    return Dataset(
        server.url,
        start,
        end,
        slowest[0]["trace_id"],
        f"kv-pressure demo scenario, {requests_per_phase} requests per phase",
    )


def load_gauges(folder: Path, stack: list, points: int = 5000) -> Dataset:
    """Serve a fresh store holding ``points`` one-second samples of four engine gauges
    (the data of ``bench/dashboard_memory.py``): the heaviest charts, no requests."""
    spec = importlib.util.spec_from_file_location(
        "dashboard_memory", Path(__file__).resolve().parent / "dashboard_memory.py"
    )
    memory_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(memory_bench)
    server = _start_server(f"chdb://{folder / 'store'}", folder)
    stack.append(server)
    end = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=1)
    start = end - timedelta(seconds=points)
    with httpx.Client(base_url=server.url, timeout=120.0) as http:
        http.post("/v1/metrics", content=memory_bench.gauges_body(start, points), headers=PROTOBUF).raise_for_status()
        if not http.post("/api/v1/flush").json()["ok"]:
            raise RuntimeError("the server did not flush the gauges")
    return Dataset(
        server.url,
        start,
        end,
        "",
        f"four engine gauges, {points} one-second samples each, no requests",
        max_points=points,
    )


HOUR_REQUESTS = 19_366
"""Requests in one hour of the demo's trace (the Azure LLM inference trace 2023 replays
19,366 requests in its hour: ``inferpath demo --requests`` at most)."""
_FILL_HOUR = """
import sys
from datetime import datetime, timedelta, timezone
sys.path.insert(0, sys.argv[1])
import synthetic
from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread
running = serve_in_thread(Settings(store_url=sys.argv[2]), port=0)
try:
    start = datetime.fromisoformat(sys.argv[3])
    synthetic.fill(running.runtime.store, spans=int(sys.argv[4]) * synthetic.SPANS_PER_TRACE,
                   start=start, duration=timedelta(hours=1))
    running.runtime.refresh_rollups()
finally:
    running.stop()
"""


def load_hour(folder: Path, stack: list, requests: int = HOUR_REQUESTS) -> Dataset:
    """Serve a fresh store holding one hour of demo-sized traffic, the window the
    dashboard's default "last 1 h" shows: ``requests`` traces of 10 spans
    (:mod:`synthetic`: four services, two endpoint classes, an engine and four GPUs sampled
    every 2 s, an incident at 55-60 % of the hour) ending a minute ago. The store is filled
    in a child process (embedded chDB allows one owner per folder), then served."""
    store_url = f"chdb://{folder / 'store'}"
    end = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(minutes=1)
    start = end - timedelta(hours=1)
    subprocess.run(
        [
            sys.executable,
            "-c",
            _FILL_HOUR,
            str(Path(__file__).resolve().parent),
            store_url,
            start.isoformat(),
            str(requests),
        ],
        check=True,
    )
    server = _start_server(store_url, folder)
    stack.append(server)
    slowest = httpx.get(
        f"{server.url}/api/v1/requests",
        timeout=60.0,
        params={"start": start.isoformat(), "end": end.isoformat(), "limit": 1},
    ).json()["requests"]
    return Dataset(
        server.url,
        start,
        end,
        slowest[0]["trace_id"],
        f"one hour of demo-sized traffic ({requests} requests, {requests * 10} spans, incident at 55-60 %)",
    )


class RecordedCalls:
    """Records the read-API requests (path, parameters) a page makes while active, by
    wrapping :meth:`ReadApiClient._get` in this process (the bench's own, never a user's)."""

    def __init__(self) -> None:
        from inferpath.dashboard.client import ReadApiClient

        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.active = False
        original = ReadApiClient._get

        def recording(client, path, params):  # type: ignore[no-untyped-def]
            if self.active:
                self.calls.append((path, dict(params)))
            return original(client, path, params)

        self._original, self._client = original, ReadApiClient
        ReadApiClient._get = recording  # type: ignore[method-assign]

    def close(self) -> None:
        self._client._get = self._original  # type: ignore[method-assign]


def replay_calls(calls: list[tuple[str, dict[str, Any]]], server_url: str) -> int:
    """Make ``calls`` uncached against ``server_url``, one fresh client per call as each
    cached loader opens its own; a 4xx answer (e.g. "too few requests") is what the page
    shows, not a failure. Returns the number of calls."""
    from inferpath.dashboard.client import ReadApiClient, ReadApiError

    for path, params in calls:
        with ReadApiClient(server_url) as client:
            try:
                client.get_json(path, params)
            except ReadApiError as error:
                if error.status_code is None or error.status_code >= 500:
                    raise
    return len(calls)


PAGE_PATHS = {
    "Overview": "",
    "Correlate": "correlate",
    "Breakdown": "breakdown",
    "Slowest requests": "requests",
    "Trace": "trace",
    "GPUs and engines": "gpus",
    "Diagnosis": "diagnosis",
    "Alerts": "alerts",
}
"""Page title → URL path, as ``dashboard/app.py`` registers them."""
CHROMIUM = "/usr/bin/chromium"
FLOOR_APP = "import streamlit as st\n\nst.title('Floor')\n"
"""The browser reference: a Streamlit app drawing one title, served with the dashboard's
flags; its rerun is what Streamlit, the loopback websocket and Chromium cost anyway."""
# Installed before every page load (Playwright's init script): records when each script run
# ends (stApp's data-test-script-state turns "notRunning") and every long
# task (the main thread busy > 50 ms: protobuf decoding, React, plotly drawing).
_PAGE_CLOCK_JS = """
window.__ip = {ends: [], long: []};
new PerformanceObserver(list => { for (const e of list.getEntries())
  window.__ip.long.push([e.startTime, e.startTime + e.duration]); })
  .observe({type: 'longtask', buffered: true});
new MutationObserver(changes => { for (const change of changes) { const app = change.target;
  if (app.getAttribute('data-testid') === 'stApp' && change.oldValue !== 'notRunning'
      && app.getAttribute('data-test-script-state') === 'notRunning')
    window.__ip.ends.push(performance.now()); } })
  .observe(document, {subtree: true, attributes: true, attributeOldValue: true,
                      attributeFilter: ['data-test-script-state']});
"""
# Milliseconds from ``since`` (the page's clock) until the page is drawn: the first script run
# that ended after ``since``, every plotly chart holding its SVG, and the main thread quiet for
# QUIET_MS; the drawn moment is the latest of the run's end, the charts' appearance and the end
# of the last long task. null while not drawn yet.
QUIET_MS = 400
_DRAWN_JS = """since => {
  const now = performance.now(), ip = window.__ip;
  const end = ip.ends.find(t => t > since);
  if (end === undefined) return null;
  const charts = document.querySelectorAll('[data-testid="stPlotlyChart"]');
  for (const chart of charts) if (!chart.querySelector('.main-svg')) return null;
  if (ip.chartsAt === undefined || ip.chartsSince !== since) { ip.chartsAt = now; ip.chartsSince = since; }
  const busy = ip.long.filter(([s, e]) => e > since).map(([s, e]) => e);
  const lastBusy = busy.length ? Math.max(...busy) : since;
  if (now - Math.max(end, lastBusy) < QUIET_MS) return null;
  return Math.max(end, lastBusy, charts.length ? ip.chartsAt - 50 : end) - since;
}""".replace("QUIET_MS", str(QUIET_MS))


def _drawn_seconds(page, since_ms: float, timeout_ms: int = 120_000) -> float:
    """Seconds from ``since_ms`` (``performance.now()`` of the page) until it is drawn."""
    handle = page.wait_for_function(_DRAWN_JS, arg=since_ms, polling=50, timeout=timeout_ms)
    return handle.json_value() / 1000


def _iso(instant: datetime) -> str:
    return instant.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def page_query(dataset: Dataset) -> dict[str, str]:
    """The URL parameters every page is opened with: the dataset's window, live refresh off,
    UTC, the dataset's points per series, and its trace id."""
    return {
        "start": _iso(dataset.start),
        "end": _iso(dataset.end),
        "refresh": "0",
        "tz": "UTC",
        "points": str(dataset.max_points),
        "trace_id": dataset.trace_id,
    }


def open_app(dataset: Dataset):
    """An ``AppTest`` of ``dashboard/app.py`` opened with :func:`page_query`, run once so
    that its pages are registered. The server URL is read from ``INFERPATH_SERVER_URL``."""
    from streamlit.testing.v1 import AppTest

    app = AppTest.from_file(str(APP), default_timeout=120)
    app.query_params.update(page_query(dataset))
    app.run()
    return app


def select_page(app, title: str) -> None:
    """Make the next ``app.run()`` run the page titled ``title``.

    ``AppTest.switch_page`` only opens file-based pages and the dashboard's pages are
    functions, so the page's script hash is taken from the registry ``st.navigation``
    filled on the previous run (what a browser selects by URL path).
    """
    registered = app._registered_pages  # noqa: SLF001 - no public API for callable pages
    hashes = [page_hash for page_hash, info in registered.items() if info.get("page_name") == title]
    if len(hashes) != 1:
        raise RuntimeError(
            f"page {title!r} not registered; known: {[info.get('page_name') for info in registered.values()]}"
        )
    app._page_hash = hashes[0]  # noqa: SLF001


def check_page(app, title: str) -> None:
    """Raise ``RuntimeError`` when the run did not draw ``title`` or raised/showed an error."""
    titles = [element.value for element in app.title]
    problems = [str(e.value) for e in app.exception] + [str(e.value) for e in app.error]
    if title not in titles or problems:
        raise RuntimeError(f"page {title!r}: titles {titles}, problems {problems}")


def measure_script(dataset: Dataset, relay: CountingRelay, rounds: int, titles: list[str]) -> list[PageFigures]:
    """AppTest: interleaved rounds per page of uncached rerun, cached rerun, raw calls."""
    import streamlit as st
    from streamlit.logger import set_log_level

    # Clearing caches outside a script run and AppTest's bare runtime log one line per call.
    set_log_level("error")
    recorder = RecordedCalls()
    saved = {name: os.environ.get(name) for name in ("INFERPATH_SERVER_URL", "INFERPATH_TOKEN")}
    os.environ["INFERPATH_SERVER_URL"] = relay.url
    os.environ.pop("INFERPATH_TOKEN", None)
    try:
        app = open_app(dataset)
        results = []
        for title in titles:
            figures = PageFigures(title)
            select_page(app, title)
            app.run()  # warm: the page's first run fills its caches
            check_page(app, title)
            for _ in range(rounds):
                st.cache_data.clear()
                st.cache_resource.clear()  # the figure memo too: a cold page
                before = relay.connections_total
                recorder.calls.clear()
                recorder.active = True
                started = time.perf_counter()
                app.run()
                figures.uncached_seconds.append(time.perf_counter() - started)
                recorder.active = False
                page_requests = list(recorder.calls)
                figures.uncached_connections += relay.connections_total - before
                before = relay.connections_total
                started = time.perf_counter()
                app.run()
                figures.cached_seconds.append(time.perf_counter() - started)
                figures.cached_connections += relay.connections_total - before
                check_page(app, title)
                started = time.perf_counter()
                figures.calls = replay_calls(page_requests, dataset.server_url)
                figures.raw_seconds.append(time.perf_counter() - started)
            results.append(figures)
        return results
    finally:
        recorder.close()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _rerun_seconds(page) -> float:
    """Press "R" (Streamlit's rerun key) on ``page``: seconds from the key until the page is
    drawn again (:data:`_DRAWN_JS`)."""
    asked = page.evaluate("() => performance.now()")
    page.keyboard.press("r")
    return _drawn_seconds(page, asked)


def _visit_seconds(page, url: str, title: str) -> float:
    """Open ``url`` in ``page`` (a first visit: a page load and a script run): seconds from
    the navigation's start until the page is drawn. Raises ``RuntimeError`` when the page
    shows an exception or not ``title``."""
    page.goto(url, wait_until="commit")
    seconds = _drawn_seconds(page, 0.0)
    if not page.locator("h1", has_text=title).count():
        raise RuntimeError(f"page {title!r} did not draw its title")
    if page.locator('[data-testid="stException"]').count():
        raise RuntimeError(f"page {title!r} shows an exception")
    return seconds


def recorded_page_calls(
    dataset: Dataset, relay: CountingRelay, titles: list[str]
) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Per page title: the read-API requests its cold run makes (one AppTest run each)."""
    import streamlit as st

    recorder = RecordedCalls()
    saved = os.environ.get("INFERPATH_SERVER_URL")
    os.environ["INFERPATH_SERVER_URL"] = relay.url
    try:
        app = open_app(dataset)
        out = {}
        for title in titles:
            select_page(app, title)
            st.cache_data.clear()
            st.cache_resource.clear()
            recorder.calls.clear()
            recorder.active = True
            app.run()
            recorder.active = False
            check_page(app, title)
            out[title] = list(recorder.calls)
        return out
    finally:
        recorder.close()
        if saved is None:
            os.environ.pop("INFERPATH_SERVER_URL", None)
        else:
            os.environ["INFERPATH_SERVER_URL"] = saved


def measure_browser(
    dataset: Dataset,
    relay: CountingRelay,
    rounds: int,
    titles: list[str],
    folder: Path,
    attempts: int = 6,
    calls: dict[str, list[tuple[str, dict[str, Any]]]] | None = None,
) -> list[PageFigures]:
    """Chromium on ``streamlit run``, per page, interleaved rounds of:

    - the floor: the one-title app (:data:`FLOOR_APP`, second tab) rerun by the "R" key;
    - a first visit: the page's URL opened with a window moved by a few seconds from the
      last round's, so no cache holds it (a new window is what a first visit asks), timed
      from the navigation until the page is drawn (script run ended, every chart drawn, the
      main thread quiet: :data:`_DRAWN_JS`);
    - a warm rerun: the "R" key until the page is drawn again, every loader cached;
    - the reference: the page's read-API calls of a cold run, made uncached.

    A rerun that reached the server is not a warm rerun (the 5 s data TTL ran out; entries
    filled at different moments expire at different moments); it is repeated, up to
    ``attempts`` times, and its calls are counted in ``cached_connections``. Raises
    ``RuntimeError`` when a page shows an exception or no rerun of it was served from the
    cache.
    """
    from urllib.parse import urlencode

    from playwright.sync_api import sync_playwright

    from inferpath.dashboard.launch import (
        APP_PATH,
        dashboard_command,
        launch_dashboard,
        wait_until_ready,
    )
    from inferpath.demo.processes import free_port

    calls = calls or recorded_page_calls(dataset, relay, titles)
    port, floor_port = free_port(), free_port()
    url, floor_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{floor_port}"
    floor_script = folder / "floor_app.py"
    floor_script.write_text(FLOOR_APP)
    command = [
        str(floor_script) if part == str(APP_PATH) else part
        for part in dashboard_command(port=floor_port, host="127.0.0.1")
    ]
    floor = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    dashboard = launch_dashboard(relay.url, port=port, log_path=folder / "streamlit.log")
    shift = 0
    try:
        wait_until_ready(url, timeout_seconds=90, process=dashboard)
        wait_until_ready(floor_url, timeout_seconds=90, process=floor)
        results = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
            )
            context = browser.new_context(viewport={"width": 1600, "height": 1800})
            context.add_init_script(_PAGE_CLOCK_JS)
            floor_page = context.new_page()
            _visit_seconds(floor_page, floor_url, "Floor")
            page = context.new_page()
            # Streamlit imports the app's modules on its first script run: not a page's cost.
            _visit_seconds(page, f"{url}/alerts?refresh=0", "Alerts")
            for title in titles:
                figures = PageFigures(title)
                for _ in range(rounds):
                    floor_page.bring_to_front()  # a background tab's timers are throttled
                    figures.floor_seconds.append(_rerun_seconds(floor_page))
                    page.bring_to_front()
                    shift += 1
                    moved = replace(
                        dataset,
                        start=dataset.start + timedelta(seconds=shift),
                        end=dataset.end + timedelta(seconds=shift),
                    )
                    before = relay.connections_total
                    figures.first_seconds.append(
                        _visit_seconds(page, f"{url}/{PAGE_PATHS[title]}?{urlencode(page_query(moved))}", title)
                    )
                    figures.uncached_connections += relay.connections_total - before
                    for _ in range(attempts):
                        before = relay.connections_total
                        seconds = _rerun_seconds(page)
                        if relay.connections_total == before:
                            figures.cached_seconds.append(seconds)
                            break
                        figures.cached_connections += relay.connections_total - before
                    started = time.perf_counter()
                    figures.calls = replay_calls(calls[title], dataset.server_url)
                    figures.raw_seconds.append(time.perf_counter() - started)
                if not figures.cached_seconds:
                    raise RuntimeError(f"page {title!r}: no rerun was served from the cache")
                results.append(figures)
            browser.close()
        return results
    finally:
        for process in (dashboard, floor):
            process.terminate()
            process.wait(timeout=15)


LOADERS = {"demo": load_demo, "capture": load_capture, "gauges": load_gauges, "hour": load_hour}


def run(
    dataset_name: str = "demo",
    rounds: int = 7,
    only: list[str] | None = None,
    browser: bool = False,
    workdir: str | None = None,
) -> dict[str, Any]:
    """Prepare the dataset (:data:`LOADERS`), measure the pages (all, or ``only``) with
    AppTest and, when ``browser``, in Chromium. Returns ``{"dataset", "window_seconds",
    "max_points", "load_average": (before, after), "script": [PageFigures],
    "browser": [PageFigures] or None}``. Raises ``RuntimeError`` when a page fails to draw.
    Without ``workdir`` the data lives in a temporary folder, removed afterwards."""
    with scratch_folder(workdir, "inferpath-dashboard-rerun-") as folder:
        return _run(folder, dataset_name, rounds, only, browser)


def _run(folder: Path, dataset_name: str, rounds: int, only: list[str] | None, browser: bool) -> dict[str, Any]:
    titles = [title for title in PAGE_PATHS if not only or title in only]
    stack: list = []
    relay = None
    try:
        dataset = LOADERS[dataset_name](folder, stack)
        host, port = dataset.server_url.removeprefix("http://").split(":")
        relay = CountingRelay(host, int(port))
        # A cold run of every page first: the server's first answers after its start (marks,
        # caches, a rollup pass) are not what a page costs.
        calls = recorded_page_calls(dataset, relay, titles)
        load_before = os.getloadavg()
        script = measure_script(dataset, relay, rounds, titles)
        in_browser = measure_browser(dataset, relay, rounds, titles, folder, calls=calls) if browser else None
        return {
            "dataset": dataset.description,
            "window_seconds": (dataset.end - dataset.start).total_seconds(),
            "max_points": dataset.max_points,
            "load_average": (load_before, os.getloadavg()),
            "script": script,
            "browser": in_browser,
        }
    finally:
        if relay is not None:
            relay.close()
        for child in reversed(stack):
            child.stop()


def _ms(values: list[float]) -> str:
    return f"{1000 * statistics.median(values):7.1f} ({1000 * min(values):6.1f})"


def _ratio(measured: float, reference: float) -> str:
    # A page that makes no read-API call (Trace without an id) has no reference.
    return f"{measured / reference:.2f}" if reference > 1e-4 else "–"


def _print_table(pages: list[PageFigures], limit_ms: float) -> bool:
    print(
        f"{'page':<18} {'calls':>5}  {'raw API ms med (best)':>21}  {'cached rerun':>16}  "
        f"{'uncached rerun':>16}  cached/raw  server calls on cached"
    )
    ok = True
    for page in pages:
        cached = statistics.median(page.cached_seconds)
        ok &= cached * 1000 <= limit_ms
        print(
            f"{page.title:<18} {page.calls:>5}  {_ms(page.raw_seconds):>21}  "
            f"{_ms(page.cached_seconds):>16}  {_ms(page.uncached_seconds):>16}  "
            f"{_ratio(cached, statistics.median(page.raw_seconds)):>10}  "
            f"{page.cached_connections}"
        )
    return ok


def _print_browser_table(pages: list[PageFigures], first_limit_ms: float, rerun_limit_ms: float) -> bool:
    print(
        f"{'page':<18} {'calls':>5}  {'API ms':>16}  {'first visit ms':>16}  {'/API':>5}  "
        f"{'warm rerun ms':>16}  {'/API':>5}  {'floor rerun ms':>16}"
    )
    ok = True
    for page in pages:
        raw = statistics.median(page.raw_seconds)
        first, rerun = statistics.median(page.first_seconds), statistics.median(page.cached_seconds)
        ok &= first * 1000 <= first_limit_ms and rerun * 1000 <= rerun_limit_ms
        print(
            f"{page.title:<18} {page.calls:>5}  {_ms(page.raw_seconds):>16}  "
            f"{_ms(page.first_seconds):>16}  {_ratio(first, raw):>5}  "
            f"{_ms(page.cached_seconds):>16}  {_ratio(rerun, raw):>5}  "
            f"{_ms(page.floor_seconds):>16}"
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    """Command line: run, print one row per page with the ratio to the reference."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=sorted(LOADERS), default="demo")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--limit-ms", type=float, default=150.0, help="most ms of a cached script rerun (AppTest)")
    parser.add_argument(
        "--first-limit-ms", type=float, default=3000.0, help="most ms of a first visit in Chromium, until drawn"
    )
    parser.add_argument(
        "--rerun-limit-ms", type=float, default=1500.0, help="most ms of a warm rerun in Chromium, until drawn"
    )
    parser.add_argument("--page", action="append", choices=list(PAGE_PATHS), help="measure only this page (repeatable)")
    parser.add_argument(
        "--browser", action="store_true", help=f"also time first visits and reruns in Chromium ({CHROMIUM})"
    )
    args = parser.parse_args(argv)
    figures = run(args.dataset, args.rounds, args.page, args.browser)
    before, after = figures["load_average"]
    print(
        f"dataset: {figures['dataset']}; window {figures['window_seconds']:.0f} s, "
        f"{figures['max_points']} points per series; load average {before[0]:.2f} before, "
        f"{after[0]:.2f} after; ms: median (best) of {args.rounds} rounds"
    )
    print("script run (AppTest, in process):")
    ok = _print_table(figures["script"], args.limit_ms)
    ok &= all(page.cached_connections == 0 for page in figures["script"])
    verdict = f"cached script rerun ≤ {args.limit_ms:.0f} ms on every page, no server call"
    if figures["browser"] is not None:
        print("browser (Chromium, 1600 px wide; until the page is drawn):")
        ok &= _print_browser_table(figures["browser"], args.first_limit_ms, args.rerun_limit_ms)
        verdict += (
            f"; in Chromium a first visit ≤ {args.first_limit_ms:.0f} ms and a warm "
            f"rerun ≤ {args.rerun_limit_ms:.0f} ms"
        )
    print(f"{verdict}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
