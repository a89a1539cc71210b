"""Per-minute rollups of request rows, so reads over hours and days stay fast.

``inferpath_requests_1m`` (schema 006) holds, per (minute, endpoint class, endpoint,
status), the request count and per measure the count of rows that measured it, their sum
and a DDSketch (ClickHouse ``quantilesDD``, relative accuracy :data:`RELATIVE_ACCURACY`).
Merging sketches of many minutes answers a quantile over the whole range with the same
relative accuracy (Masson, Rim & Lee, "DDSketch: A Fast and Fully-Mergeable Quantile Sketch
with Relative-Error Guarantees", VLDB 2019). Counts and means from a rollup are exact.

Maintenance (:func:`refresh`): request rows are re-derived when late spans arrive, so a
rollup cannot be a materialized view over inserts (it would count a re-derived request
twice). Instead each pass finds the minutes holding a request row updated since the last
watermark, rebuilds those minutes from ``inferpath_requests FINAL`` and advances the
watermark (kept in ``inferpath_rollup_state``). A request row whose update lands after a pass
is picked up by the next one.

An hourly tier (``inferpath_requests_1h``, schema 007) merges each hour's minute sketches in
the same pass, so a day-long read merges 24 rows per group instead of 1440.

Reads (:func:`plan_window`, :func:`aggregate`): whole hours and minutes of a window older than the
horizon (the watermark floored to the minute) come from the rollup; the rest of the window
(its ragged edges and the recent minutes) is sketched from the raw rows in the same query,
so the answer covers every request of the window.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from inferpath.vocabulary import CLIENT_FIRST_SQL, REQUEST_MEASURES, measure_column

ROLLUP_TABLE = "inferpath_requests_1m"
HOURLY_TABLE = "inferpath_requests_1h"
STATE_TABLE = "inferpath_rollup_state"
STATE_NAME = "inferpath_requests_rollup_v2"
"""The refresher's row in the state table; a change to what the rollups hold gets a new name,
so the first pass after an upgrade (no watermark yet) rebuilds every minute and hour."""
RELATIVE_ACCURACY = 0.005
"""DDSketch relative accuracy α: a quantile read is within α (0.5 %) of a value of that rank."""
QUANTILE_LEVELS: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)
_SKETCH = f"quantilesDD({RELATIVE_ACCURACY}, {', '.join(str(q) for q in QUANTILE_LEVELS)})"

ROLLUP_MEASURES: dict[str, str] = {
    **{m: measure_column(m) for m in REQUEST_MEASURES},
    "ttft_best": CLIENT_FIRST_SQL["ttft"],
    "e2e_best": CLIENT_FIRST_SQL["e2e"],
}
"""Measure name → its SQL expression over an ``inferpath_requests`` row (nanoseconds).
``ttft_best``/``e2e_best``: the client's value when measured, else the server's
(:data:`~inferpath.vocabulary.CLIENT_FIRST_SQL`)."""

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DEFAULT_MARGIN_SECONDS = 120.0
"""How far behind a pass's start its watermark is set: a request row stamped ``updated_at``
up to this long before it became visible (batched inserts) is still found next pass."""
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_RANGE = "{start:DateTime64(9, 'UTC')} AND timestamp < {end:DateTime64(9, 'UTC')}"


def _param(name: str) -> str:
    """A server-side bound DateTime parameter placeholder."""
    return "{" + name + ":DateTime('UTC')}"


_START_PARAM, _END_PARAM = _param("start"), _param("end")


def _latest_rebuild(table: str, column: str, start: str, end: str) -> str:
    """SQL condition keeping, of each minute (or hour) of ``[start, end)``, only the rows of
    its latest rebuild. A rebuild writes every group of its minutes with one ``rolled_at``;
    a group that no longer exists (a request re-derived into another endpoint or status)
    keeps an older one and so drops out here, where FINAL alone would keep it."""
    return (
        f"{column} >= {start} AND {column} < {end} AND ({column}, rolled_at) IN"
        f" (SELECT {column}, max(rolled_at) FROM {table}"
        f" WHERE {column} >= {start} AND {column} < {end} GROUP BY {column})"
    )


def _sketch_columns(source: str = "raw") -> list[str]:
    """SELECT items giving, per measure, ``<m>_count, <m>_sum_ns, <m>_q`` states.

    ``source="raw"``: aggregates over ``inferpath_requests`` rows; ``"rollup"``: the
    rollup's stored columns (already aggregated per minute).
    """
    items = []
    for name, expression in ROLLUP_MEASURES.items():
        if source == "rollup":
            items += [f"{name}_count", f"{name}_sum_ns", f"{name}_q"]
        else:
            items += [
                f"count({expression}) AS {name}_count",
                f"toFloat64(sum({expression})) AS {name}_sum_ns",
                f"{_SKETCH.replace('quantilesDD', 'quantilesDDStateIf')}"
                f"(assumeNotNull({expression}), isNotNull({expression})) AS {name}_q",
            ]
    return items


# ----------------------------------------------------------------------------- refresh
@dataclass(frozen=True)
class RefreshResult:
    """One pass: ``minutes`` rebuilt, ``seconds`` spent, the new ``watermark``;
    ``hop_minutes``: minutes of the hop rollup rebuilt in the same refresher pass
    (:class:`inferpath.storage.refresher.RollupRefresher`), 0 from :func:`refresh` alone."""

    minutes: int
    seconds: float
    watermark: datetime
    hop_minutes: int = 0


def watermark(store) -> datetime | None:
    """The refresher's watermark (aware UTC), ``None`` before its first pass."""
    rows = store.query(
        f"SELECT max(watermark), count() FROM {STATE_TABLE} WHERE name = {{name:String}}", {"name": STATE_NAME}
    )
    return rows[0][0] if rows and rows[0][1] else None


