"""Per-minute rollup of hop overheads, so the Breakdown page's hop table stays fast over days.

A hop's overhead is the caller's CLIENT span duration minus the callee's SERVER span
duration of the same call (DESIGN.md §3): the server span whose ``ParentSpanId`` is the
client span's ``SpanId`` in the same trace. A pair counts when the server span starts within
:data:`HOP_SLACK` of the client span's start (either side: clocks of two hosts disagree a
little); the call belongs to the minute (and window) in which its client span starts.
Every (client, server) pair counts, so a span exported twice counts twice, as the join of
the definition does.

``inferpath_hops_1m`` (schema 010) holds, per (minute, caller service, callee service,
callee span name), the pair count, the integer sum of the overheads (ns) and a DDSketch
of them (ClickHouse ``quantilesDD`` at :data:`~inferpath.storage.rollup.RELATIVE_ACCURACY`,
0.5 %: a quantile read from merged minutes is within 0.5 % of a value of that rank; it
keeps negative values, which clock skew produces, in a store of their own). Counts and
means from the rollup are exact.

Maintenance (:func:`refresh_hops`): spans of a trace keep arriving after its first minute
(late or re-sent exports), and each arrival re-derives the trace's request row
(``updated_at``). A pass takes the traces whose request row changed since its watermark,
the minutes their spans cover (``otel_traces_trace_id_ts``: first and last span start per
trace), and rebuilds those minutes from ``otel_traces``; then moves its own watermark
(``inferpath_rollup_state``, row :data:`HOP_STATE_NAME`). The first pass (no watermark)
rebuilds every minute holding a CLIENT span. Traces that never get a request row (spans
written by the OpenTelemetry Collector straight into ClickHouse) are not seen: exact reads
(windows shorter than the rollup threshold) still cover them.

Reads (:func:`hop_plan`, :func:`hop_aggregate`): whole minutes of the window before the
horizon (the watermark floored to the minute) come from the rollup, the ragged edges and
the recent minutes are paired from raw spans and sketched in the same query. The Breakdown
view reads through :func:`hop_overhead_view`: the rollup for wide windows, else the exact
pairing of raw spans (:func:`hop_overhead_rows`), which also serves service / model /
replica filters (the rollup holds no request columns).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from inferpath.storage.reader import VIEW_QUANTILES, _seconds, row_filter_sql
from inferpath.storage.rollup import (
    DEFAULT_MARGIN_SECONDS,
    RELATIVE_ACCURACY,
    STATE_TABLE,
    RefreshResult,
    WindowPlan,
    _latest_rebuild,
    _param,
    _runs,
    plan_window,
)

HOP_TABLE = "inferpath_hops_1m"
HOP_STATE_NAME = "inferpath_hops_rollup_v1"
"""The hop refresher's row in the state table; a change to what the rollup holds gets a new
name, so the first pass after an upgrade rebuilds every minute."""
HOP_SLACK = timedelta(minutes=1)
"""How far apart (either way) a client span's start and its server span's start may be for
the two to pair: covers network time before the server starts and clock skew between hosts,
and bounds how far past a window's edges its spans are read."""
HOP_QUANTILE_LEVELS: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)
"""The levels stored in the sketch's type (the same as the request rollups')."""
MAX_TRACE_MINUTES = 1440
"""A trace whose spans span more than a day rebuilds only its first day's minutes (bounds a pass)."""
_SKETCH_ARGS = f"{RELATIVE_ACCURACY}, {', '.join(str(q) for q in HOP_QUANTILE_LEVELS)}"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def pairs_sql(start: str, end: str, trace_condition: str = "") -> str:
    """SQL FROM-clause body: every (CLIENT span starting in ``[start, end)``, SERVER span of
    the same call starting within :data:`HOP_SLACK` of it) pair, with columns ``client_ts``,
    ``caller``, ``callee``, ``callee_span`` and ``overhead`` (client − server duration, ns,
    Int64). ``start``/``end`` are DateTime64 placeholders; ``{slack_ns:Int64}`` is bound.
    ``trace_condition``: SQL (placeholders only) ANDed onto the client spans' condition,
    e.g. ``TraceId IN (...)``, to keep some traces' calls."""
    extra = f" AND {trace_condition}" if trace_condition else ""
    slack = "toIntervalNanosecond({slack_ns:Int64})"
    return (
        "(SELECT c.Timestamp AS client_ts, c.ServiceName AS caller, s.ServiceName AS callee,"
        " s.SpanName AS callee_span, c.dur - s.dur AS overhead"
        " FROM (SELECT Timestamp, TraceId, SpanId, ServiceName, toInt64(Duration) AS dur FROM otel_traces"
        f"  WHERE SpanKind = 'Client' AND Timestamp >= {start} AND Timestamp < {end}{extra}) AS c"
        " INNER JOIN (SELECT Timestamp, TraceId, ParentSpanId, ServiceName, SpanName,"
        "  toInt64(Duration) AS dur FROM otel_traces WHERE SpanKind = 'Server'"
        f"  AND Timestamp >= {start} - {slack} AND Timestamp < {end} + {slack}) AS s"
        " ON s.TraceId = c.TraceId AND s.ParentSpanId = c.SpanId"
        f" WHERE s.Timestamp >= c.Timestamp - {slack} AND s.Timestamp < c.Timestamp + {slack})"
    )


