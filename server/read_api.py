"""The read API (``/api/v1/...``): what the dashboard, the CLI and alerts read through.

Times are ISO-8601 with a UTC offset (``2026-11-30T11:00:00Z``) or Unix seconds; the
window defaults to the last 15 minutes. Bad parameters answer 422 with FastAPI's error
shape, ``{"detail": [{"loc": ["query", "<param>"], "msg": "...", "type": "value_error"}]}``;
so does a parameter the endpoint does not know (a misspelt ``endpoint-class`` would
otherwise answer for every endpoint class, as if it had filtered).
Durations in request rows stay in nanoseconds (``*_ns``); summaries are in seconds.

The SQL lives in storage (:mod:`inferpath.storage.reader`, :mod:`inferpath.storage.hop_rollup`)
and analysis; this module parses parameters, answers 422s and shapes the JSON.
"""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from inferpath.server.otlp import MAX_METRIC_NAME_CHARS
from inferpath.server.services import ALERTS, AlertsService
from inferpath.storage.hop_rollup import hop_overhead_view
from inferpath.storage.reader import ROW_FILTERS, fleet_series_rows, gauge_step_rows, latency_view_points, row_filters
from inferpath.storage.rollup import WindowPlan
from inferpath.timespec import TimeOutOfRange, parse_instant
from inferpath.vocabulary import (
    BATCH_SIZE,
    GPU_MEMORY_TOTAL_BYTES,
    GPU_MEMORY_USED_BYTES,
    GPU_POWER_WATTS,
    GPU_UTILIZATION_RATIO,
    KV_CACHE_USAGE_RATIO,
    QUEUE_DEPTH,
    RUNNING_REQUESTS,
    SIGNALS,
)

if TYPE_CHECKING:  # imported where used, to keep the server's import light
    from inferpath.analysis.objectives import Objectives
    from inferpath.config import Settings

__all__ = ["router", "parse_time", "DEFAULT_WINDOW", "EARLIEST", "LATEST"]

DEFAULT_WINDOW = timedelta(minutes=15)
# Times a parameter may name (see parse_time).
EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(2100, 1, 1, tzinfo=timezone.utc)


def _invalid(param: str, message: str, where: str = "query") -> HTTPException:
    return _invalid_all([(param, message)], where)


def _invalid_all(problems: list[tuple[str, str]], where: str = "query") -> HTTPException:
    """422 in FastAPI's error shape, one entry per ``(parameter, message)``."""
    detail = [{"loc": [where, param], "msg": message, "type": "value_error"} for param, message in problems]
    return HTTPException(status_code=422, detail=detail)


def _query_param_names(dependant) -> set[str]:
    """Names (aliases) of the query parameters of a FastAPI ``Dependant`` and its dependencies."""
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_param_names(sub)
    return names


_KNOWN_PARAMS: dict[tuple[str, frozenset[str]], set[str]] = {}  # (path, methods) of a route → its query parameters


async def _reject_unknown_params(request: Request) -> None:
    """422 naming each query parameter the endpoint does not declare, and each one given more
    than once (else the last value would silently win: every parameter here takes one value)."""
    route = request.scope.get("route")
    if route is None:
        return
    key = (route.path, frozenset(route.methods or ()))
    if key not in _KNOWN_PARAMS:
        _KNOWN_PARAMS[key] = _query_param_names(route.dependant)
    names = _KNOWN_PARAMS[key]
    takes = ", ".join(sorted(names)) or "none"
    if unknown := sorted(set(request.query_params) - names):
        raise _invalid_all([(n, f"unknown query parameter {n!r}; this endpoint takes {takes}") for n in unknown])
    given = {name: len(request.query_params.getlist(name)) for name in names}
    if repeated := sorted(name for name, times in given.items() if times > 1):
        raise _invalid_all(
            [(n, f"query parameter {n!r} is given {given[n]} times; it takes one value") for n in repeated]
        )


router = APIRouter(prefix="/api/v1", tags=["read"], dependencies=[Depends(_reject_unknown_params)])


def parse_time(value: str | None, param: str, *, where: str = "query") -> datetime | None:
    """Parse ISO-8601 with offset (``Z`` allowed) or Unix seconds into an aware UTC datetime
    (:func:`inferpath.timespec.parse_instant`); ``None``/empty gives ``None``.

    Raises ``HTTPException(422)`` naming ``param`` (located in ``where``: ``query``, or
    ``body`` for a JSON field) for a naive or unparsable time, or one outside
    ``[EARLIEST, LATEST]``: the store holds nothing outside, and the bound keeps window
    arithmetic clear of the limits of datetime and ClickHouse's ``DateTime64``.
    """
    if value is None or not value.strip():
        return None
    text, unit_hint = value.strip(), ""
    try:
        parsed: datetime | None = parse_instant(text)
    except TimeOutOfRange as exc:
        parsed = None
        if "this looks like" in str(exc):  # a Unix time in ms/µs/ns: say which
            unit_hint = "; " + str(exc).split(" is out of range: ", 1)[-1]
    except ValueError as exc:
        hint = ""
        if re.fullmatch(r".*T.*\d \d{2}:?\d{2}", value):  # "+00:00" sent unencoded: a query string reads + as a space
            hint = "; a '+' in a query string must be sent as %2B (or give the time in UTC with Z)"
        raise _invalid(param, f"{param}: {exc}{hint}", where) from None
    if parsed is None or not EARLIEST <= parsed <= LATEST:
        bounds = f"times from {EARLIEST.isoformat()} to {LATEST.isoformat()}"
        raise _invalid(param, f"{param} is out of range: {text!r} ({bounds}){unit_hint}", where)
    return parsed


