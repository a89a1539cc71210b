"""The dashboard's pages: what each one queries (through :mod:`.queries`) and draws.

Each ``*_panels`` function draws one page body for a :class:`Context` and runs inside a
Streamlit fragment (see :func:`inferpath.dashboard.app.run_live`), so a live refresh reruns
only the body. Read-API failures are shown as an error box naming the cause, never raised.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlencode

import pandas as pd
import streamlit as st

from inferpath.dashboard import charts, figures, fleet, messages, saturation, spikes, waterfall, whatif
from inferpath.dashboard import verdict as verdict_view
from inferpath.dashboard.brush import time_chart
from inferpath.dashboard.client import ReadApiError
from inferpath.dashboard.filters import Filters, not_applied_note
from inferpath.dashboard.memo import memo_figure
from inferpath.dashboard.queries import (
    NO_VERDICT_KEY,
    answer,
    load_alerts,
    load_all,
    load_diagnosis,
    load_gauge,
    load_objectives,
    load_requests,
    load_summary,
    load_trace,
    load_view,
)
from inferpath.dashboard.timerange import TimeWindow
from inferpath.vocabulary import ENDPOINT_CLASSES, UNCLASSIFIED, share_basis

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
    window: TimeWindow
    tz: str
    filters: Filters
    max_points: int

    @property
    def endpoint_class(self) -> str | None:
        """The chosen endpoint class (``None``: all)."""
        return self.filters.endpoint_class

    def sent(self, route: str) -> tuple[tuple[str, str], ...]:
        """The active filters ``route`` takes (:meth:`Filters.for_route`)."""
        return self.filters.for_route(route)


def _caption(ctx: Context, *routes: str) -> None:
    # The run counter lets a test or a benchmark count live refreshes from the page.
    st.session_state[RUNS_KEY] = st.session_state.get(RUNS_KEY, 0) + 1
    window = ctx.window
    start, end = charts.wall_time([window.start, window.end], ctx.tz)
    now = charts.wall_time([datetime.now(timezone.utc)], ctx.tz)[0]
    st.caption(
        f"{start:%Y-%m-%d %H:%M:%S} → {end:%Y-%m-%d %H:%M:%S} {ctx.tz} · "
        f"buckets of {window.step_seconds} s · updated {now:%H:%M:%S} · "
        f"run {st.session_state[RUNS_KEY]}"
    )
    note = not_applied_note(ctx.filters, routes)  # routes: what the page reads
    if note:
        st.info(note)


def _trace_links(table: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    # Any list of traces links each row to its waterfall.
    if "trace_id" not in table:
        return table, {}
    table = table.copy()
    table["trace"] = "trace?trace_id=" + table["trace_id"].astype(str)
    table = table[["trace", *[c for c in table.columns if c not in ("trace", "trace_id")]]]
    # The first 8 hex digits name a trace on screen; the link carries all 32.
    return table, {"trace": st.column_config.LinkColumn("trace", display_text=r"trace_id=(.{8})", width="small")}


def _requests_table(rows: pd.DataFrame, tz: str) -> None:
    # Durations in narrow columns, so that E2E, TTFT, queue, prefill and decode show beside
    # the time at 1600 px without scrolling sideways.
    table = figures.requests_table(rows, tz)
    table, link_config = _trace_links(table)
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        height=36 * (min(len(table), 25) + 1) + 4,
        column_config={
            **link_config,
            "timestamp": st.column_config.DatetimeColumn(f"started ({tz})", format="YYYY-MM-DD HH:mm:ss.SSS"),
            **{
                column: st.column_config.NumberColumn(
                    _duration_label(column),
                    format="%.1f",
                    width=max(70, 8 * len(_duration_label(column)) + 28),
                    help=f"{column[:-3]}, milliseconds",
                )
                for column in table.columns
                if column.endswith("_ms")
            },
        },
    )


def _duration_label(column: str) -> str:
    # "client_e2e_ms" → "E2E client ms": short enough for a narrow column.
    measure = column[:-3].removeprefix("client_")
    name = measure.upper() if measure in ("e2e", "ttft", "itl") else measure
    return f"{name}{' client' if column.startswith('client_') else ''} ms"


def _explain(error: ReadApiError, what: str, ctx: Context) -> str:
    return messages.explain(error, what=what, server_url=ctx.server_url)


def _evidence_href(ctx: Context) -> str:
    # The Diagnosis page for the same window, to the second, with live refresh off.
    query = {
        "start": _iso(ctx.window.start),
        "end": _iso(ctx.window.end),
        "tz": ctx.tz,
        "refresh": "0",
        **ctx.filters.as_params(),
    }
    return "diagnosis?" + urlencode(query)


def _iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _verdict(ctx: Context, diagnosis: Any) -> tuple[dict | None, str | None]:
    """(verdict, why there is none) from ``diagnosis`` (:func:`load_diagnosis`'s answer or
    its :class:`ReadApiError`): the verdict of the window, or the sentence saying why it
    has none (too few requests, or the server failed)."""
    if isinstance(diagnosis, ReadApiError):
        return None, _explain(diagnosis, "the verdict", ctx)
    if NO_VERDICT_KEY in diagnosis:
        return None, messages.no_verdict(diagnosis[NO_VERDICT_KEY])
    return diagnosis, None


def _objectives(result: Any) -> dict | None:
    # The lines are a help, not the page: without them the verdict still judges.
    return None if isinstance(result, ReadApiError) else result


def _before_summary(ctx: Context, klass: str) -> tuple:
    # The /summary of one class over the window of the same length just before this one.
    window = ctx.window
    filters = replace(ctx.filters, endpoint_class=None if klass == UNCLASSIFIED else klass)
    return (
        load_summary,
        (
            ctx.server_url,
            ctx.token,
            window.start - (window.end - window.start),
            window.start,
            filters.for_route("/api/v1/summary"),
        ),
    )


def _baseline_ms(ctx: Context, verdict: dict | None, fetched: dict[str, Any]) -> dict[tuple[str, str], float | None]:
    """(class, measure) → p99 in ms over the window of the same length just before this one,
    for the tiles' "before"; empty where that window has no requests or fails to load.
    ``fetched``: class → its :func:`_before_summary` answer, read with the page's other
    reads; a class of the verdict not among them is read now."""
    classes = verdict_view.classes_of(verdict)
    missing = [klass for klass in classes if klass not in fetched]
    fetched = {**fetched, **dict(zip(missing, load_all([_before_summary(ctx, k) for k in missing])))}
    out: dict[tuple[str, str], float | None] = {}
    for klass, summary in ((klass, fetched[klass]) for klass in classes):
        if isinstance(summary, ReadApiError):
            continue
        by_measure = summary.set_index("measure") if not summary.empty else None
        for measure in ("ttft", "itl", "e2e"):
            for name in (f"client_{measure}", measure):
                if (
                    by_measure is not None
                    and name in by_measure.index
                    and by_measure.at[name, "count"]
                    and not pd.isna(by_measure.at[name, "p99_seconds"])
                ):
                    out[(klass, measure)] = by_measure.at[name, "p99_seconds"] * figures.MS_PER_SECOND
                    break
    return out


def _tiles(ctx: Context, verdict: dict | None, summary: pd.DataFrame, before: dict[str, Any]) -> None:
    request_count = summary.attrs.get("request_count")
    tiles = verdict_view.objective_tiles(verdict, _baseline_ms(ctx, verdict, before) if verdict else {})
    if not tiles:  # no verdict: the window's own numbers, not judged
        headline = figures.stage_latency_table(summary).set_index("stage") if not summary.empty else None
        # The client's measure when the caller is instrumented, else the server's (as judged).
        for label, stages in (
            ("TTFT p99", ("TTFT (client)", "TTFT (server)")),
            ("E2E p99", ("E2E (client)", "E2E (server)")),
        ):
            values = [headline.at[s, "p99_ms"] for s in stages if headline is not None and s in headline.index]
            value = next((v for v in values if not pd.isna(v)), None)
            tiles.append(
                verdict_view.Tile(
                    label,
                    None if value is None or pd.isna(value) else value,
                    None,
                    None,
                    "unknown",
                    "not judged: no verdict",
                )
            )
    columns = st.columns(1 + len(tiles))
    columns[0].markdown(
        verdict_view.tile_html(
            verdict_view.Tile(
                "requests",
                None,
                None,
                None,
                "unknown",
                value_text="–" if request_count is None else f"{request_count:,}",
            )
        ),
        unsafe_allow_html=True,
    )
    for column, tile in zip(columns[1:], tiles):
        column.markdown(verdict_view.tile_html(tile), unsafe_allow_html=True)


def overview_panels(ctx: Context) -> None:
    """The verdict first: a banner (healthy or degraded against the objectives, the top
    cause, the one action, a link to the evidence), tiles coloured against the objectives
    and the window before, TTFT p99 with its objective over queue depth, KV usage and the
    running batch; then per endpoint class TTFT, ITL, E2E, rates and p99/mean, and the
    per-stage latency table."""
    _caption(ctx, "/api/v1/diagnosis", "/api/v1/views/latency", "/api/v1/summary", "/api/v1/views/signals")
    window = ctx.window
    server = (ctx.server_url, ctx.token)
    step_params = (("max_points", ctx.max_points), ("step_seconds", window.step_seconds))
    # The tiles' "before" of each usual class is read with the rest, not after the verdict.
    before_classes = [ctx.endpoint_class] if ctx.endpoint_class else list(ENDPOINT_CLASSES)
    diagnosis, latency, summary, signals, objectives, *before = load_all(
        [
            (load_diagnosis, (*server, window.start, window.end, ctx.sent("/api/v1/diagnosis"))),
            (
                load_view,
                (*server, "latency", window.start, window.end, (*ctx.sent("/api/v1/views/latency"), *step_params)),
            ),
            (load_summary, (*server, window.start, window.end, ctx.sent("/api/v1/summary"))),
            (load_view, (*server, "signals", window.start, window.end, step_params)),
            (load_objectives, server),
            *[_before_summary(ctx, klass) for klass in before_classes],
        ]
    )
    verdict, why_not = _verdict(ctx, diagnosis)
    banner = verdict_view.banner_of(verdict, no_verdict=why_not)
    suggestion = whatif.SUGGESTIONS.get((verdict or {}).get("top_cause") or "")
    href = whatif.whatif_href(verdict, start=window.start, end=window.end, tz=ctx.tz, choices=ctx.filters.as_params())
    st.markdown(
        verdict_view.banner_html(
            banner,
            evidence_href=_evidence_href(ctx) if verdict else None,
            whatif=(suggestion.text, href) if suggestion and href else None,
        ),
        unsafe_allow_html=True,
    )
    try:
        view, summary = answer(latency), answer(summary)
    except ReadApiError as error:
        st.error(_explain(error, "the latency of this window", ctx))
        return
    _tiles(ctx, verdict, summary, dict(zip(before_classes, before)))
    if isinstance(signals, ReadApiError):
        st.warning(_explain(signals, "the engine and GPU signals", ctx))
        signals = {}
    limits = verdict_view.objective_limits(_objectives(objectives), ctx.endpoint_class)
    time_chart(
        memo_figure(
            saturation.overview_figure,
            view,
            signals,
            ctx.tz,
            ttft_limits_ms=limits,
            slot_limit=verdict_view.slot_limit(verdict),
            window_end=window.end,
        ),
        key="overview_saturation",
        tz=ctx.tz,
    )
    table = figures.stage_latency_table(summary)
    by_class = memo_figure(charts.latency_by_class, view, ctx.tz)
    if not by_class:
        st.info("No requests in this window: widen or move the window in the sidebar.")
    elif "ddsketch" in (view.get("percentiles"), summary.attrs.get("percentiles")):
        st.caption(
            "Percentiles over this wide window come from per-minute sketches (within 0.5 % "
            "of the exact value); counts and means are exact."
        )
    if by_class:
        # One class's detail at a time: each is a five-row figure, and Chromium's drawing of
        # it was the largest part of a first visit (bench/dashboard_rerun.py --browser).
        klass = _class_picked(list(by_class))
        st.subheader(f"Endpoint class: {klass}")
        time_chart(by_class[klass], key="latency_by_class", tz=ctx.tz)
    st.subheader("Latency per stage")
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        height=36 * (len(table) + 1) + 4,
        column_config={
            "count": st.column_config.NumberColumn("count", format="%d"),
            **{
                f"{s}_ms": st.column_config.NumberColumn(f"{s} (ms)", format="%.1f")
                for s in ("avg", "p50", "p95", "p99")
            },
        },
    )


def _class_picked(classes: list[str]) -> str:
    """The endpoint class whose detail the Overview draws: chosen among ``classes`` (one
    button each), ``interactive`` first when present."""
    default = "interactive" if "interactive" in classes else classes[0]
    if len(classes) == 1:
        return default
    ordered = [default, *[c for c in classes if c != default]]
    chosen = st.segmented_control("Detail of endpoint class", ordered, default=default, key="overview_class")
    return chosen if chosen in classes else default


def spike_threshold(ctx: Context, objectives: dict | None, reference: Any) -> spikes.Threshold | None:
    """The window's spike threshold (:mod:`.spikes`): from ``reference`` (the ``/summary`` of
    :func:`spikes.reference_window`, or its :class:`ReadApiError`) and the TTFT objective of
    the chosen class (the strictest class's when all are shown)."""
    limits = verdict_view.objective_limits(objectives, ctx.endpoint_class)
    summary = pd.DataFrame() if isinstance(reference, ReadApiError) else reference
    reference_p99 = requests = None
    by_measure = summary.set_index("measure") if not summary.empty else pd.DataFrame()
    # The judged TTFT: the client's when the window measured it, else the server's.
    measured = [m for m in ("client_ttft", "ttft") if m in by_measure.index and by_measure.at[m, "count"]]
    if measured:
        row = by_measure.loc[measured[0]]
        reference_p99 = None if pd.isna(row["p99_seconds"]) else float(row["p99_seconds"])
        requests = int(row["count"])
    return spikes.spike_threshold(
        objective_seconds=min(limits.values()) / figures.MS_PER_SECOND if limits else None,
        reference_p99_seconds=reference_p99,
        reference_requests=requests,
    )


def _strictest(limits: dict[str, float]) -> dict[str, float]:
    # The correlate view mixes classes: draw the objective its spikes are judged against.
    return dict([min(limits.items(), key=lambda item: item[1])]) if limits else {}


def correlate_panels(ctx: Context) -> None:
    """TTFT p99/mean beside queue, batch, KV cache, preemptions and GPU state on one time
    axis (max per step, mean dotted, capacity dashed, missing and stale marked); spikes
    against a threshold fixed before the window; the slowest traces of the chosen spike."""
    _caption(ctx, "/api/v1/views/correlate", "/api/v1/views/signals", "/api/v1/summary", "/api/v1/requests")
    window = ctx.window
    server = (ctx.server_url, ctx.token)
    step_params = (("max_points", ctx.max_points), ("step_seconds", window.step_seconds))
    before_start, before_end = spikes.reference_window(window.start)
    view, signals, objectives, reference = load_all(
        [
            (
                load_view,
                (*server, "correlate", window.start, window.end, (*ctx.sent("/api/v1/views/correlate"), *step_params)),
            ),
            (load_view, (*server, "signals", window.start, window.end, step_params)),
            (load_objectives, server),
            (load_summary, (*server, before_start, before_end, ctx.sent("/api/v1/summary"))),
        ]
    )
    try:
        view, signals = answer(view), answer(signals)
    except ReadApiError as error:
        st.error(_explain(error, "the correlation of latency and engine state", ctx))
        return
    objectives = _objectives(objectives)
    threshold = spike_threshold(ctx, objectives, reference)
    found = spikes.find_spikes(
        view.get("points", []), step_seconds=float(view.get("step_seconds", 1)), threshold=threshold
    )
    st.subheader("Latency and engine state")
    time_chart(
        memo_figure(
            saturation.correlate_figure,
            view,
            signals,
            ctx.tz,
            spikes=found,
            window_end=window.end,
            ttft_limits_ms=_strictest(verdict_view.objective_limits(objectives, ctx.endpoint_class)),
        ),
        key="correlate",
        tz=ctx.tz,
    )
    st.subheader("Spikes")
    if threshold is None:
        st.info(
            "No spike threshold: there are no objectives from the server and too few requests "
            "in the 15 minutes before the window. Move the window's start later."
        )
        return
    st.caption(
        f"A spike: a step whose TTFT p99 is above {threshold.seconds * figures.MS_PER_SECOND:.0f} ms, "
        f"{threshold.basis}; it does not change with the zoom."
    )
    if not found:
        st.info("No TTFT spike in this window.")
        return
    labels = [saturation.spike_label(spike, ctx.tz) for spike in found]
    chosen = st.selectbox("Spike", range(len(found)), format_func=labels.__getitem__, key="spike")
    spike = found[chosen]
    start = pd.Timestamp(spike["start"]).to_pydatetime()
    end = pd.Timestamp(spike["end"]).to_pydatetime()
    try:
        rows = load_requests(ctx.server_url, ctx.token, start, end, SPIKE_TRACES_LIMIT, ctx.sent("/api/v1/requests"))
    except ReadApiError as error:
        st.error(_explain(error, "the requests of this spike", ctx))
        return
    st.caption(f"The {SPIKE_TRACES_LIMIT} slowest requests that started in the spike")
    _requests_table(rows, ctx.tz)


def breakdown_panels(ctx: Context) -> None:
    """Stage shares of TTFT and E2E per percentile band; overhead of each hop."""
    _caption(ctx, "/api/v1/views/breakdown")
    window = ctx.window
    try:
        view = load_view(
            ctx.server_url, ctx.token, "breakdown", window.start, window.end, ctx.sent("/api/v1/views/breakdown")
        )
    except ReadApiError as error:
        st.error(_explain(error, "the stage breakdown", ctx))
        return
    st.caption(f"{view.get('request_count', 0)} successful requests in the window")
    for measure in ("ttft", "e2e"):
        st.subheader(f"{measure.upper()} by stage")
        st.plotly_chart(
            memo_figure(charts.band_shares_figure, view["bands"].get(measure, []), measure=measure),
            width="stretch",
            key=f"bands_{measure}",
        )
    st.subheader("Overhead per hop")
    hops = charts.hops_table(view.get("hops", []))
    if hops.empty:
        st.info(
            "No caller/callee span pairs in this window (hop overhead needs the caller's "
            "CLIENT span and the callee's SERVER span of the same call)."
        )
    elif view.get("hop_percentiles") == "ddsketch":
        st.caption(
            "Hop percentiles over this wide window come from per-minute sketches (within "
            "0.5 % of the exact value); counts and means are exact."
        )
    st.dataframe(
        hops,
        hide_index=True,
        width="stretch",
        column_config={
            c: st.column_config.NumberColumn(c.replace("_ms", " (ms)"), format="%.1f")
            for c in hops.columns
            if c.endswith("_ms")
        },
    )


def requests_panels(ctx: Context) -> None:
    """The slowest requests of the window, each linked to its waterfall."""
    _caption(ctx, "/api/v1/requests")
    window = ctx.window
    try:
        rows = load_requests(
            ctx.server_url, ctx.token, window.start, window.end, SLOWEST_LIMIT, ctx.sent("/api/v1/requests")
        )
    except ReadApiError as error:
        st.error(_explain(error, "the slowest requests", ctx))
        return
    if rows.empty:
        st.info("No requests in this window: widen or move the window in the sidebar.")
    _requests_table(rows, ctx.tz)


def trace_page(server_url: str, token: str | None, tz: str) -> None:
    """Waterfall of one trace, chosen by id (``?trace_id=``) or typed in."""
    trace_id = st.text_input(
        "Trace id (32 hex digits)", value=st.query_params.get("trace_id", ""), key="trace_id"
    ).strip()
    if not trace_id:
        st.info("Open a trace from any list of requests, or paste its id.")
        return
    try:
        spans = load_trace(server_url, token, trace_id)
    except ValueError:
        st.warning(
            f"{trace_id!r} is not a trace id: a trace id is 32 hexadecimal digits. Open a "
            f"trace from any list of requests, or paste its id."
        )
        return
    except ReadApiError as error:
        if error.status_code == 404:
            st.warning(
                f"Trace {trace_id} not found: no span of it is stored. It may not have "
                f"arrived yet (reload in a few seconds) or be older than the retention."
            )
        else:
            st.error(messages.explain(error, what="this trace", server_url=server_url))
        return
    rows = waterfall.span_rows(spans)
    start = charts.wall_time([rows["timestamp"].min()], tz)[0]
    total_ms = (rows["end_ns"].max() - rows["start_ns"].min()) * figures.MS_PER_NS
    st.caption(
        f"{len(rows)} spans from {rows['service_name'].nunique()} services · started "
        f"{start:%Y-%m-%d %H:%M:%S.%f} {tz} · {total_ms:.1f} ms"
    )
    st.subheader("Waterfall")
    st.plotly_chart(memo_figure(waterfall.waterfall_figure, spans), width="stretch", key="waterfall")
    st.subheader("Spans")
    table = rows[["label", "span_kind", "offset_ms", "duration_ms", "status_code", "span_id", "parent_span_id"]].copy()
    table["attributes"] = [
        ", ".join(f"{k}={v}" for k, v in sorted(a.items())) if isinstance(a, dict) else ""
        for a in rows["span_attributes"]
    ]
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            "offset_ms": st.column_config.NumberColumn("start (ms)", format="%.1f"),
            "duration_ms": st.column_config.NumberColumn("duration (ms)", format="%.1f"),
        },
    )