def horizon(store) -> datetime | None:
    """Start of the first minute the rollup may not cover yet: the watermark floored to the
    minute (request rows of older minutes were all updated before the watermark)."""
    mark = watermark(store)
    return None if mark is None else mark.replace(second=0, microsecond=0)


def _runs(starts: Sequence[datetime], max_units: int, unit: timedelta = MINUTE) -> list[tuple[datetime, datetime]]:
    """Consecutive ``unit``-long intervals merged into ``[start, end)`` runs of at most
    ``max_units`` units."""
    runs: list[tuple[datetime, datetime]] = []
    for start in sorted(starts):
        if runs and runs[-1][1] == start and (runs[-1][1] - runs[-1][0]) < max_units * unit:
            runs[-1] = (runs[-1][0], start + unit)
        else:
            runs.append((start, start + unit))
    return runs


def refresh(
    store,
    *,
    now: datetime | None = None,
    margin_seconds: float = DEFAULT_MARGIN_SECONDS,
    max_minutes_per_insert: int = 60,
) -> RefreshResult:
    """Rebuild the rollup minutes that hold request rows updated since the watermark.

    ``now``: aware wall-clock time of the pass (default: now); the new watermark is
    ``now - margin_seconds``. Minutes are rebuilt in runs of at most
    ``max_minutes_per_insert`` consecutive minutes (one INSERT … SELECT each: bounded
    statements; each runs on a store connection of its own, so ingest does not wait for
    them, only shares the CPU), then the hours holding them from their minutes. Driver errors
    propagate, leaving the watermark where it was (the next pass redoes the work).
    """
    started = time.monotonic()
    pass_time = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    since = watermark(store) or _EPOCH
    minutes = [
        row[0]
        for row in store.query(
            "SELECT DISTINCT toStartOfMinute(timestamp) FROM inferpath_requests"
            " WHERE updated_at >= {since:DateTime64(9, 'UTC')}",
            {"since": since},
        )
    ]
    for run_start, run_end in _runs(minutes, max_minutes_per_insert):
        store.command(
            f"INSERT INTO {ROLLUP_TABLE} SELECT toStartOfMinute(timestamp) AS minute,"
            " endpoint_class, endpoint, status, count() AS requests, "
            + ", ".join(_sketch_columns())
            + ", now64(9, 'UTC') AS rolled_at FROM inferpath_requests FINAL"
            f" WHERE timestamp >= {_RANGE} GROUP BY minute, endpoint_class, endpoint, status",
            {"start": run_start, "end": run_end},
        )
    hours = sorted({m.replace(minute=0) for m in minutes})
    for run_start, run_end in _runs(hours, max_minutes_per_insert, unit=HOUR):
        merged = ", ".join(
            f"sum({m}_count), sum({m}_sum_ns), {_SKETCH.replace('quantilesDD', 'quantilesDDMergeState')}({m}_q)"
            for m in ROLLUP_MEASURES
        )
        store.command(
            f"INSERT INTO {HOURLY_TABLE} SELECT toStartOfHour(minute) AS hour, endpoint_class, endpoint,"
            f" status, sum(requests), {merged}, now64(9, 'UTC') FROM {ROLLUP_TABLE}"
            f" WHERE {_latest_rebuild(ROLLUP_TABLE, 'minute', _START_PARAM, _END_PARAM)}"
            " GROUP BY hour, endpoint_class, endpoint, status",
            {"start": run_start, "end": run_end},
        )
    mark = max(since, pass_time - timedelta(seconds=margin_seconds))
    store.command(
        f"INSERT INTO {STATE_TABLE} (name, watermark, updated_at) VALUES"
        " ({name:String}, {mark:DateTime64(9, 'UTC')}, now64(9, 'UTC'))",
        {"name": STATE_NAME, "mark": mark},
    )
    return RefreshResult(minutes=len(minutes), seconds=time.monotonic() - started, watermark=mark)