def _window(start: str | None, end: str | None) -> tuple[datetime, datetime]:
    """The window of ``start``/``end`` (default: the 15 minutes before ``end``, ``end``
    defaulting to now, as ``inferpath diagnose``); 422 naming the parameter when one is
    malformed or the window reversed."""
    start_dt, end_dt = parse_time(start, "start"), parse_time(end, "end")
    now = datetime.now(timezone.utc)
    if end_dt is None and start_dt is not None and start_dt >= now:  # as the CLI says it
        raise _invalid("start", f"start {start_dt.isoformat()} is in the future: no data can be in the window")
    end_dt = end_dt or now
    start_dt = start_dt or max(EARLIEST, end_dt - DEFAULT_WINDOW)
    if end_dt <= start_dt:
        raise _invalid("end", f"end must be after start (start={start_dt.isoformat()}, end={end_dt.isoformat()})")
    return start_dt, end_dt


async def _read(call, *args, **kwargs):
    """Run a blocking Reader call off the event loop; ValueError → 422 naming the argument."""
    try:
        return await run_in_threadpool(call, *args, **kwargs)
    except ValueError as exc:
        # Reader messages start with the argument's name ("step_seconds=1 gives …", "end must …").
        match = re.match(r"[A-Za-z_][A-Za-z0-9_]*", str(exc))
        raise _invalid(match.group(0) if match else "query", str(exc)) from None


def _row_filters(
    service: str | None = Query(
        None, description="Only requests of this service (the row's service_name), exact match."
    ),
    model: str | None = Query(None, description="Only requests of this model, exact match."),
    replica: str | None = Query(None, description="Only requests served by this replica, exact match."),
) -> dict[str, str]:
    """The ``service`` / ``model`` / ``replica`` query parameters as column → value; 422
    naming the parameter for an empty value or one over 256 characters."""
    columns: dict[str, str] = {}
    for name, value in (("service", service), ("model", model), ("replica", replica)):
        try:
            columns.update(row_filters(**{name: value}))
        except ValueError as exc:
            raise _invalid(name, str(exc)) from None
    return columns


RowFilters = Annotated[dict[str, str], Depends(_row_filters)]
_FILTER_PARAMS = {column: name for name, column in ROW_FILTERS.items()}  # request-row column → its parameter

StartQuery = Query(None, description="Window start: ISO-8601 with offset or Unix seconds (default end − 15 min).")
EndQuery = Query(None, description="Window end: ISO-8601 with offset or Unix seconds (default now).")


@router.get("/summary")
async def summary(
    request: Request,
    columns: RowFilters,
    start: str | None = StartQuery,
    end: str | None = EndQuery,
    endpoint: str | None = None,
    endpoint_class: str | None = None,
) -> dict:
    """Latency summary per measure (count, mean, p50, p95, p99 in seconds) over the window.

    ``percentiles`` says how they were computed: ``exact``, or ``ddsketch`` (merged per-minute
    sketches, within 0.5 % of a value of that rank) for windows of at least
    ``INFERPATH_ROLLUP_MIN_WINDOW_SECONDS``; counts and means are exact either way. Filtered
    by ``service``, ``model`` or ``replica`` (exact match), the raw rows are read whatever the
    window (``exact``): the rollups hold none of those columns."""
    start_dt, end_dt = _window(start, end)
    reader = request.app.state.runtime.reader
    filters = {"endpoint": endpoint, "endpoint_class": endpoint_class, "columns": columns}
    body = await _read(reader.summary, start_dt, end_dt, **filters)
    return {"start": start_dt, "end": end_dt, "endpoint": endpoint, "endpoint_class": endpoint_class, **body}


