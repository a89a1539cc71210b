"""The read API (``/api/v1/...``): what the dashboard, the CLI and alerts read through.

Times are ISO-8601 with a UTC offset (``2026-11-30T11:00:00Z``) or Unix seconds; the
window defaults to the last 15 minutes. Bad parameters answer 422 with FastAPI's error
shape, ``{"detail": [{"loc": ["query", "<param>"], "msg": "...", "type": "value_error"}]}``.
Durations in request rows stay in nanoseconds (``*_ns``); summaries are in seconds.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import datetime, timedelta, timezone
from typing import Literal

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.concurrency import run_in_threadpool

__all__ = ["router", "parse_time", "DEFAULT_WINDOW"]

DEFAULT_WINDOW = timedelta(minutes=15)
_UNIX_SECONDS = re.compile(r"^-?\d+(\.\d+)?$")

router = APIRouter(prefix="/api/v1", tags=["read"])


def _invalid(param: str, message: str) -> HTTPException:
    return HTTPException(status_code=422, detail=[{"loc": ["query", param], "msg": message,
                                                   "type": "value_error"}])


def parse_time(value: str | None, param: str) -> datetime | None:
    """Parse ISO-8601 with offset (``Z`` allowed) or Unix seconds into an aware UTC datetime.

    ``None``/empty gives ``None``. Raises ``HTTPException(422)`` naming ``param`` for a naive
    or unparsable time.
    """
    if value is None or value.strip() == "":
        return None
    text = value.strip()
    if _UNIX_SECONDS.match(text):
        try:
            return datetime.fromtimestamp(float(text), tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise _invalid(param, f"{param} is out of range: {text!r}") from None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise _invalid(param, f"{param} must be ISO-8601 with a UTC offset or Unix seconds, "
                              f"got {text!r}") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise _invalid(param, f"{param} must carry a UTC offset (e.g. 'Z' or '+00:00'), got {text!r}")
    return parsed.astimezone(timezone.utc)


def _window(start: str | None, end: str | None) -> tuple[datetime, datetime]:
    end_dt = parse_time(end, "end") or datetime.now(timezone.utc)
    start_dt = parse_time(start, "start") or end_dt - DEFAULT_WINDOW
    if end_dt <= start_dt:
        raise _invalid("end", f"end must be after start (start={start_dt.isoformat()}, "
                              f"end={end_dt.isoformat()})")
    return start_dt, end_dt


async def _read(call, *args, **kwargs):
    """Run a blocking Reader call off the event loop; ValueError → 422 naming the argument."""
    try:
        return await run_in_threadpool(call, *args, **kwargs)
    except ValueError as exc:
        param = str(exc).split(" ", 1)[0]
        raise HTTPException(status_code=422, detail=[{"loc": ["query", param], "msg": str(exc),
                                                      "type": "value_error"}]) from None


StartQuery = Query(None, description="Window start: ISO-8601 with offset or Unix seconds (default end − 15 min).")
EndQuery = Query(None, description="Window end: ISO-8601 with offset or Unix seconds (default now).")


@router.get("/summary")
async def summary(request: Request, start: str | None = StartQuery, end: str | None = EndQuery,
                  endpoint: str | None = None, endpoint_class: str | None = None) -> dict:
    """Latency summary per measure (count, mean, p50, p95, p99 in seconds) over the window."""
    start_dt, end_dt = _window(start, end)
    reader = request.app.state.runtime.reader
    measures = await _read(reader.latency_summary, start_dt, end_dt, endpoint=endpoint,
                           endpoint_class=endpoint_class)
    count = await _read(reader.request_count, start_dt, end_dt, endpoint=endpoint,
                        endpoint_class=endpoint_class)
    return {"start": start_dt, "end": end_dt, "endpoint": endpoint, "endpoint_class": endpoint_class,
            "request_count": count, "measures": measures}


@router.get("/requests")
async def requests_(request: Request, start: str | None = StartQuery, end: str | None = EndQuery,
                    endpoint: str | None = None, endpoint_class: str | None = None,
                    limit: int = Query(100, ge=1, le=10_000),
                    order: Literal["timestamp", "slowest"] = "timestamp") -> dict:
    """Request rows in the window (durations in ns), newest first or slowest first."""
    start_dt, end_dt = _window(start, end)
    rows = await _read(request.app.state.runtime.reader.requests, start_dt, end_dt, endpoint=endpoint,
                       endpoint_class=endpoint_class, limit=limit, order=order)
    return {"start": start_dt, "end": end_dt, "requests": rows}


@router.get("/requests/count")
async def requests_count(request: Request, start: str | None = StartQuery, end: str | None = EndQuery,
                         endpoint: str | None = None, endpoint_class: str | None = None) -> dict:
    """Number of requests in the window."""
    start_dt, end_dt = _window(start, end)
    count = await _read(request.app.state.runtime.reader.request_count, start_dt, end_dt,
                        endpoint=endpoint, endpoint_class=endpoint_class)
    return {"start": start_dt, "end": end_dt, "count": count}


@router.get("/timeseries/ttft")
async def ttft_timeseries(request: Request, start: str | None = StartQuery, end: str | None = EndQuery,
                          step_seconds: int = Query(60, ge=1, le=86_400),
                          endpoint_class: str | None = None) -> dict:
    """TTFT per time bucket and endpoint class (seconds)."""
    start_dt, end_dt = _window(start, end)
    points = await _read(request.app.state.runtime.reader.ttft_timeseries, start_dt, end_dt,
                         step_seconds=step_seconds, endpoint_class=endpoint_class)
    return {"start": start_dt, "end": end_dt, "step_seconds": step_seconds, "points": points}


@router.get("/timeseries/gauge")
async def gauge_timeseries(request: Request, metric: str = Query(..., min_length=1, max_length=512),
                           start: str | None = StartQuery, end: str | None = EndQuery,
                           step_seconds: int = Query(60, ge=1, le=86_400)) -> dict:
    """Mean of one gauge (canonical signal name) per bucket, service and attribute set."""
    start_dt, end_dt = _window(start, end)
    points = await _read(request.app.state.runtime.reader.gauge_timeseries, metric, start_dt, end_dt,
                         step_seconds=step_seconds)
    return {"metric": metric, "start": start_dt, "end": end_dt, "step_seconds": step_seconds,
            "points": points}


@router.get("/traces/{trace_id}")
async def trace(request: Request,
                trace_id: str = Path(..., pattern="^[0-9a-fA-F]{32}$",
                                     description="32 hex digits")) -> dict:
    """All spans of one trace, ordered by start; 404 when the trace is unknown."""
    spans = await _read(request.app.state.runtime.reader.trace_spans, trace_id)
    if not spans:
        raise HTTPException(status_code=404, detail=f"trace {trace_id.lower()} not found")
    out = []
    for span in spans:
        item = dataclasses.asdict(span)
        item["start_ns"], item["end_ns"] = span.start_ns, span.end_ns
        out.append(item)
    return {"trace_id": trace_id.lower(), "spans": out}


@router.get("/diagnosis")
async def diagnosis(request: Request, start: str | None = StartQuery, end: str | None = EndQuery,
                    baseline_start: str | None = Query(None, description="Baseline start (default: the "
                                                       "window of the same length just before start)."),
                    baseline_end: str | None = Query(None, description="Baseline end (default: start)."),
                    endpoint: str | None = None) -> dict:
    """The verdict for the window against its baseline: named causes, evidence, what would help.

    422 when a window is reversed or holds too few requests to judge.
    """
    from inferpath.analysis import diagnose, verdict_to_dict

    start_dt, end_dt = _window(start, end)
    base_end = parse_time(baseline_end, "baseline_end") or start_dt
    base_start = parse_time(baseline_start, "baseline_start") or base_end - (end_dt - start_dt)
    if base_end <= base_start:
        raise _invalid("baseline_end", "baseline_end must be after baseline_start")
    store = request.app.state.runtime.store
    try:
        verdict = await run_in_threadpool(diagnose, store, window_start=start_dt, window_end=end_dt,
                                          baseline_start=base_start, baseline_end=base_end, endpoint=endpoint)
    except ValueError as exc:  # InsufficientDataError included
        raise _invalid("start", str(exc)) from None
    return verdict_to_dict(verdict)


@router.post("/flush")
async def flush(request: Request, timeout_seconds: float = Query(30.0, gt=0, le=300)) -> dict:
    """Insert every accepted span and data point, assemble every noted trace, insert those
    rows; returns insert counters and ``ok`` (False on timeout or failed inserts)."""
    return await run_in_threadpool(request.app.state.runtime.flush, timeout_seconds)
