"""The dashboard's pages: what each one queries (through :mod:`.queries`) and draws.

Each ``*_panels`` function draws one page body for a :class:`Context` and runs inside a
Streamlit fragment (see :func:`inferpath.dashboard.app.run_live`), so a live refresh reruns
only the body. Read-API failures are shown as an error box naming the cause, never raised.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from inferpath.dashboard import charts, figures, fleet, waterfall
from inferpath.dashboard.client import ReadApiError
from inferpath.dashboard.memo import memo_figure
from inferpath.dashboard.queries import (
    NO_VERDICT_KEY, load_alerts, load_diagnosis, load_gauge, load_requests, load_summary,
    load_trace, load_view,
)
from inferpath.dashboard.timerange import TimeWindow

ENGINE_GAUGES = [
    # metric, title, axis label, display scale
    ("kv_cache_usage_ratio", "KV-cache usage", "% of blocks", 100.0),
    ("running_requests", "Running requests", "requests", 1.0),
    ("queue_depth", "Queue depth", "requests waiting", 1.0),
    ("gpu_utilization_ratio", "GPU utilization", "%", 100.0),
    ("gpu_memory_used_bytes", "GPU memory used", "GiB", 1.0 / 2**30),
]
SLOWEST_LIMIT = 100
SPIKE_TRACES_LIMIT = 20
RUNS_KEY = "panel_runs"


@dataclass(frozen=True)
class Context:
    """What a page body needs: the server, the window, the zone, the filters."""

    server_url: str
    token: str | None
    window: TimeWindow | None
    tz: str
    endpoint_class: str | None
    max_points: int


def _caption(ctx: Context) -> None:
    # The run counter lets a test or a benchmark count live refreshes from the page.
    st.session_state[RUNS_KEY] = st.session_state.get(RUNS_KEY, 0) + 1
    window = ctx.window
    start, end = charts.wall_time([window.start, window.end], ctx.tz)
    now = charts.wall_time([datetime.now(timezone.utc)], ctx.tz)[0]
    st.caption(f"{start:%Y-%m-%d %H:%M:%S} → {end:%Y-%m-%d %H:%M:%S} {ctx.tz} · "
               f"buckets of {window.step_seconds} s · updated {now:%H:%M:%S} · "
               f"run {st.session_state[RUNS_KEY]}")


def _trace_links(table: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    # Any list of traces links each row to its waterfall.
    if "trace_id" not in table:
        return table, {}
    table = table.copy()
    table["trace"] = "trace?trace_id=" + table["trace_id"].astype(str)
    table = table[["trace", *[c for c in table.columns if c not in ("trace", "trace_id")]]]
    return table, {"trace": st.column_config.LinkColumn("trace", display_text=r"trace_id=(.*)")}


def _requests_table(rows: pd.DataFrame, tz: str) -> None:
    table = figures.requests_table(rows)
    if "timestamp" in table:
        table["timestamp"] = charts.wall_time(table["timestamp"], tz)
    table, link_config = _trace_links(table)
    st.dataframe(table, hide_index=True, width="stretch", height=36 * (min(len(table), 25) + 1) + 4,
                 column_config={**link_config, **{
                     column: st.column_config.NumberColumn(column.replace("_ms", " (ms)"),
                                                           format="%.1f")
                     for column in table.columns if column.endswith("_ms")}})


def overview_panels(ctx: Context) -> None:
    """Per endpoint class: TTFT, ITL, E2E (p50, p95, p99, mean), request and error rates,
    p99/mean ratio over time; the per-stage latency table of the window."""
    _caption(ctx)
    window = ctx.window
    params = (("endpoint_class", ctx.endpoint_class), ("max_points", ctx.max_points),
              ("step_seconds", window.step_seconds))
    try:
        view = load_view(ctx.server_url, ctx.token, "latency", window.start, window.end, params)
        summary = load_summary(ctx.server_url, ctx.token, window.start, window.end,
                               ctx.endpoint_class)
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
            ("E2E p99", "E2E (server)", "p99_ms")]):
        value = headline.at[stage, stat] if headline is not None and stage in headline.index \
            else None
        column.metric(label, "–" if value is None or pd.isna(value) else f"{value:.0f} ms")
    by_class = memo_figure(charts.latency_by_class, view, ctx.tz)
    if not by_class:
        st.info("No requests in this window.")
    elif "ddsketch" in (view.get("percentiles"), summary.attrs.get("percentiles")):
        st.caption("Percentiles over this wide window come from per-minute sketches (within 0.5 % "
                   "of the exact value); counts and means are exact.")
    for klass, figure in by_class.items():
        st.subheader(f"Endpoint class: {klass}")
        st.plotly_chart(figure, width="stretch", key=f"latency_{klass}")
    st.subheader("Latency per stage")
    st.dataframe(table, hide_index=True, width="stretch", height=36 * (len(table) + 1) + 4,
                 column_config={
                     "count": st.column_config.NumberColumn("count", format="%d"),
                     **{f"{s}_ms": st.column_config.NumberColumn(f"{s} (ms)", format="%.1f")
                        for s in ("avg", "p50", "p95", "p99")}})


def correlate_panels(ctx: Context) -> None:
    """TTFT p99/mean beside queue, batch, KV cache, preemptions and GPU state on one time
    axis; detected spikes shaded; the slowest traces of the chosen spike."""
    _caption(ctx)
    window = ctx.window
    try:
        view = load_view(ctx.server_url, ctx.token, "correlate", window.start, window.end,
                         (("max_points", ctx.max_points), ("step_seconds", window.step_seconds)))
    except ReadApiError as error:
        st.error(str(error))
        return
    st.subheader("Latency and engine state")
    st.plotly_chart(memo_figure(charts.correlate_figure, view, ctx.tz), width="stretch",
                    key="correlate")
    spikes = view.get("spikes", [])
    st.subheader("Spikes")
    if not spikes:
        st.info(f"No TTFT spike in this window (a spike: p99 above "
                f"{view.get('spike_factor', 3):g}× the median of the steps before it).")
        return
    labels = [charts.spike_label(spike, ctx.tz) for spike in spikes]
    chosen = st.selectbox("Spike", range(len(spikes)), format_func=labels.__getitem__,
                          key="spike")
    spike = spikes[chosen]
    start = pd.Timestamp(spike["start"]).to_pydatetime()
    end = pd.Timestamp(spike["end"]).to_pydatetime()
    try:
        rows = load_requests(ctx.server_url, ctx.token, start, end, SPIKE_TRACES_LIMIT)
    except ReadApiError as error:
        st.error(str(error))
        return
    st.caption(f"The {SPIKE_TRACES_LIMIT} slowest requests that started in the spike")
    _requests_table(rows, ctx.tz)


def breakdown_panels(ctx: Context) -> None:
    """Stage shares of TTFT and E2E per percentile band; overhead of each hop."""
    _caption(ctx)
    window = ctx.window
    try:
        view = load_view(ctx.server_url, ctx.token, "breakdown", window.start, window.end,
                         (("endpoint_class", ctx.endpoint_class),))
    except ReadApiError as error:
        st.error(str(error))
        return
    st.caption(f"{view.get('request_count', 0)} successful requests in the window")
    for measure in ("ttft", "e2e"):
        st.subheader(f"{measure.upper()} by stage")
        st.plotly_chart(memo_figure(charts.band_shares_figure, view["bands"].get(measure, []),
                                    measure=measure), width="stretch", key=f"bands_{measure}")
    st.subheader("Overhead per hop")
    hops = charts.hops_table(view.get("hops", []))
    if hops.empty:
        st.info("No caller/callee span pairs in this window (hop overhead needs the caller's "
                "CLIENT span and the callee's SERVER span of the same call).")
    elif view.get("hop_percentiles") == "ddsketch":
        st.caption("Hop percentiles over this wide window come from per-minute sketches (within "
                   "0.5 % of the exact value); counts and means are exact.")
    st.dataframe(hops, hide_index=True, width="stretch", column_config={
        c: st.column_config.NumberColumn(c.replace("_ms", " (ms)"), format="%.1f")
        for c in hops.columns if c.endswith("_ms")})


def requests_panels(ctx: Context) -> None:
    """The slowest requests of the window, each linked to its waterfall."""
    _caption(ctx)
    window = ctx.window
    try:
        rows = load_requests(ctx.server_url, ctx.token, window.start, window.end, SLOWEST_LIMIT)
    except ReadApiError as error:
        st.error(str(error))
        return
    if rows.empty:
        st.info("No requests in this window.")
    _requests_table(rows, ctx.tz)


def trace_page(server_url: str, token: str | None, tz: str) -> None:
    """Waterfall of one trace, chosen by id (``?trace_id=``) or typed in."""
    trace_id = st.text_input("Trace id (32 hex digits)", value=st.query_params.get("trace_id", ""),
                             key="trace_id").strip()
    if not trace_id:
        st.info("Open a trace from any list of requests, or paste its id.")
        return
    try:
        spans = load_trace(server_url, token, trace_id)
    except ValueError as error:
        st.warning(str(error))
        return
    except ReadApiError as error:
        (st.warning if error.status_code == 404 else st.error)(str(error))
        return
    rows = waterfall.span_rows(spans)
    start = charts.wall_time([rows["timestamp"].min()], tz)[0]
    total_ms = (rows["end_ns"].max() - rows["start_ns"].min()) * figures.MS_PER_NS
    st.caption(f"{len(rows)} spans from {rows['service_name'].nunique()} services · started "
               f"{start:%Y-%m-%d %H:%M:%S.%f} {tz} · {total_ms:.1f} ms")
    st.subheader("Waterfall")
    st.plotly_chart(memo_figure(waterfall.waterfall_figure, spans), width="stretch",
                    key="waterfall")
    st.subheader("Spans")
    table = rows[["label", "span_kind", "offset_ms", "duration_ms", "status_code", "span_id",
                  "parent_span_id"]].copy()
    table["attributes"] = [", ".join(f"{k}={v}" for k, v in sorted(a.items()))
                           if isinstance(a, dict) else "" for a in rows["span_attributes"]]
    st.dataframe(table, hide_index=True, width="stretch", column_config={
        "offset_ms": st.column_config.NumberColumn("start (ms)", format="%.1f"),
        "duration_ms": st.column_config.NumberColumn("duration (ms)", format="%.1f")})


def fleet_panels(ctx: Context) -> None:
    """Per GPU (host, UUID) and per engine (service, engine, model): each signal's last,
    mean and max in the window; missing signals listed with why; gauges over time."""
    _caption(ctx)
    window = ctx.window
    try:
        view = load_view(ctx.server_url, ctx.token, "fleet", window.start, window.end)
    except ReadApiError as error:
        st.error(str(error))
        return
    gpus, engines, missing = fleet.fleet_tables(view)
    st.subheader("GPUs")
    if gpus.empty:
        st.info("No GPU signals in this window.")
    else:
        st.dataframe(gpus, hide_index=True, width="stretch")
    st.subheader("Engines")
    if engines.empty:
        st.info("No engine signals in this window.")
    else:
        st.dataframe(engines, hide_index=True, width="stretch")
    st.subheader("Missing signals")
    if missing.empty:
        st.success("Every canonical signal is reported.")
    else:
        st.dataframe(missing, hide_index=True, width="stretch")
    st.subheader("Over time")
    for metric, title, y_title, scale in ENGINE_GAUGES:
        try:
            gauge = load_gauge(ctx.server_url, ctx.token, metric, window.start, window.end,
                               window.step_seconds)
        except ReadApiError as error:
            st.error(f"{title}: {error}")
            continue
        figure = memo_figure(gauge_panel_figure, gauge, ctx.tz, title=title, y_title=y_title,
                             scale=scale, step_seconds=window.step_seconds)
        st.plotly_chart(figure, width="stretch", key=f"gauge_{metric}")


def gauge_panel_figure(gauge: pd.DataFrame, tz: str, *, title: str, y_title: str, scale: float,
                       step_seconds: int) -> go.Figure:
    """One gauge of the GPUs and engines page: ``gauge`` (UTC ``bucket`` rows as
    :meth:`ReadApiClient.gauge_timeseries` returns) drawn in the wall time of ``tz``."""
    if not gauge.empty:
        gauge = gauge.assign(bucket=charts.wall_time(gauge["bucket"], tz))
    figure = figures.gauge_over_time(gauge, title=title, y_title=y_title, scale=scale,
                                     step_seconds=step_seconds)
    figure.update_xaxes(title_text=f"time ({tz})")
    return figure


def diagnosis_panels(ctx: Context) -> None:
    """The verdict for the window against the latency objectives: causes, evidence, budget."""
    _caption(ctx)
    window = ctx.window
    try:
        verdict = load_diagnosis(ctx.server_url, ctx.token, window.start, window.end)
    except ReadApiError as error:
        st.error(f"No verdict: the inferpath server could not answer ({error.detail}). Check that "
                 f"`inferpath up` is running at {ctx.server_url}, then reload.")
        return
    if NO_VERDICT_KEY in verdict:
        st.info(f"No verdict for this window: {verdict[NO_VERDICT_KEY]}. Widen the window in the sidebar.")
        return
    (st.success if verdict.get("healthy") else st.warning)(verdict.get("summary", ""))
    st.caption(f"{verdict.get('current_requests')} requests in the window")
    objectives = pd.DataFrame(verdict.get("objectives", []))
    if not objectives.empty:
        objectives["value_ms"] = objectives["value_ns"] * figures.MS_PER_NS
        objectives["objective_ms"] = objectives["limit_ns"] * figures.MS_PER_NS
        objectives["percentile"] = (objectives["quantile"] * 100).map(lambda q: f"p{q:g}")
        st.subheader("latency objectives")
        st.dataframe(objectives[["endpoint_class", "measure", "percentile", "value_ms", "objective_ms", "met",
                                 "requests"]], hide_index=True, width="stretch")
    budget = verdict.get("budget")
    if budget:
        st.markdown(f"**Budget:** {budget.get('text', '')}")
    basis = "of the increase" if verdict.get("basis") == "baseline" else "of the slow requests' time"
    for cause in verdict.get("causes", []):
        st.subheader(f"{cause['cause']}: {min(1.0, cause['share']) * 100:.0f}% {basis} "
                     f"({cause['added_ns'] * figures.MS_PER_NS:.0f} ms per tail request)")
        for line in cause.get("evidence", []):
            st.markdown(f"- {line['text']}")
        for line in cause.get("would_help", []):
            st.markdown(f"- would help: {line}")
        for line in cause.get("would_not_help", []):
            st.markdown(f"- would not help: {line}")
    for note in verdict.get("notes", []):
        st.caption(f"note: {note}")


def alerts_panels(ctx: Context) -> None:
    """Alerts firing now and their history, from ``/api/v1/alerts`` when the server has it."""
    _caption(ctx)
    try:
        body = load_alerts(ctx.server_url, ctx.token)
    except ReadApiError as error:
        st.error(str(error))
        return
    if body is None:
        st.info("Alerts are not configured: this server has no /api/v1/alerts. Define alert "
                "rules and run the alert evaluator to see firing alerts and their history here.")
        return
    sections = body if isinstance(body, dict) else {"alerts": body}
    if sections.get("configured") is False:
        st.info("No alert evaluator runs in this server: set INFERPATH_ALERT_RULES to a rule file "
                "(or `default`). Past state changes, if any, are listed below.")
    shown = False
    for key in ("firing", "pending", "alerts", "history", "rules"):
        rows = sections.get(key)
        if isinstance(rows, list):
            shown = True
            st.subheader(key.capitalize())
            if rows:
                st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
            else:
                st.info(f"No {key} alerts." if key != "rules" else "No rules.")
    if not shown:
        st.json(body)