@router.get("/requests")
async def requests_(
    request: Request,
    columns: RowFilters,
    start: str | None = StartQuery,
    end: str | None = EndQuery,
    endpoint: str | None = None,
    endpoint_class: str | None = None,
    limit: int = Query(100, ge=1, le=10_000),
    order: Literal["timestamp", "slowest"] = "timestamp",
) -> dict:
    """Request rows in the window (durations in ns), newest first or slowest first;
    ``service``, ``model``, ``replica``: exact-match filters on the row."""
    start_dt, end_dt = _window(start, end)
    reader = request.app.state.runtime.reader
    filters = {"endpoint": endpoint, "endpoint_class": endpoint_class, "columns": columns}
    rows = await _read(reader.requests, start_dt, end_dt, **filters, limit=limit, order=order)
    return {"start": start_dt, "end": end_dt, "requests": rows}


@router.get("/requests/count")
async def requests_count(
    request: Request,
    columns: RowFilters,
    start: str | None = StartQuery,
    end: str | None = EndQuery,
    endpoint: str | None = None,
    endpoint_class: str | None = None,
) -> dict:
    """Number of requests in the window (``service``, ``model``, ``replica``: exact-match
    filters on the row)."""
    start_dt, end_dt = _window(start, end)
    reader = request.app.state.runtime.reader
    filters = {"endpoint": endpoint, "endpoint_class": endpoint_class, "columns": columns}
    count = await _read(reader.request_count, start_dt, end_dt, **filters)
    return {"start": start_dt, "end": end_dt, "count": count}


@router.get("/timeseries/ttft")
async def ttft_timeseries(
    request: Request,
    start: str | None = StartQuery,
    end: str | None = EndQuery,
    step_seconds: int = Query(60, ge=1, le=86_400),
    endpoint_class: str | None = None,
) -> dict:
    """TTFT per time bucket and endpoint class (seconds)."""
    start_dt, end_dt = _window(start, end)
    reader = request.app.state.runtime.reader
    points = await _read(
        reader.ttft_timeseries, start_dt, end_dt, step_seconds=step_seconds, endpoint_class=endpoint_class
    )
    return {"start": start_dt, "end": end_dt, "step_seconds": step_seconds, "points": points}


@router.get("/timeseries/gauge")
async def gauge_timeseries(
    request: Request,
    metric: str = Query(..., min_length=1, max_length=MAX_METRIC_NAME_CHARS),
    start: str | None = StartQuery,
    end: str | None = EndQuery,
    step_seconds: int = Query(60, ge=1, le=86_400),
) -> dict:
    """Mean of one gauge (canonical signal name) per bucket, service and attribute set."""
    start_dt, end_dt = _window(start, end)
    reader = request.app.state.runtime.reader
    points = await _read(reader.gauge_timeseries, metric, start_dt, end_dt, step_seconds=step_seconds)
    return {"metric": metric, "start": start_dt, "end": end_dt, "step_seconds": step_seconds, "points": points}


@router.get("/traces/{trace_id}")
async def trace(
    request: Request, trace_id: str = Path(..., pattern="^[0-9a-fA-F]{32}$", description="32 hex digits")
) -> dict:
    """All spans of one trace, ordered by start; 404 when the trace is unknown."""
    spans = await _read(request.app.state.runtime.reader.trace_spans, trace_id)
    if not spans:
        raise HTTPException(status_code=404, detail=f"trace {trace_id.lower()} not found")
    out = [{**dataclasses.asdict(span), "start_ns": span.start_ns, "end_ns": span.end_ns} for span in spans]
    return {"trace_id": trace_id.lower(), "spans": out}