def fleet_panels(ctx: Context) -> None:
    """Per GPU (host, UUID) and per engine (service, engine, model): each signal's last,
    mean and max in the window; missing signals listed with why; gauges over time."""
    _caption(ctx, "/api/v1/views/fleet", "/api/v1/timeseries/gauge")
    window = ctx.window
    view, *gauges = load_all(
        [
            (load_view, (ctx.server_url, ctx.token, "fleet", window.start, window.end)),
            *[
                (load_gauge, (ctx.server_url, ctx.token, metric, window.start, window.end, window.step_seconds))
                for metric, *_ in ENGINE_GAUGES
            ],
        ]
    )
    try:
        view = answer(view)
    except ReadApiError as error:
        st.error(_explain(error, "the GPUs and engines", ctx))
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
    for (metric, title, y_title, scale), gauge in zip(ENGINE_GAUGES, gauges):
        if isinstance(gauge, ReadApiError):
            st.error(_explain(gauge, title, ctx))
            continue
        figure = memo_figure(
            figures.gauge_over_time,
            gauge,
            ctx.tz,
            title=title,
            y_title=y_title,
            scale=scale,
            step_seconds=window.step_seconds,
        )
        time_chart(figure, key=f"gauge_{metric}", tz=ctx.tz)


def diagnosis_panels(ctx: Context) -> None:
    """The verdict for the window against the latency objectives: causes, evidence, budget."""
    _caption(ctx, "/api/v1/diagnosis")
    window = ctx.window
    try:
        verdict = load_diagnosis(ctx.server_url, ctx.token, window.start, window.end, ctx.sent("/api/v1/diagnosis"))
    except ReadApiError as error:
        st.error(_explain(error, "the verdict", ctx))
        return
    if NO_VERDICT_KEY in verdict:
        st.info(messages.no_verdict(verdict[NO_VERDICT_KEY]))
        return
    (st.success if verdict.get("healthy") else st.warning)(verdict.get("summary", ""))
    counted = (
        " (counted by the engine's own histograms: see the notes)" if verdict.get("source") == "histograms" else ""
    )
    st.caption(f"{verdict.get('current_requests')} requests in the window{counted}")
    objectives = pd.DataFrame(verdict.get("objectives", []))
    if not objectives.empty:
        objectives["value_ms"] = objectives["value_ns"] * figures.MS_PER_NS
        objectives["objective_ms"] = objectives["limit_ns"] * figures.MS_PER_NS
        objectives["percentile"] = (objectives["quantile"] * 100).map(lambda q: f"p{q:g}")
        st.subheader("latency objectives")
        st.dataframe(
            objectives[["endpoint_class", "measure", "percentile", "value_ms", "objective_ms", "met", "requests"]],
            hide_index=True,
            width="stretch",
        )
    budget = verdict.get("budget")
    if budget:
        st.markdown(f"**Budget:** {budget.get('text', '')}")
    basis = share_basis(verdict.get("basis"), verdict.get("source"))
    per = "request" if verdict.get("source") == "histograms" else "tail request"
    for cause in verdict.get("causes", []):
        st.subheader(
            f"{cause['cause']}: {min(1.0, cause['share']) * 100:.0f}% of the {basis} "
            f"({cause['added_ns'] * figures.MS_PER_NS:.0f} ms per {per})"
        )
        for line in cause.get("evidence", []):
            st.markdown(f"- {line['text']}")
        for line in cause.get("would_help", []):
            st.markdown(f"- would help: {line}")
        for line in cause.get("would_not_help", []):
            st.markdown(f"- would not help: {line}")
    for note in verdict.get("notes", []):
        st.caption(f"note: {note}")