def _slack_ns() -> int:
    return int(HOP_SLACK.total_seconds() * 1e9)


# ----------------------------------------------------------------------------- refresh
def hop_watermark(store) -> datetime | None:
    """The hop refresher's watermark (aware UTC), ``None`` before its first pass."""
    rows = store.query(
        f"SELECT max(watermark), count() FROM {STATE_TABLE} WHERE name = {{name:String}}", {"name": HOP_STATE_NAME}
    )
    return rows[0][0] if rows and rows[0][1] else None


def hop_horizon(store) -> datetime | None:
    """Start of the first minute the hop rollup may not cover yet (the watermark floored to
    the minute), ``None`` before the first pass."""
    mark = hop_watermark(store)
    return None if mark is None else mark.replace(second=0, microsecond=0)


def _changed_minutes(store, since: datetime | None) -> list[datetime]:
    if since is None:
        sql = "SELECT DISTINCT toStartOfMinute(Timestamp) FROM otel_traces WHERE SpanKind = 'Client'"
        return [row[0] for row in store.query(sql)]
    # Every minute from the first to the last span start of each trace whose row changed.
    sql = (
        "SELECT DISTINCT first + 60 * arrayJoin(range(toUInt64(least(dateDiff('minute', first,"
        " toStartOfMinute(last)), {max_minutes:UInt32}) + 1))) FROM (SELECT TraceId,"
        " toStartOfMinute(min(Start)) AS first, max(End) AS last FROM otel_traces_trace_id_ts"
        " WHERE TraceId IN (SELECT trace_id FROM inferpath_requests"
        "  WHERE updated_at >= {since:DateTime64(9, 'UTC')}) GROUP BY TraceId)"
    )
    return [row[0] for row in store.query(sql, {"since": since, "max_minutes": MAX_TRACE_MINUTES - 1})]