@router.get("/diagnosis")
async def diagnosis(
    request: Request,
    columns: RowFilters,
    start: str | None = StartQuery,
    end: str | None = EndQuery,
    baseline_start: str | None = Query(None, description="Baseline start (optional; give baseline_end with it)."),
    baseline_end: str | None = Query(None, description="Baseline end (optional)."),
    endpoint: str | None = None,
    endpoint_class: str | None = None,
    ttft_p99_seconds: float | None = Query(
        None,
        gt=0,
        le=3600,
        description="TTFT p99 objective for every endpoint class (default: the objectives file, else 1 s "
        "interactive / 10 s bulk).",
    ),
    itl_p99_seconds: float | None = Query(
        None, gt=0, le=3600, description="ITL p99 objective for every endpoint class."
    ),
    objectives: str | None = Query(
        None,
        max_length=16_384,
        description='Objectives per endpoint class as JSON, the objectives file\'s shape, e.g. {"interactive": '
        '{"ttft_p99_seconds": 0.6}}.',
    ),
) -> dict:
    """The verdict for the window: healthy or not against the latency objectives per endpoint
    class, named causes with evidence, what would help; against the baseline too when given.

    422 naming the parameter when a window is reversed, starts in the future, has one
    baseline bound, or holds too few requests to judge (``insufficient data: N requests …``);
    404 for an endpoint with no requests stored. ``endpoint_class``, ``service``, ``model``,
    ``replica``: exact-match filters on the request rows judged (the engine signals stay every engine's).
    """
    from inferpath.analysis import diagnose, verdict_to_dict

    start_dt, end_dt = _window(start, end)
    if start_dt > datetime.now(timezone.utc):
        raise _invalid("start", f"start {start_dt.isoformat()} is in the future: no request can be in the window")
    base_start, base_end = parse_time(baseline_start, "baseline_start"), parse_time(baseline_end, "baseline_end")
    if (base_start is None) != (base_end is None):
        raise _invalid(
            "baseline_end" if base_end is None else "baseline_start",
            "give baseline_start and baseline_end together, or neither for a verdict against the objectives alone",
        )
    if base_start is not None and base_end is not None and base_end <= base_start:
        raise _invalid(
            "baseline_end",
            f"baseline_end must be after baseline_start (baseline_start="
            f"{base_start.isoformat()}, baseline_end={base_end.isoformat()})",
        )
    runtime = request.app.state.runtime
    chosen = runtime_objectives(runtime.settings) if objectives is None else _objectives_param(objectives)
    if ttft_p99_seconds is not None:
        chosen = chosen.with_limit("ttft", ttft_p99_seconds)
    if itl_p99_seconds is not None:
        chosen = chosen.with_limit("itl", itl_p99_seconds)
    if endpoint is not None and not await run_in_threadpool(runtime.reader.has_endpoint, endpoint):
        msg = f"no request of endpoint {endpoint!r} is stored"
        raise HTTPException(404, detail=[{"loc": ["query", "endpoint"], "type": "not_found", "msg": msg}])
    try:
        verdict = await run_in_threadpool(
            diagnose,
            runtime.store,
            window_start=start_dt,
            window_end=end_dt,
            baseline_start=base_start,
            baseline_end=base_end,
            endpoint=endpoint,
            endpoint_class=endpoint_class,
            columns=columns,
            objectives=chosen,
        )
    except ValueError as exc:  # InsufficientDataError included: name the window it is about
        window = getattr(exc, "window", "current")
        narrowed = {"endpoint_class": endpoint_class, **{_FILTER_PARAMS[c]: v for c, v in columns.items()}}
        narrowed = {name: value for name, value in narrowed.items() if value is not None}
        if getattr(exc, "count", None) == 0 and window == "current" and narrowed:
            # Nothing matched: the filters are what to change, not the window.
            said = ", ".join(f"{name} {value!r}" for name, value in narrowed.items())
            raise _invalid(
                next(iter(narrowed)),
                f"no request of {said} in the window: insufficient data to judge; "
                "check the value (exact match) or widen the window",
            ) from None
        raise _invalid("baseline_start" if window == "baseline" else "start", str(exc)) from None
    return verdict_to_dict(verdict)


def _objectives_param(text: str) -> Objectives:
    """The ``objectives`` query parameter (JSON in the objectives file's shape); 422 naming it."""
    from inferpath.analysis.objectives import objectives_from_mapping

    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid(
            "objectives",
            f"objectives must be JSON in the objectives file's shape, e.g. "
            f'{{"interactive": {{"ttft_p99_seconds": 0.6}}}}; it is not JSON ({exc})',
        ) from None
    try:
        return objectives_from_mapping(document, origin="objectives")
    except ValueError as exc:
        raise _invalid("objectives", str(exc)) from None


