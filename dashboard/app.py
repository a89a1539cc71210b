"""The inferpath dashboard: a Streamlit app reading the server's read API.

Run it with ``streamlit run dashboard/app.py -- --server-url http://127.0.0.1:4318`` or
through :func:`inferpath.dashboard.launch.launch_dashboard`. The server URL and token come
from ``--server-url``/``--token``, else ``INFERPATH_SERVER_URL``/``INFERPATH_TOKEN``.

Query parameters preselect the time range, so a view can be linked or bookmarked:
``?range=15m|1h|6h`` or ``?start=<ISO or unix s>&end=<...>`` (a custom range);
``?endpoint_class=interactive``; ``?refresh=0`` turns live refresh off.

Live panels are Streamlit fragments with ``run_every``: only the panel reruns on each tick,
never the whole script, and no loop runs inside one script run. Queries are cached for
:data:`CACHE_TTL_SECONDS` with a bounded number of entries, so several open browser tabs
cost the server one query per window and interval.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta, timezone

import pandas as pd
import streamlit as st

from inferpath.config import Settings
from inferpath.dashboard import figures
from inferpath.dashboard.client import ReadApiClient, ReadApiError
from inferpath.dashboard.timerange import (
    CUSTOM,
    RANGE_KEYS,
    RANGE_LABELS,
    TimeWindow,
    parse_instant,
    resolve_window,
)

CACHE_TTL_SECONDS = 5
CACHE_MAX_ENTRIES = 256
REFRESH_CHOICES_SECONDS = [0, 5, 15, 60]
ENDPOINT_CLASSES = ["all", "interactive", "bulk"]
ENGINE_GAUGES = [
    # metric, title, axis label, display scale
    ("kv_cache_usage_ratio", "KV-cache usage", "% of blocks", 100.0),
    ("running_requests", "Running requests", "requests", 1.0),
    ("queue_depth", "Queue depth", "requests waiting", 1.0),
    ("gpu_utilization_ratio", "GPU utilization", "%", 100.0),
    ("gpu_memory_used_bytes", "GPU memory used", "GiB", 1.0 / 2**30),
]


def connection_settings(argv: list[str]) -> tuple[str, str | None]:
    """Server URL and token from ``--server-url``/``--token`` in ``argv``, else the env."""
    parser = argparse.ArgumentParser(prog="inferpath-dashboard", add_help=False)
    parser.add_argument("--server-url")
    parser.add_argument("--token")
    args, _ = parser.parse_known_args(argv)
    settings = Settings.from_env(server_url=args.server_url, token=args.token)
    return settings.server_url, settings.token


# ---- cached read-API queries (arguments are the cache key; errors are not cached) ----

@st.cache_data(ttl=CACHE_TTL_SECONDS, max_entries=CACHE_MAX_ENTRIES, show_spinner=False)
def load_summary(server_url: str, token: str | None, start: datetime, end: datetime,
                 endpoint_class: str | None) -> pd.DataFrame:
    """``/summary`` over the window, cached (see :meth:`ReadApiClient.summary`)."""
    with ReadApiClient(server_url, token=token) as client:
        return client.summary(start, end, endpoint_class=endpoint_class)


@st.cache_data(ttl=CACHE_TTL_SECONDS, max_entries=CACHE_MAX_ENTRIES, show_spinner=False)
def load_ttft(server_url: str, token: str | None, start: datetime, end: datetime,
              step_seconds: int, endpoint_class: str | None) -> pd.DataFrame:
    """``/timeseries/ttft`` over the window, cached."""
    with ReadApiClient(server_url, token=token) as client:
        return client.ttft_timeseries(start, end, step_seconds=step_seconds,
                                      endpoint_class=endpoint_class)


@st.cache_data(ttl=CACHE_TTL_SECONDS, max_entries=CACHE_MAX_ENTRIES, show_spinner=False)
def load_gauge(server_url: str, token: str | None, metric: str, start: datetime,
               end: datetime, step_seconds: int) -> pd.DataFrame:
    """``/timeseries/gauge`` of one canonical ``metric`` over the window, cached."""
    with ReadApiClient(server_url, token=token) as client:
        return client.gauge_timeseries(metric, start, end, step_seconds=step_seconds)


@st.cache_data(ttl=CACHE_TTL_SECONDS, max_entries=CACHE_MAX_ENTRIES, show_spinner=False)
def load_requests(server_url: str, token: str | None, start: datetime, end: datetime,
                  limit: int) -> pd.DataFrame:
    """The ``limit`` slowest requests of the window, cached."""
    with ReadApiClient(server_url, token=token) as client:
        return client.requests(start, end, limit=limit, order="slowest")


# ---- sidebar: connection, time range, filters ----

def sidebar_controls() -> dict:
    """Draw the sidebar and return the chosen range key, custom bounds, class and refresh."""
    params = st.query_params
    custom_start = custom_end = None
    default_key = params.get("range", "1h")
    try:
        if params.get("start") and params.get("end"):
            custom_start = parse_instant(params["start"], field="start")
            custom_end = parse_instant(params["end"], field="end")
            default_key = CUSTOM
    except ValueError as error:
        st.sidebar.warning(f"Ignoring the URL's time range: {error}")
    if default_key not in RANGE_KEYS:
        default_key = "1h"
    st.sidebar.header("Time range")
    range_key = st.sidebar.radio("Window", RANGE_KEYS, index=RANGE_KEYS.index(default_key),
                                 format_func=RANGE_LABELS.get, key="range_key",
                                 label_visibility="collapsed")
    if range_key == CUSTOM:
        now = datetime.now(timezone.utc).replace(tzinfo=None, microsecond=0)
        custom_start = st.sidebar.datetime_input(
            "Start (UTC)", value=(custom_start or now - timedelta(hours=1)).replace(tzinfo=None),
            step=timedelta(minutes=1), key="custom_start")
        custom_end = st.sidebar.datetime_input(
            "End (UTC)", value=(custom_end or now).replace(tzinfo=None),
            step=timedelta(minutes=1), key="custom_end")
    requested_class = params.get("endpoint_class", "all")
    endpoint_class = st.sidebar.selectbox(
        "Endpoint class", ENDPOINT_CLASSES,
        index=ENDPOINT_CLASSES.index(requested_class) if requested_class in ENDPOINT_CLASSES
        else 0, key="endpoint_class")
    try:
        default_refresh = int(params.get("refresh", 15))
    except ValueError:
        default_refresh = 15
    refresh_seconds = st.sidebar.selectbox(
        "Live refresh", REFRESH_CHOICES_SECONDS,
        index=REFRESH_CHOICES_SECONDS.index(default_refresh)
        if default_refresh in REFRESH_CHOICES_SECONDS else 2,
        format_func=lambda s: "off" if s == 0 else f"every {s} s", key="refresh_seconds")
    return {"range_key": range_key, "custom_start": custom_start, "custom_end": custom_end,
            "endpoint_class": None if endpoint_class == "all" else endpoint_class,
            "refresh_seconds": refresh_seconds}


def current_window(controls: dict) -> TimeWindow | None:
    """The window to query now, or ``None`` after showing why the custom range is invalid."""
    try:
        return resolve_window(controls["range_key"], now=datetime.now(timezone.utc),
                              custom_start=controls["custom_start"],
                              custom_end=controls["custom_end"])
    except ValueError as error:
        st.warning(f"Invalid time range: {error}")
        return None


def window_caption(window: TimeWindow) -> None:
    """One line saying which window is shown, at what resolution, and when it was drawn."""
    st.caption(f"{window.start:%Y-%m-%d %H:%M:%S} → {window.end:%Y-%m-%d %H:%M:%S} UTC · "
               f"buckets of {window.step_seconds} s · "
               f"updated {datetime.now(timezone.utc):%H:%M:%S} UTC")


# ---- pages ----

def overview_panels(server_url: str, token: str | None, controls: dict) -> None:
    """TTFT vs queue depth and the per-stage latency table for the current window."""
    window = current_window(controls)
    if window is None:
        return
    window_caption(window)
    endpoint_class = controls["endpoint_class"]
    try:
        ttft = load_ttft(server_url, token, window.start, window.end, window.step_seconds,
                         endpoint_class)
        queue = load_gauge(server_url, token, "queue_depth", window.start, window.end,
                           window.step_seconds)
        summary = load_summary(server_url, token, window.start, window.end, endpoint_class)
    except ReadApiError as error:
        st.error(str(error))
        return
    table = figures.stage_latency_table(summary)
    headline = table.set_index("stage") if not table.empty else None
    columns = st.columns(4)
    request_count = summary.attrs.get("request_count")
    columns[0].metric("requests", "–" if request_count is None else f"{request_count}")
    for column, (label, stage, stat) in zip(columns[1:], [
            ("TTFT p50", "TTFT (server)", "p50_ms"), ("TTFT p99", "TTFT (server)", "p99_ms"),
            ("queue p95", "queue", "p95_ms")]):
        value = headline.at[stage, stat] if headline is not None and stage in headline.index \
            else None
        column.metric(label, "–" if value is None or pd.isna(value) else f"{value:.0f} ms")
    st.subheader("TTFT and engine queue depth")
    st.plotly_chart(figures.ttft_with_queue_depth(ttft, queue, step_seconds=window.step_seconds),
                    width="stretch", key="ttft_queue")
    st.subheader("Latency per stage")
    if table.empty:
        st.info("No requests in this window.")
    # Tall enough for every measure: a scrolling 14-row table hides the stages at the end.
    st.dataframe(table, hide_index=True, width="stretch", height=36 * (len(table) + 1) + 4,
                 column_config={
                     "stage": st.column_config.TextColumn("stage"),
                     "count": st.column_config.NumberColumn("count", format="%d"),
                     **{f"{s}_ms": st.column_config.NumberColumn(f"{s} (ms)", format="%.1f")
                        for s in ("avg", "p50", "p95", "p99")}})


def engine_panels(server_url: str, token: str | None, controls: dict) -> None:
    """Engine and GPU gauges over the current window, one chart each."""
    window = current_window(controls)
    if window is None:
        return
    window_caption(window)
    for metric, title, y_title, scale in ENGINE_GAUGES:
        try:
            gauge = load_gauge(server_url, token, metric, window.start, window.end,
                               window.step_seconds)
        except ReadApiError as error:
            st.error(f"{title}: {error}")
            continue
        st.plotly_chart(figures.gauge_over_time(gauge, title=title, y_title=y_title,
                                                scale=scale, step_seconds=window.step_seconds),
                        width="stretch", key=f"gauge_{metric}")


def requests_panels(server_url: str, token: str | None, controls: dict) -> None:
    """The slowest requests of the current window, durations in ms."""
    window = current_window(controls)
    if window is None:
        return
    window_caption(window)
    try:
        rows = load_requests(server_url, token, window.start, window.end, 100)
    except ReadApiError as error:
        st.error(str(error))
        return
    if rows.empty:
        st.info("No requests in this window.")
    table = figures.requests_table(rows)
    # Tall enough for every measure: a scrolling 14-row table hides the stages at the end.
    st.dataframe(table, hide_index=True, width="stretch", height=36 * (len(table) + 1) + 4,
                 column_config={
        column: st.column_config.NumberColumn(column.replace("_ms", " (ms)"), format="%.1f")
        for column in table.columns if column.endswith("_ms")})


def run_live(panel, server_url: str, token: str | None, controls: dict) -> None:
    """Run ``panel`` as a fragment that reruns alone every ``refresh_seconds`` (0 = once)."""
    refresh = controls["refresh_seconds"] or None
    st.fragment(panel, run_every=refresh)(server_url, token, controls)


def main() -> None:
    """Configure the page, resolve the server, and run the selected page."""
    st.set_page_config(page_title="inferpath", layout="wide")
    server_url, token = connection_settings(sys.argv[1:])

    def overview() -> None:
        st.title("Overview")
        run_live(overview_panels, server_url, token, sidebar_controls())

    def requests_page() -> None:
        st.title("Slowest requests")
        run_live(requests_panels, server_url, token, sidebar_controls())

    def engine_page() -> None:
        st.title("Engine and GPU")
        run_live(engine_panels, server_url, token, sidebar_controls())

    page = st.navigation([
        st.Page(overview, title="Overview", default=True),
        st.Page(requests_page, title="Slowest requests", url_path="requests"),
        st.Page(engine_page, title="Engine and GPU", url_path="engine"),
    ])
    st.sidebar.caption(f"server: {server_url}")
    page.run()


# Streamlit runs the script as __main__; importing the module draws nothing.
if __name__ == "__main__":
    main()