def refresh_hops(
    store,
    *,
    now: datetime | None = None,
    margin_seconds: float = DEFAULT_MARGIN_SECONDS,
    max_minutes_per_insert: int = 60,
) -> RefreshResult:
    """Rebuild the hop-rollup minutes holding spans of traces whose request row changed since
    the watermark (every minute with a CLIENT span on the first pass).

    ``now``: aware wall-clock time of the pass (default: now); the new watermark is
    ``now - margin_seconds`` (a request row stamped up to that long before it became
    visible is still found next pass). Minutes are rebuilt in runs of at most
    ``max_minutes_per_insert`` (one bounded INSERT … SELECT each, on a store connection
    of its own: ingest does not wait for it). Driver errors propagate and leave the watermark where it was.
    """
    started = time.monotonic()
    pass_time = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    since = hop_watermark(store)
    minutes = _changed_minutes(store, since)
    for run_start, run_end in _runs(minutes, max_minutes_per_insert):
        store.command(
            f"INSERT INTO {HOP_TABLE} SELECT toStartOfMinute(client_ts) AS minute, caller, callee,"
            f" callee_span, count(), sum(overhead), quantilesDDState({_SKETCH_ARGS})(overhead),"
            " now64(9, 'UTC') FROM "
            + pairs_sql("{start:DateTime64(9, 'UTC')}", "{end:DateTime64(9, 'UTC')}")
            + " GROUP BY minute, caller, callee, callee_span",
            {"start": run_start, "end": run_end, "slack_ns": _slack_ns()},
        )
    mark = pass_time - timedelta(seconds=margin_seconds)
    if since is not None:
        mark = max(since, mark)
    store.command(
        f"INSERT INTO {STATE_TABLE} (name, watermark, updated_at) VALUES"
        " ({name:String}, {mark:DateTime64(9, 'UTC')}, now64(9, 'UTC'))",
        {"name": HOP_STATE_NAME, "mark": mark},
    )
    return RefreshResult(minutes=len(minutes), seconds=time.monotonic() - started, watermark=mark)


# ----------------------------------------------------------------------------- reads
def hop_plan(store, start: datetime, end: datetime, *, min_window_seconds: float | None) -> WindowPlan | None:
    """How ``[start, end)`` (aware) splits between the hop rollup and raw spans, or ``None``
    for an exact read: rollups off (``min_window_seconds`` None), a window shorter than
    ``min_window_seconds``, no pass yet, or no whole minute before the horizon."""
    if min_window_seconds is None or (end - start).total_seconds() < min_window_seconds:
        return None
    plan = plan_window(start, end, hop_horizon(store), hourly=False)
    return plan if plan.rollup is not None else None


def hop_aggregate(store, plan: WindowPlan, levels: Sequence[float]) -> list[tuple[Any, ...]]:
    """Per (caller service, callee service, callee span name), ordered by them: ``(caller,
    callee, callee_span, count, mean overhead ns, [quantiles ns at levels])`` over the
    planned window; counts and means exact, quantiles from merged DDSketches (within
    :data:`~inferpath.storage.rollup.RELATIVE_ACCURACY` of a value of that rank).
    ``levels``: a subset of :data:`HOP_QUANTILE_LEVELS` (``ValueError`` otherwise)."""
    unknown = [q for q in levels if q not in HOP_QUANTILE_LEVELS]
    if unknown:
        raise ValueError(f"levels: {unknown} not among the stored levels {HOP_QUANTILE_LEVELS}")
    params: dict[str, Any] = {"slack_ns": _slack_ns()}
    parts = []
    for index, (_, a, b) in enumerate(plan.tiers):
        params[f"r{index}_start"], params[f"r{index}_end"] = a, b
        parts.append(
            "SELECT caller_service AS caller, callee_service AS callee, callee_span, calls,"
            f" overhead_sum_ns, overhead_q FROM {HOP_TABLE} WHERE "
            + _latest_rebuild(HOP_TABLE, "minute", _param(f"r{index}_start"), _param(f"r{index}_end"))
        )
    for index, (a, b) in enumerate(plan.raw):
        params[f"a{index}"], params[f"b{index}"] = a, b
        parts.append(
            f"SELECT caller, callee, callee_span, count() AS calls, sum(overhead) AS overhead_sum_ns,"
            f" quantilesDDState({_SKETCH_ARGS})(overhead) AS overhead_q FROM "
            + pairs_sql(f"{{a{index}:DateTime64(9, 'UTC')}}", f"{{b{index}:DateTime64(9, 'UTC')}}")
            + " GROUP BY caller, callee, callee_span"
        )
    sql = (
        f"SELECT caller, callee, callee_span, sum(calls), sum(overhead_sum_ns),"
        f" quantilesDDMerge({_SKETCH_ARGS})(overhead_q) FROM ({' UNION ALL '.join(parts)})"
        " GROUP BY caller, callee, callee_span HAVING sum(calls) > 0"
        " ORDER BY caller, callee, callee_span"
    )
    positions = [HOP_QUANTILE_LEVELS.index(q) for q in levels]
    return [
        (caller, callee, span, int(count), int(total) / int(count), [float(quantiles[i]) for i in positions])
        for caller, callee, span, count, total, quantiles in store.query(sql, params)
    ]