# ----------------------------------------------------------------------------- reads
@dataclass(frozen=True)
class WindowPlan:
    """Where each part of ``[start, end)`` is read from: ``rollup`` = ``(from, to)`` of the
    part read from rollups (or ``None``), ``tiers`` = that part as ``(table, from, to)``
    pieces (whole hours from :data:`HOURLY_TABLE`, the rest from :data:`ROLLUP_TABLE`),
    ``raw`` = ranges read from the request rows."""

    rollup: tuple[datetime, datetime] | None
    raw: tuple[tuple[datetime, datetime], ...]
    tiers: tuple[tuple[str, datetime, datetime], ...] = ()


def _ceil(value: datetime, unit: timedelta) -> datetime:
    offset = (value - _EPOCH) % unit
    return value if not offset else value + (unit - offset)


def _floor(value: datetime, unit: timedelta) -> datetime:
    return value - ((value - _EPOCH) % unit)


def plan_window(
    start: datetime, end: datetime, rollup_horizon: datetime | None, *, align_seconds: int = 60, hourly: bool = True
) -> WindowPlan:
    """Split ``[start, end)`` (aware) between the rollups and the raw rows.

    The rollup part is the longest run of whole ``align_seconds`` buckets (a multiple of
    60, epoch-aligned) inside the window and before ``rollup_horizon``; with no horizon or
    no whole bucket the whole window is raw. With ``hourly``, the whole hours of that part
    are read from the hourly tier (callers grouping by a step pass ``hourly`` only when the
    step is whole hours, so an hour row never straddles two buckets). Raises
    ``ValueError`` for an ``align_seconds`` that is not a positive multiple of 60.
    """
    if align_seconds <= 0 or align_seconds % 60:
        raise ValueError(f"align_seconds must be a positive multiple of 60, got {align_seconds!r}")
    if rollup_horizon is None:
        return WindowPlan(None, ((start, end),))
    step = timedelta(seconds=align_seconds)
    first = _ceil(start, step)
    last = _floor(min(end, rollup_horizon), step)
    if last <= first:
        return WindowPlan(None, ((start, end),))
    raw = tuple((a, b) for a, b in ((start, first), (last, end)) if b > a)
    hours_first, hours_last = _ceil(first, HOUR), _floor(last, HOUR)
    if not hourly or hours_last <= hours_first:
        return WindowPlan((first, last), raw, ((ROLLUP_TABLE, first, last),))
    tiers = tuple(
        (table, a, b)
        for table, a, b in (
            (ROLLUP_TABLE, first, hours_first),
            (HOURLY_TABLE, hours_first, hours_last),
            (ROLLUP_TABLE, hours_last, last),
        )
        if b > a
    )
    return WindowPlan((first, last), raw, tiers)