@router.get("/whatif")
async def whatif(
    request: Request,
    start: str = Query(..., description="Window start: ISO-8601 with offset or Unix seconds."),
    end: str = Query(..., description="Window end: ISO-8601 with offset or Unix seconds."),
    replicas: int | None = Query(
        None, ge=1, le=1024, description="Engines behind a round-robin gateway: an integer, 1-1024."
    ),
    max_num_seqs: int | None = Query(None, ge=1, le=65_536, description="Batch slots per engine: an integer, 1-65536."),
    kv_blocks: str | None = Query(
        None,
        max_length=32,
        description="KV blocks per engine: a count N (96, at least 1) or a factor xK / ×K of the calibrated "
        "pool (x2; above 0, at most 1000).",
    ),
    batch_window_ms: float | None = Query(
        None, ge=0, le=60_000, description="Hold the queue head this long for more requests to join its prefill."
    ),
    rate: str | None = Query(
        None,
        max_length=32,
        description="Arrival rate factor xK, ×K or K (x2: the window's pattern twice as dense); above 0, at most "
        "1000. A replay simulates at most 1,000,000 requests (the window's requests times K): more is refused.",
    ),
    split_endpoint_classes: str | None = Query(
        None,
        max_length=200,
        description="Each endpoint class on engines of its own: CLASS=REPLICAS,... e.g. interactive=2,bulk=1 "
        "(at most 1024 replicas in all).",
    ),
    max_calibration_error: float = Query(
        0.30, gt=0, le=10, description="Refuse when the replay of the observed configuration is off by more than this."
    ),
    max_num_batched_tokens: int | None = Query(
        None,
        ge=1,
        le=1_048_576,
        description="The engine's prompt-token budget per step as configured (vLLM's --max-num-batched-tokens, "
        "not exported in its metrics); default the server's INFERPATH_ENGINE_MAX_NUM_BATCHED_TOKENS, else 2048, "
        "vLLM's default.",
    ),
    step_token_budget: int | None = Query(
        None,
        ge=1,
        le=1_048_576,
        description="The per-step token budget to predict (the change; vLLM's --max-num-batched-tokens).",
    ),
) -> dict:
    """Predict TTFT, queue time, ITL and KV usage per endpoint class under a changed engine
    configuration, from the window's own requests and engine signals, beside what was observed
    and beside the replay of the observed configuration (``analysis/whatif.py``).

    422 naming the parameter for a bad window or change (its message starts with the
    parameter's name), ``rate`` (or ``start``) when the replay would simulate more than
    1,000,000 requests, or ``start`` with a message starting "no prediction:" when the window
    cannot be calibrated (no engine spans, too few requests) or the replay is off by more than
    ``max_calibration_error``. Each entry's ``ctx.template`` is its message with every
    parameter it names as a ``{name}`` field (how the CLI names its options instead).
    """
    from inferpath.analysis.whatif import (
        API_NAMES,
        NO_PREDICTION,
        WhatIfInputError,
        WhatIfRefused,
        parse_change,
        predict,
        what_if_to_dict,
    )

    start_dt, end_dt = _window(start, end)
    runtime = request.app.state.runtime
    try:
        change = parse_change(
            replicas=replicas,
            max_num_seqs=max_num_seqs,
            kv_blocks=kv_blocks,
            batch_window_ms=batch_window_ms,
            rate=rate,
            split_endpoint_classes=split_endpoint_classes,
            step_token_budget=step_token_budget,
        )
        answer = await run_in_threadpool(
            predict,
            runtime.store,
            start_dt,
            end_dt,
            change,
            max_error=max_calibration_error,
            max_num_batched_tokens=max_num_batched_tokens or runtime.settings.engine_max_num_batched_tokens,
        )
    except WhatIfRefused as exc:
        if isinstance(exc, WhatIfInputError):
            param, template = exc.param, exc.template
        else:
            param, template = "start", f"{NO_PREDICTION}: {exc.template}"
        detail = {"loc": ["query", param], "msg": template.format_map(API_NAMES), "type": "value_error"}
        raise HTTPException(status_code=422, detail=[detail | {"ctx": {"template": template}}]) from None
    return what_if_to_dict(answer)


def runtime_objectives(settings: Settings) -> Objectives:
    """The objectives of ``settings.objectives_file`` (defaults when unset); 500 naming the
    file when it is invalid."""
    from inferpath.analysis.objectives import load_objectives

    try:
        return load_objectives(settings.objectives_file)
    except ValueError as exc:
        raise HTTPException(status_code=500, detail=f"the server's objectives file is invalid: {exc}") from None


@router.post("/flush")
async def flush(request: Request, timeout_seconds: float = Query(30.0, gt=0, le=300)) -> dict:
    """Insert every accepted span and data point, assemble every noted trace, insert those
    rows; returns insert counters and ``ok`` (False on timeout or failed inserts)."""
    return await run_in_threadpool(request.app.state.runtime.flush, timeout_seconds)


# ---------------------------------------------------------------------------- dashboard views
# Read-only views that each answer one dashboard page in one call. Every time series here is
# downsampled on the server: the step grows until the window holds at most ``max_points``
# buckets (≤ VIEW_MAX_POINTS), so no plotted series exceeds ~10k points whatever the window.

VIEW_MAX_POINTS = 10_000
"""Upper bound on buckets per series in a view: more than a wide screen has pixels."""

MaxPointsQuery = Query(
    600, ge=1, le=VIEW_MAX_POINTS, description="Most buckets per series; the step grows to stay under it."
)
StepQuery = Query(None, ge=1, le=86_400, description="Smallest bucket width in seconds.")