# ----------------------------------------------------------------------------- the hop view
HOP_TRACE_LOOKBACK = timedelta(hours=1)
"""How long before a window a filtered hop view looks for the requests whose calls it keeps
(a request's row is stamped with its start; its calls follow)."""


def _hop_trace_condition(start: datetime, end: datetime, columns: dict[str, str] | None, params: dict) -> str:
    """``TraceId IN (...)`` keeping the traces whose request row (stamped from
    ``start - HOP_TRACE_LOOKBACK`` to ``end``) matches ``columns``; ``""`` without filters."""
    if not columns:
        return ""
    params["hop_requests_start"] = start - HOP_TRACE_LOOKBACK
    params["hop_requests_end"] = end
    return (
        "TraceId IN (SELECT trace_id FROM inferpath_requests FINAL"
        " WHERE timestamp >= {hop_requests_start:DateTime64(9, 'UTC')}"
        " AND timestamp < {hop_requests_end:DateTime64(9, 'UTC')}" + row_filter_sql(columns, params) + ")"
    )


def hop_overhead_rows(store, start: datetime, end: datetime, *, columns: dict[str, str] | None = None) -> list[dict]:
    """Overhead of each hop: caller's CLIENT span − callee's SERVER span of the same call
    (DESIGN.md's definition; pairing as this module defines it: the server span starts
    within :data:`HOP_SLACK` of the client span), per (caller service, callee service,
    callee span name), ordered by them: dicts with ``caller_service``, ``callee_service``,
    ``callee_span``, ``count``, ``avg_seconds``, ``p50_seconds``, ``p95_seconds``,
    ``p99_seconds`` (exact). Calls whose client span starts in the window.

    One pass groups the window's CLIENT and SERVER spans by call (trace, client span id =
    server parent id), which is about twice as fast as joining the two sets over a day of
    spans. When any call holds more than one client or server span (a span exported twice,
    a retried call), the exact pairs of the join (:func:`hop_overhead_rows_joined`) are
    taken instead, so the answer is the join's either way.

    ``columns``: service / model / replica filters on the request row
    (:func:`~inferpath.storage.reader.row_filters`): only the calls of traces whose request
    matches (request stamped at most :data:`HOP_TRACE_LOOKBACK` before the window)."""
    parameters: dict = {
        "start": start,
        "end": end,
        "slack_start": start - HOP_SLACK,
        "slack_end": end + HOP_SLACK,
        "slack_ns": _slack_ns(),
    }
    trace_condition = _hop_trace_condition(start, end, columns, parameters)
    trace_sql = f" AND {trace_condition}" if trace_condition else ""
    calls_sql = (
        "SELECT caller, callee, callee_span, count(), avg(overhead),"
        f" quantilesExactInclusive{VIEW_QUANTILES}(overhead), max(clients * servers)"
        " FROM (SELECT countIf(is_client) AS clients, countIf(is_server) AS servers,"
        "  anyIf(ServiceName, is_client) AS caller, anyIf(ServiceName, is_server) AS callee,"
        "  anyIf(SpanName, is_server) AS callee_span,"
        "  anyIf(dur, is_client) - anyIf(dur, is_server) AS overhead,"
        "  anyIf(ts_ns, is_server) - anyIf(ts_ns, is_client) AS lag_ns"
        "  FROM (SELECT TraceId, SpanId, ParentSpanId, SpanKind, ServiceName, SpanName,"
        "   toInt64(Duration) AS dur, toUnixTimestamp64Nano(Timestamp) AS ts_ns,"
        "   SpanKind = 'Client' AND Timestamp >= {start:DateTime64(9, 'UTC')}"
        "   AND Timestamp < {end:DateTime64(9, 'UTC')} AS is_client, SpanKind = 'Server' AS is_server"
        "   FROM otel_traces WHERE SpanKind IN ('Client', 'Server')"
        "   AND Timestamp >= {slack_start:DateTime64(9, 'UTC')} AND Timestamp < {slack_end:DateTime64(9, 'UTC')}"
        + trace_sql
        + ")"
        "  GROUP BY TraceId, if(SpanKind = 'Client', SpanId, ParentSpanId)"
        # One pair: it counts when the server starts within the slack of the client; more
        # than one: the join below decides pair by pair.
        "  HAVING clients >= 1 AND servers >= 1 AND (clients * servers > 1"
        "   OR (lag_ns >= -{slack_ns:Int64} AND lag_ns < {slack_ns:Int64})))"
        " GROUP BY caller, callee, callee_span ORDER BY caller, callee, callee_span"
    )
    rows = store.query(calls_sql, parameters)
    if all(int(row[-1]) == 1 for row in rows):
        return [_hop_row(*row[:-1]) for row in rows]
    return hop_overhead_rows_joined(store, start, end, columns=columns)