def aggregate(
    store,
    plan: WindowPlan,
    *,
    measures: Iterable[str],
    step_seconds: int | None = None,
    filters: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Counts, sums and DDSketch quantiles per measure over a planned window.

    ``measures``: names from :data:`ROLLUP_MEASURES` (``ValueError`` otherwise).
    ``step_seconds``: group by epoch-aligned buckets of that width (with a rollup part it
    must be a multiple of 60, as :func:`plan_window` aligned it); ``None``: one group.
    ``filters``: column → value equality on ``endpoint``, ``endpoint_class``, ``status``.
    Returns dicts with ``bucket`` (aware datetime; absent without a step),
    ``endpoint_class`` (with a step), ``requests``, ``errors`` and per measure
    ``<m>_count``, ``<m>_sum_ns``, ``<m>_q`` (list of values at :data:`QUANTILE_LEVELS`, ns).
    """
    names = list(measures)
    unknown = [m for m in names if m not in ROLLUP_MEASURES]
    if unknown:
        raise ValueError(f"measures: unknown {unknown}; known: {list(ROLLUP_MEASURES)}")
    filters = dict(filters or {})
    bad = [c for c in filters if c not in ("endpoint", "endpoint_class", "status")]
    if bad:
        raise ValueError(f"filters: unknown column(s) {bad}")
    params: dict[str, Any] = {f"f_{c}": v for c, v in filters.items()}
    filter_sql = "".join(f" AND {c} = {{f_{c}:String}}" for c in filters)
    if step_seconds is not None:
        if plan.rollup is not None and step_seconds % 60:
            raise ValueError(f"step_seconds must be a multiple of 60 with a rollup, got {step_seconds}")
        if any(table == HOURLY_TABLE for table, _, _ in plan.tiers) and step_seconds % 3600:
            raise ValueError(f"step_seconds must be whole hours with the hourly tier, got {step_seconds}")
        params["step"] = step_seconds
    per_measure = [c for m in names for c in (f"{m}_count", f"{m}_sum_ns", f"{m}_q")]
    raw_items = [i for i in _sketch_columns() if i.rsplit(" AS ", 1)[1] in per_measure]
    parts = []
    for index, (table, a, b) in enumerate(plan.tiers):
        params[f"r{index}_start"], params[f"r{index}_end"] = a, b
        column = "hour" if table == HOURLY_TABLE else "minute"
        parts.append(
            f"SELECT {column} AS t, endpoint_class, status, requests, {', '.join(per_measure)}"
            f" FROM {table} WHERE {_latest_rebuild(table, column, _param(f'r{index}_start'), _param(f'r{index}_end'))}"
            f"{filter_sql}"
        )
    for index, (a, b) in enumerate(plan.raw):
        params[f"a{index}"], params[f"b{index}"] = a, b
        # Raw rows go straight into their step's bucket (the step need not be whole minutes).
        bucket = (
            "toDateTime(intDiv(toUnixTimestamp(timestamp), {step:UInt32}) * {step:UInt32}, 'UTC')"
            if step_seconds
            else "toDateTime(0, 'UTC')"
        )
        group = "t, endpoint_class, status" if step_seconds else "endpoint_class, status"
        parts.append(
            f"SELECT {bucket} AS t,"
            f" endpoint_class, status, count() AS requests, {', '.join(raw_items)}"
            f" FROM inferpath_requests FINAL WHERE timestamp >= {{a{index}:DateTime64(9, 'UTC')}}"
            f" AND timestamp < {{b{index}:DateTime64(9, 'UTC')}}{filter_sql} GROUP BY {group}"
        )
    merged = [
        f"sum({m}_count), sum({m}_sum_ns), {_SKETCH.replace('quantilesDD', 'quantilesDDMerge')}({m}_q)" for m in names
    ]
    keys = (
        "toDateTime(intDiv(toUnixTimestamp(t), {step:UInt32}) * {step:UInt32}, 'UTC') AS bucket, endpoint_class, "
        if step_seconds
        else ""
    )
    sql = (
        f"SELECT {keys}sum(requests), sumIf(requests, status = 'error'), {', '.join(merged)}"
        f" FROM ({' UNION ALL '.join(parts)})"
        + (" GROUP BY bucket, endpoint_class ORDER BY bucket, endpoint_class" if step_seconds else "")
    )
    out = []
    for row in store.query(sql, params):
        values = list(row)
        item: dict[str, Any] = {}
        if step_seconds:
            item["bucket"], item["endpoint_class"] = values[0], values[1]
            values = values[2:]
        item["requests"], item["errors"] = int(values[0] or 0), int(values[1] or 0)
        for index, m in enumerate(names):
            count, total, quantiles = values[2 + 3 * index : 5 + 3 * index]
            # A filter matching nothing leaves one row of empty aggregates (sums NULL).
            item[f"{m}_count"] = int(count or 0)
            item[f"{m}_sum_ns"] = float(total or 0.0)
            item[f"{m}_q"] = [float(q) for q in quantiles] if count else [None] * len(QUANTILE_LEVELS)
        out.append(item)
    return out