def whatif_panels(ctx: Context) -> None:
    """The predicted TTFT p50/p99 under the change the Overview's verdict suggests
    (:mod:`.whatif`), beside the observed and the replayed figures."""
    _caption(ctx, "/api/v1/whatif")
    whatif.whatif_panel(ctx.server_url, ctx.token, ctx.window.start, ctx.window.end)


def alerts_panels(ctx: Context) -> None:
    """Alerts firing and pending now, the rules' status, and the state changes of the
    window (``/api/v1/alerts?start=&end=``), each as a table."""
    _caption(ctx, "/api/v1/alerts")
    window = ctx.window
    try:
        body = load_alerts(ctx.server_url, ctx.token, window.start, window.end)
    except ReadApiError as error:
        st.error(_explain(error, "the alerts", ctx))
        return
    if body is None:
        st.info(
            "Alerts are not configured: this server has no alerts route. Define alert "
            "rules and run the alert evaluator to see firing alerts and their history here."
        )
        return
    sections = body if isinstance(body, dict) else {"history": body if isinstance(body, list) else []}
    if sections.get("configured") is False:
        st.info(
            "No alert evaluator runs in this server: set INFERPATH_ALERT_RULES to a rule file "
            "(or `default`) and restart it. Past state changes of the window, if any, are "
            "listed below."
        )
    for key, title, empty in (
        ("firing", "Firing now", "No alert is firing."),
        ("pending", "Pending now", "No alert is pending."),
        ("rules", "Rules", "No rules are loaded."),
        ("history", "State changes in this window", "No alert changed state in this window."),
    ):
        rows = sections.get(key)
        if not isinstance(rows, list):
            continue
        st.subheader(title)
        table = alerts_table(key, rows, ctx.tz)
        if table.empty:
            st.info(empty)
        else:
            st.dataframe(table, hide_index=True, width="stretch")