def hop_overhead_rows_joined(
    store, start: datetime, end: datetime, *, columns: dict[str, str] | None = None
) -> list[dict]:
    """:func:`hop_overhead_rows` by joining every CLIENT span of the window with its callee's
    SERVER spans (:func:`pairs_sql`): the definition, counting each (client, server) pair."""
    parameters: dict = {"start": start, "end": end, "slack_ns": _slack_ns()}
    trace_condition = _hop_trace_condition(start, end, columns, parameters)
    sql = (
        f"SELECT caller, callee, callee_span, count(), avg(overhead),"
        f" quantilesExactInclusive{VIEW_QUANTILES}(overhead) FROM "
        + pairs_sql("{start:DateTime64(9, 'UTC')}", "{end:DateTime64(9, 'UTC')}", trace_condition)
        + " GROUP BY caller, callee, callee_span ORDER BY caller, callee, callee_span"
    )
    return [_hop_row(*row) for row in store.query(sql, parameters)]


def hop_overhead_view(
    store,
    start: datetime,
    end: datetime,
    *,
    rollup_min_window_seconds: float | None = None,
    columns: dict[str, str] | None = None,
) -> tuple[list[dict], str]:
    """``(rows, percentiles)``: :func:`hop_overhead_rows` (``"exact"``) for windows shorter
    than ``rollup_min_window_seconds`` (or with it ``None``, or before the hop rollup's first
    pass), else the same rows from the per-minute hop rollup (:func:`hop_plan`,
    :func:`hop_aggregate`) with the window's ragged edges and recent minutes paired from raw
    spans (``"ddsketch"``: counts and means exact, percentiles within 0.5 % of a value of
    that rank). With ``columns`` (service / model / replica filters) always the raw spans
    (``"exact"``): the hop rollup holds no request columns."""
    plan = None if columns else hop_plan(store, start, end, min_window_seconds=rollup_min_window_seconds)
    if plan is None:
        return hop_overhead_rows(store, start, end, columns=columns), "exact"
    return [_hop_row(*row) for row in hop_aggregate(store, plan, VIEW_QUANTILES)], "ddsketch"


def _hop_row(caller: str, callee: str, span: str, count: int, avg_ns: float, quantiles: list) -> dict:
    """One row of the hop view from ``(caller, callee, callee_span, count, mean ns,
    [p50, p95, p99 ns])``: durations in seconds (``None`` for a NaN)."""
    return {
        "caller_service": caller,
        "callee_service": callee,
        "callee_span": span,
        "count": int(count),
        "avg_seconds": _seconds(avg_ns),
        **{f"{q}_seconds": _seconds(v) for q, v in zip(("p50", "p95", "p99"), quantiles)},
    }


__all__ = [
    "HOP_SLACK",
    "HOP_STATE_NAME",
    "HOP_TABLE",
    "HOP_TRACE_LOOKBACK",
    "hop_aggregate",
    "hop_horizon",
    "hop_overhead_rows",
    "hop_overhead_rows_joined",
    "hop_overhead_view",
    "hop_plan",
    "hop_watermark",
    "pairs_sql",
    "refresh_hops",
]