def view_step_seconds(start: datetime, end: datetime, step_seconds: int | None, max_points: int) -> int:
    """Bucket width in whole seconds for ``[start, end)``: ``step_seconds`` (default 1),
    widened to ``ceil(duration / max_points)`` so the window has at most ``max_points``
    buckets. Raises ``ValueError`` for ``max_points`` < 1."""
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    duration_seconds = (end - start).total_seconds()
    return max(int(step_seconds or 1), int(-(-duration_seconds // max_points)), 1)


@router.get("/views/latency")
async def latency_view(
    request: Request,
    columns: RowFilters,
    start: str | None = StartQuery,
    end: str | None = EndQuery,
    endpoint_class: str | None = None,
    step_seconds: int | None = StepQuery,
    max_points: int = MaxPointsQuery,
) -> dict:
    """Overview: per bucket and endpoint class, requests, errors and TTFT / ITL / E2E
    mean, p50, p95, p99 (seconds); ``step_seconds`` is the width actually used. Filtered by
    ``service``, ``model`` or ``replica`` (exact match), the raw rows are read whatever the
    window (``percentiles``: ``exact``): the rollups hold none of those columns."""
    start_dt, end_dt = _window(start, end)
    step = view_step_seconds(start_dt, end_dt, step_seconds, max_points)
    runtime = request.app.state.runtime
    plan: WindowPlan | None = None
    if not columns:
        step, plan = await _read(runtime.reader.latency_view_plan, start_dt, end_dt, step)
    points = await _read(
        latency_view_points,
        runtime.store,
        start_dt,
        end_dt,
        step_seconds=step,
        endpoint_class=endpoint_class,
        plan=plan,
        columns=columns,
    )
    percentiles = "exact" if plan is None else "ddsketch"
    return {"start": start_dt, "end": end_dt, "step_seconds": step, "percentiles": percentiles, "points": points}


def _utc(unix_ns: int) -> datetime:
    return datetime.fromtimestamp(unix_ns / 1e9, tz=timezone.utc)


def correlate_view_body(
    store,
    start: datetime,
    end: datetime,
    *,
    step_seconds: int,
    endpoint: str | None = None,
    endpoint_class: str | None = None,
    columns: dict[str, str] | None = None,
) -> dict:
    """The correlation timeline (:func:`inferpath.analysis.correlate.fetch_timeline`) as
    JSON rows with a ``time`` per step, plus the TTFT p99 spike windows
    (:func:`~inferpath.analysis.correlate.detect_spikes`). Signals are combined across
    engines and GPUs as the analysis defines (queue summed, KV usage max, utilization mean);
    ``endpoint_class`` and ``columns`` filter the request rows only."""
    from inferpath.analysis.correlate import SPIKE_FACTOR, detect_spikes, fetch_timeline

    timeline = fetch_timeline(
        store,
        start=start,
        end=end,
        step_seconds=float(step_seconds),
        endpoint=endpoint,
        endpoint_class=endpoint_class,
        columns=columns,
    )
    points = [{"time": _utc(row.pop("step_start_ns")), **row} for row in timeline.rows()]
    spikes = detect_spikes(timeline.step_start_ns, timeline.columns["ttft_p99_seconds"], timeline.step_seconds)
    return {
        "columns": list(timeline.columns),
        "spike_factor": SPIKE_FACTOR,
        "points": points,
        "spikes": [
            {
                "start": _utc(s.start_ns),
                "end": _utc(s.end_ns),
                "peak_seconds": s.peak,
                "baseline_seconds": s.baseline,
                "ratio": s.ratio,
            }
            for s in spikes
        ],
    }


@router.get("/views/correlate")
async def correlate_view(
    request: Request,
    columns: RowFilters,
    start: str | None = StartQuery,
    end: str | None = EndQuery,
    endpoint: str | None = None,
    endpoint_class: str | None = None,
    step_seconds: int | None = StepQuery,
    max_points: int = MaxPointsQuery,
) -> dict:
    """Correlate: TTFT p99 and mean per step beside queue depth, running requests, KV-cache
    usage, preemptions per second, GPU utilization and memory; detected TTFT spikes.
    ``endpoint_class``, ``service``, ``model``, ``replica`` filter the requests (exact match);
    the engine and GPU signals stay every engine's."""
    start_dt, end_dt = _window(start, end)
    step = view_step_seconds(start_dt, end_dt, step_seconds, max_points)
    filters = {"endpoint": endpoint, "endpoint_class": endpoint_class, "columns": columns}
    store = request.app.state.runtime.store
    body = await _read(correlate_view_body, store, start_dt, end_dt, step_seconds=step, **filters)
    return {"start": start_dt, "end": end_dt, "step_seconds": step, **body}


def breakdown_view_body(
    store,
    start: datetime,
    end: datetime,
    *,
    endpoint_class: str | None = None,
    rollup_min_window_seconds: float | None = None,
    columns: dict[str, str] | None = None,
) -> dict:
    """Stage shares of TTFT and E2E per percentile band
    (:func:`inferpath.analysis.breakdown.breakdown_by_band`, ``*_ns`` means and ratios, exact)
    over the ``ok`` requests of the window, computed inside the store
    (:func:`inferpath.analysis.band_query.fetch_breakdown_bands`), and the hop overheads
    (:func:`~inferpath.storage.hop_rollup.hop_overhead_view`; ``hop_percentiles`` says
    ``exact`` or ``ddsketch``). ``columns``: service / model / replica filters on the request
    rows; the hops then are those of the matching requests' traces, paired from raw spans
    (``exact``). The hops do not take ``endpoint_class``."""
    from inferpath.analysis.band_query import fetch_breakdown_bands

    request_count, summaries = fetch_breakdown_bands(
        store, start=start, end=end, endpoint_class=endpoint_class, columns=columns
    )
    bands = {measure: [dataclasses.asdict(summary) for summary in summaries[measure]] for measure in ("ttft", "e2e")}
    hops, hop_percentiles = hop_overhead_view(
        store, start, end, rollup_min_window_seconds=rollup_min_window_seconds, columns=columns
    )
    return {"request_count": request_count, "bands": bands, "hops": hops, "hop_percentiles": hop_percentiles}


@router.get("/views/breakdown")
async def breakdown_view(
    request: Request,
    columns: RowFilters,
    start: str | None = StartQuery,
    end: str | None = EndQuery,
    endpoint_class: str | None = None,
) -> dict:
    """Breakdown: stage shares of TTFT and E2E per percentile band (exact); overhead per hop
    (``hop_percentiles``: ``exact``, or ``ddsketch`` from the per-minute hop rollup for
    windows of at least ``INFERPATH_ROLLUP_MIN_WINDOW_SECONDS``, within 0.5 % of a value
    of that rank; counts and means exact either way). ``service``, ``model``, ``replica``:
    exact-match filters on the request row; filtered, the hops are those of the matching
    requests' traces, always paired from raw spans (the hop rollup holds no such columns)."""
    start_dt, end_dt = _window(start, end)
    runtime = request.app.state.runtime
    body = await _read(
        breakdown_view_body,
        runtime.store,
        start_dt,
        end_dt,
        endpoint_class=endpoint_class,
        rollup_min_window_seconds=runtime.reader.rollup_min_window_seconds,
        columns=columns,
    )
    return {"start": start_dt, "end": end_dt, **body}


@router.get("/views/fleet")
async def fleet_view(request: Request, start: str | None = StartQuery, end: str | None = EndQuery) -> dict:
    """GPUs and engines: per signal series, the window's samples, last value, min/mean/max;
    plus the signal catalog (which source can report which signal), so a reader can tell
    a signal a source does not export from one that sent nothing in this window."""
    from inferpath.collectors.catalog import CATALOG, DERIVED, DerivedMetric, SourceMetric

    start_dt, end_dt = _window(start, end)
    series = await _read(fleet_series_rows, request.app.state.runtime.store, start_dt, end_dt)
    sources: dict[str, dict[str, list[str]]] = {}
    catalog: tuple[SourceMetric | DerivedMetric, ...] = (*CATALOG, *DERIVED)
    for row in catalog:
        metrics = sources.setdefault(row.source, {}).setdefault(row.signal, [])
        metrics.append(row.metric if isinstance(row, SourceMetric) else "+".join(row.required))
    signals = {name: {"unit": s.unit, "kind": s.kind, "description": s.description} for name, s in SIGNALS.items()}
    return {"start": start_dt, "end": end_dt, "series": series, "signals": signals, "sources": sources}


def _alerts_service(request: Request) -> AlertsService | None:
    """The alerts service this server runs (registered by whoever started it), or ``None``."""
    service = request.app.state.runtime.services.get(ALERTS)
    return service if isinstance(service, AlertsService) else None


@router.get("/alerts")
async def alerts_view(
    request: Request,
    start: str | None = StartQuery,
    end: str | None = EndQuery,
    limit: int = Query(500, ge=1, le=10000, description="Most history rows returned."),
) -> dict:
    """Alerts firing and pending now (the server's alerts service) and the state changes of
    ``[start, end)`` from ``inferpath_alerts`` (``history``, oldest first); when the server
    evaluates no rules (none configured, or no alerts service) ``{"configured": false,
    "history": [...]}``. Shapes: :meth:`inferpath.server.services.AlertsService.snapshot`,
    :meth:`inferpath.storage.reader.Reader.alert_changes`."""
    start_dt, end_dt = _window(start, end)
    history = await _read(request.app.state.runtime.reader.alert_changes, start_dt, end_dt, limit)
    service = _alerts_service(request)
    snapshot = await run_in_threadpool(service.snapshot) if service is not None else None
    if snapshot is None:
        return {"configured": False, "start": start_dt, "end": end_dt, "history": history}
    return {"configured": True, "start": start_dt, "end": end_dt, **snapshot, "history": history}


class BacktestRequest(BaseModel):
    """A rule file to replay over past data: ``rules`` (its YAML text), ``source`` (its name,
    for errors), the window ``start``/``end`` (ISO-8601 with offset or Unix seconds),
    ``step_seconds`` (default: the file's ``evaluation_interval``)."""

    model_config = ConfigDict(extra="forbid")

    rules: str = Field(max_length=1_000_000)
    source: str = Field("<rules>", max_length=1000)
    start: str
    end: str
    step_seconds: float | None = Field(None, gt=0, allow_inf_nan=False)


@router.post("/alerts/backtest")
async def alerts_backtest(request: Request, body: BacktestRequest) -> dict:
    """What the rules would have done over ``[start, end)`` of this server's store, evaluated
    in simulated time with no notifications (``inferpath alerts test``): ``{"transitions":
    [{"at", "rule", "labels", "change", "value", "reason"}]}``, oldest first. 422 naming the
    problem for an invalid rule file (file, line, field), a bad window or a replay over
    20,000 evaluations; 404 when this server runs no alerts service (``python -m
    inferpath.server`` alone)."""
    service = _alerts_service(request)
    if service is None:
        raise HTTPException(
            status_code=404, detail="this server runs without the alerts service (start it with `inferpath up`)"
        )
    start_dt, end_dt = parse_time(body.start, "start", where="body"), parse_time(body.end, "end", where="body")
    if start_dt is None or end_dt is None or end_dt <= start_dt:
        raise _invalid("end", f"end must be after start (start={body.start!r}, end={body.end!r})", "body")
    try:
        transitions = await run_in_threadpool(
            service.backtest, body.rules, body.source, start_dt, end_dt, body.step_seconds
        )
    except ValueError as exc:
        raise _invalid("rules", str(exc), "body") from None
    return {"transitions": transitions}


@router.get("/objectives")
async def objectives_view(request: Request) -> dict:
    """The latency objectives this server judges windows against, per endpoint class:
    ``{"by_class": {"interactive": [{"measure", "quantile", "limit_seconds"}, ...]},
    "default_class", "source"}`` (``source``: the objectives file, or ``defaults``); 500
    naming the file when it is invalid."""
    from inferpath.analysis.objectives import DEFAULT_CLASS

    settings = request.app.state.runtime.settings
    by_class = {
        name: [{"measure": o.measure, "quantile": o.quantile, "limit_seconds": o.limit_seconds} for o in objectives]
        for name, objectives in runtime_objectives(settings).by_class.items()
    }
    return {"by_class": by_class, "default_class": DEFAULT_CLASS, "source": settings.objectives_file or "defaults"}


SIGNAL_VIEW_METRICS = (
    QUEUE_DEPTH,
    RUNNING_REQUESTS,
    KV_CACHE_USAGE_RATIO,
    BATCH_SIZE,
    GPU_UTILIZATION_RATIO,
    GPU_MEMORY_USED_BYTES,
    GPU_MEMORY_TOTAL_BYTES,
    GPU_POWER_WATTS,
)
"""Gauges of ``/views/signals``: the engine's and the GPUs' saturation and their capacity."""


def signals_view_body(store, start: datetime, end: datetime, *, step_seconds: int) -> dict:
    """Per gauge of :data:`SIGNAL_VIEW_METRICS` and per step (epoch-aligned buckets, as
    ``/views/latency``): the largest and the mean sample of each series in the step,
    combined across series as the vocabulary's :attr:`~inferpath.vocabulary.Signal.across`
    says (queue and memory summed, KV usage the fullest engine, utilization the mean GPU). A
    step without a sample is absent: never a held value, never 0. Each signal also says how
    many series reported it (``series``, e.g. 4 GPUs) and when its last sample in the window
    was (``last_time``), so a reader can mark a series that stopped as stale. A signal
    without any sample in the window is absent from ``signals``."""
    from inferpath.analysis.signals import COMBINE

    grouped: dict[str, dict] = {}
    for row in gauge_step_rows(store, SIGNAL_VIEW_METRICS, start, end, step_seconds=step_seconds):
        signal = grouped.setdefault(row["signal"], {"series": set(), "last_time": row["last_time"], "steps": {}})
        signal["series"].add((row["service_name"], tuple(sorted(row["attributes"].items()))))
        signal["last_time"] = max(signal["last_time"], row["last_time"])
        signal["steps"].setdefault(row["bucket"], []).append((row["max_value"], row["avg_value"]))
    out = {}
    for name, signal in grouped.items():
        combine = COMBINE[name]
        out[name] = {
            "combine": SIGNALS[name].across,
            "series": len(signal["series"]),
            "last_time": signal["last_time"],
            "points": [
                {"time": bucket, "max": combine([h for h, _ in values]), "mean": combine([m for _, m in values])}
                for bucket, values in sorted(signal["steps"].items())
            ],
        }
    return {"signals": out}


@router.get("/views/signals")
async def signals_view(
    request: Request,
    start: str | None = StartQuery,
    end: str | None = EndQuery,
    step_seconds: int | None = StepQuery,
    max_points: int = MaxPointsQuery,
) -> dict:
    """Engine and GPU saturation per step: the max and the mean of each gauge in the step
    (queue depth, running requests, KV usage, batch size, GPU utilization, memory used and
    total, power), the number of series summed and the last sample time per signal."""
    start_dt, end_dt = _window(start, end)
    step = view_step_seconds(start_dt, end_dt, step_seconds, max_points)
    body = await _read(signals_view_body, request.app.state.runtime.store, start_dt, end_dt, step_seconds=step)
    return {"start": start_dt, "end": end_dt, "step_seconds": step, **body}