def alerts_table(key: str, rows: list, tz: str) -> pd.DataFrame:
    """One ``/alerts`` section as a flat table: labels and annotations as ``k=v`` text,
    times in the wall time of ``tz``, a rule's samples as a count and its active ones; no
    nested JSON reaches the page."""
    flat: list[dict[str, Any]] = []
    for row in rows:
        if not isinstance(row, dict):
            flat.append({"value": str(row)})
            continue
        out: dict[str, Any] = {}
        for name, value in row.items():
            if name == "samples" and isinstance(value, list):
                out["series"] = len(value)
                out["active"] = sum(1 for v in value if isinstance(v, dict) and v.get("active"))
                reasons = sorted({str(v["reason"]) for v in value if isinstance(v, dict) and v.get("reason")})
                if reasons:
                    out["reason"] = "; ".join(reasons)
            elif isinstance(value, dict):
                out[name] = ", ".join(f"{k}={v}" for k, v in sorted(value.items()))
            elif isinstance(value, list):
                out[name] = ", ".join(str(v) for v in value)
            else:
                out[name] = value
        flat.append(out)
    table = pd.DataFrame(flat)
    for column in table.columns:
        if column in (
            "active_at",
            "fired_at",
            "keep_firing_since",
            "time",
            "timestamp",
            "at",
            "resolved_at",
            "changed_at",
        ):
            stamps = pd.to_datetime(table[column], utc=True, errors="coerce", format="ISO8601")
            if stamps.notna().any():
                shown = figures.wall_time(stamps, tz)
                table[column] = shown.dt.strftime("%Y-%m-%d %H:%M:%S").fillna("")
    return table
