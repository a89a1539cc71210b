"""Read queries over inferpath's tables: parameterized SQL only, bounded ranges and limits.

Every query binds its values server-side (``{name:Type}`` placeholders); the only text put
into SQL is chosen from constants in this module. Time arguments must be timezone-aware;
ranges are half-open ``[start, end)`` on the row's timestamp and at most
:data:`MAX_RANGE` long. Durations come back in seconds (stored as nanoseconds).

Percentiles are exact: ClickHouse ``quantilesExactInclusive``, i.e. linear interpolation
between closest ranks over ``n - 1`` (R type 7, Excel ``PERCENTILE.INC``, NumPy's default
``method="linear"``), so the numbers match ``numpy.percentile`` on the same values.

The dashboard views' queries (:func:`latency_view_points`, :func:`gauge_step_rows`,
:func:`fleet_series_rows`) are module functions over a store: they take any aware window,
the read API bounding their buckets by its ``max_points`` instead of the range.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from inferpath.storage.rollup import QUANTILE_LEVELS, WindowPlan, aggregate, plan_window
from inferpath.storage.rollup import horizon as rollup_horizon
from inferpath.storage.rows import REQUEST_COLUMNS, SPAN_COLUMNS, SpanRow
from inferpath.storage.store import Store, ensure_aware
from inferpath.vocabulary import CLIENT_FIRST_SQL, REQUEST_MEASURES, SIGNALS

MAX_RANGE = timedelta(days=31)
MAX_LIMIT = 10_000
MAX_BUCKETS = 10_000
MAX_STEP_SECONDS = 86_400
VIEW_QUANTILES = (0.5, 0.95, 0.99)
"""The percentiles the dashboard views report (``p50``, ``p95``, ``p99``): latency and hops."""


_NS_PER_SECOND = 1e9
_TRACE_ID = re.compile(r"^[0-9a-fA-F]{32}$")
_REQUESTS_FROM = "FROM inferpath_requests FINAL"
_REQUESTS_RANGE = "timestamp >= {start:DateTime64(9, 'UTC')} AND timestamp < {end:DateTime64(9, 'UTC')}"

ROW_FILTERS = {"service": "service_name", "model": "model", "replica": "replica"}
"""Exact-match filters on a request row: the read API's parameter → the column of
``inferpath_requests``. The rollups hold none of these columns, so a query filtered by any
of them reads the raw rows."""
MAX_FILTER_LENGTH = 256


def row_filters(**values: str | None) -> dict[str, str]:
    """Column → value for the :data:`ROW_FILTERS` given (``None`` ones left out). Raises
    ``ValueError`` starting with the parameter's name for an unknown name, an empty value or
    one longer than :data:`MAX_FILTER_LENGTH` characters."""
    out: dict[str, str] = {}
    for name, value in values.items():
        if name not in ROW_FILTERS:
            raise ValueError(f"{name} is not a request-row filter (known: {', '.join(ROW_FILTERS)})")
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if len(value) > MAX_FILTER_LENGTH:
            raise ValueError(f"{name} must be at most {MAX_FILTER_LENGTH} characters, got {len(value)}")
        out[ROW_FILTERS[name]] = value
    return out


def row_filter_sql(columns: dict[str, str] | None, params: dict[str, Any]) -> str:
    """`` AND column = {rf_column:String}`` for each of ``columns`` (column → value, as
    :func:`row_filters` gives), binding the values into ``params``; ``""`` for none. Raises
    ``ValueError`` for a column that is not one of :data:`ROW_FILTERS`."""
    sql = ""
    for column, value in (columns or {}).items():
        if column not in ROW_FILTERS.values():
            raise ValueError(f"row filter on unknown column {column!r}")
        params[f"rf_{column}"] = value
        sql += f" AND {column} = {{rf_{column}:String}}"
    return sql


def _seconds(value_ns: Any) -> float | None:
    if value_ns is None:
        return None
    value = float(value_ns)
    return None if math.isnan(value) else value / _NS_PER_SECOND


class Reader:
    """Queries for the read API, the CLI and the analysis code.

    ``store``: an open :class:`~inferpath.storage.store.Store`. Methods raise
    ``ValueError`` naming the argument for naive times, empty or too long ranges
    (> 31 days), bad limits, steps, ids or orders; driver errors propagate.
    """

    def __init__(self, store: Store, *, rollup_min_window_seconds: float | None = None) -> None:
        self.store = store
        self.rollup_min_window_seconds = rollup_min_window_seconds

    def rollup_plan(self, start: datetime, end: datetime, *, step_seconds: int | None = None) -> WindowPlan | None:
        """How ``[start, end)`` splits between the rollups and raw rows, or ``None`` when the
        window is read exactly: rollups off (``rollup_min_window_seconds`` None), the window
        shorter than that, no rollup pass yet, or no whole minute to roll up.
        ``step_seconds``: the bucket width the caller groups by (a multiple of 60), or
        ``None`` for one group; whole-hour steps (and ``None``) may use the hourly tier."""
        if self.rollup_min_window_seconds is None or ((end - start).total_seconds() < self.rollup_min_window_seconds):
            return None
        plan = plan_window(
            start,
            end,
            rollup_horizon(self.store),
            align_seconds=step_seconds or 60,
            hourly=step_seconds is None or step_seconds % 3600 == 0,
        )
        return plan if plan.rollup is not None else None

    def latency_view_plan(self, start: datetime, end: datetime, step_seconds: int) -> tuple[int, WindowPlan | None]:
        """The step and rollup plan of a latency view (:func:`latency_view_points`): a step
        of a minute or more is rounded up to whole minutes and read from the rollup when
        :meth:`rollup_plan` allows it; otherwise the step as given and ``None`` (exact)."""
        if step_seconds < 60:
            return step_seconds, None
        minutes_step = -(-step_seconds // 60) * 60
        plan = self.rollup_plan(start, end, step_seconds=minutes_step)
        return (minutes_step, plan) if plan is not None else (step_seconds, None)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _range(start: datetime, end: datetime) -> dict[str, datetime]:
        start_utc = ensure_aware(start, "start")
        end_utc = ensure_aware(end, "end")
        if end_utc <= start_utc:
            raise ValueError(f"end must be after start, got start={start_utc} end={end_utc}")
        if end_utc - start_utc > MAX_RANGE:
            # Starts with the parameter's name: the read API reports it as the 422's location.
            raise ValueError(f"start must be at most {MAX_RANGE.days} days before end, got {end_utc - start_utc}")
        return {"start": start_utc, "end": end_utc}

    @staticmethod
    def _filters(
        params: dict[str, Any],
        endpoint: str | None,
        endpoint_class: str | None,
        columns: dict[str, str] | None = None,
    ) -> str:
        clauses = [_REQUESTS_RANGE]
        if endpoint is not None:
            if not isinstance(endpoint, str):
                raise ValueError("endpoint must be a string")
            params["endpoint"] = endpoint
            clauses.append("endpoint = {endpoint:String}")
        if endpoint_class is not None:
            if not isinstance(endpoint_class, str):
                raise ValueError("endpoint_class must be a string")
            params["endpoint_class"] = endpoint_class
            clauses.append("endpoint_class = {endpoint_class:String}")
        return " AND ".join(clauses) + row_filter_sql(columns, params)

    @staticmethod
    def _step(start: datetime, end: datetime, step_seconds: int) -> int:
        if (
            isinstance(step_seconds, bool)
            or not isinstance(step_seconds, int)
            or not (1 <= step_seconds <= MAX_STEP_SECONDS)
        ):
            raise ValueError(f"step_seconds must be an integer in 1..{MAX_STEP_SECONDS}, got {step_seconds!r}")
        buckets = (end - start).total_seconds() / step_seconds
        if buckets > MAX_BUCKETS:
            raise ValueError(
                f"step_seconds={step_seconds} gives {buckets:.0f} buckets over the range; at most {MAX_BUCKETS}"
            )
        return step_seconds

    # ------------------------------------------------------------------ requests
    def latency_summary(
        self,
        start: datetime,
        end: datetime,
        *,
        endpoint: str | None = None,
        endpoint_class: str | None = None,
        columns: dict[str, str] | None = None,
    ) -> list[dict]:
        """Per-measure latency statistics of requests with ``timestamp`` in ``[start, end)``.

        Returns one dict per measure of :data:`~inferpath.vocabulary.REQUEST_MEASURES`, in
        that order, with keys ``measure``, ``count`` (rows where the measure is not NULL),
        ``avg_seconds``, ``p50_seconds``, ``p95_seconds``, ``p99_seconds`` (``None`` when
        ``count`` is 0).
        Percentiles are exact (see module docstring) unless the window is wide enough for
        the per-minute rollup (:meth:`rollup_plan`) and no ``columns`` filter is given; then
        they come from merged DDSketches, within 0.5 % of a value of that rank, and counts and
        means stay exact. ``columns``: exact-match filters on request-row columns
        (:func:`row_filters`); the rollups hold no such columns, so a filtered summary reads
        the raw rows whatever the window.
        """
        return self.summary(start, end, endpoint=endpoint, endpoint_class=endpoint_class, columns=columns)["measures"]

    def summary(
        self,
        start: datetime,
        end: datetime,
        *,
        endpoint: str | None = None,
        endpoint_class: str | None = None,
        columns: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """``{"request_count", "percentiles", "measures"}`` over ``[start, end)``: the number
        of requests, ``"exact"`` or ``"ddsketch"`` (how the percentiles were computed), and
        the per-measure list of :meth:`latency_summary`. With ``columns`` (service, model,
        replica filters: :func:`row_filters`) the raw rows are read (``"exact"``) even for a
        window the rollups would serve: they hold none of those columns."""
        params: dict[str, Any] = self._range(start, end)
        where = self._filters(params, endpoint, endpoint_class, columns)
        plan = None if columns else self.rollup_plan(params["start"], params["end"])
        if plan is not None:
            return self._summary_from_rollup(plan, endpoint, endpoint_class)
        count, measures = self._exact_summary(where, params)
        return {"request_count": count, "percentiles": "exact", "measures": measures}

    def _summary_from_rollup(
        self, plan: WindowPlan, endpoint: str | None, endpoint_class: str | None
    ) -> dict[str, Any]:
        filters = {k: v for k, v in (("endpoint", endpoint), ("endpoint_class", endpoint_class)) if v is not None}
        rows = aggregate(self.store, plan, measures=REQUEST_MEASURES, filters=filters)
        row = rows[0] if rows else {}
        level = {q: i for i, q in enumerate(QUANTILE_LEVELS)}
        out = []
        for measure in REQUEST_MEASURES:
            count = int(row.get(f"{measure}_count", 0))
            if count == 0:
                out.append(
                    {
                        "measure": measure,
                        "count": 0,
                        "avg_seconds": None,
                        "p50_seconds": None,
                        "p95_seconds": None,
                        "p99_seconds": None,
                    }
                )
                continue
            q = row[f"{measure}_q"]
            out.append(
                {
                    "measure": measure,
                    "count": count,
                    "avg_seconds": row[f"{measure}_sum_ns"] / count / _NS_PER_SECOND,
                    **{f"p{round(p * 100)}_seconds": _seconds(q[level[p]]) for p in (0.5, 0.95, 0.99)},
                }
            )
        return {"request_count": int(row.get("requests", 0)), "percentiles": "ddsketch", "measures": out}

    def _exact_summary(self, where: str, params: dict[str, Any]) -> tuple[int, list[dict]]:
        selects = ["count()"]
        for measure in REQUEST_MEASURES:
            column = f"{measure}_ns"
            selects.append(f"count({column}), avg({column}), quantilesExactInclusive(0.5, 0.95, 0.99)({column})")
        rows = self.store.query(f"SELECT {', '.join(selects)} {_REQUESTS_FROM} WHERE {where}", params)
        request_count, *values = rows[0] if rows else (0, *([0, None, []] * len(REQUEST_MEASURES)))
        out = []
        for index, measure in enumerate(REQUEST_MEASURES):
            count, avg_ns, quantiles_ns = values[3 * index : 3 * index + 3]
            count = int(count)
            if count == 0:
                out.append(
                    {
                        "measure": measure,
                        "count": 0,
                        "avg_seconds": None,
                        "p50_seconds": None,
                        "p95_seconds": None,
                        "p99_seconds": None,
                    }
                )
                continue
            p50, p95, p99 = (_seconds(q) for q in quantiles_ns)
            out.append(
                {
                    "measure": measure,
                    "count": count,
                    "avg_seconds": _seconds(avg_ns),
                    "p50_seconds": p50,
                    "p95_seconds": p95,
                    "p99_seconds": p99,
                }
            )
        return int(request_count), out

    def has_endpoint(self, endpoint: str) -> bool:
        """Whether any request row of ``endpoint`` (exact match) is stored, at any time."""
        rows = self.store.query(
            "SELECT count() FROM inferpath_requests WHERE endpoint = {endpoint:String}", {"endpoint": endpoint}
        )
        return bool(rows and rows[0][0])

    def request_count(
        self,
        start: datetime,
        end: datetime,
        *,
        endpoint: str | None = None,
        endpoint_class: str | None = None,
        columns: dict[str, str] | None = None,
    ) -> int:
        """Number of requests (distinct traces) with ``timestamp`` in ``[start, end)``
        (``columns``: exact-match row filters, :func:`row_filters`)."""
        params: dict[str, Any] = self._range(start, end)
        where = self._filters(params, endpoint, endpoint_class, columns)
        rows = self.store.query(f"SELECT count() {_REQUESTS_FROM} WHERE {where}", params)
        return int(rows[0][0]) if rows else 0

    def requests(
        self,
        start: datetime,
        end: datetime,
        *,
        endpoint: str | None = None,
        endpoint_class: str | None = None,
        columns: dict[str, str] | None = None,
        limit: int = 1000,
        order: Literal["timestamp", "slowest"] = "timestamp",
    ) -> list[dict]:
        """Request rows with ``timestamp`` in ``[start, end)``, as dicts keyed by column.

        Keys are :data:`~inferpath.storage.rows.REQUEST_COLUMNS` (durations stay in ns).
        ``order="timestamp"``: newest first. ``order="slowest"``: by end-to-end latency
        (client-side ``client_e2e_ns`` if measured, else ``e2e_ns``) descending, rows with
        neither last. ``limit``: 1..10000. ``columns``: exact-match row filters
        (:func:`row_filters`).
        """
        params: dict[str, Any] = self._range(start, end)
        where = self._filters(params, endpoint, endpoint_class, columns)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit must be an integer in 1..{MAX_LIMIT}, got {limit!r}")
        order_by = {
            "timestamp": "timestamp DESC, trace_id",
            "slowest": "coalesce(client_e2e_ns, e2e_ns) DESC NULLS LAST, timestamp DESC",
        }.get(order)
        if order_by is None:
            raise ValueError(f"order must be 'timestamp' or 'slowest', got {order!r}")
        params["limit"] = limit
        return self.store.query_dicts(
            f"SELECT {', '.join(REQUEST_COLUMNS)} {_REQUESTS_FROM} WHERE {where}"
            f" ORDER BY {order_by} LIMIT {{limit:UInt32}}",
            params,
        )

    # ------------------------------------------------------------------ traces
    def trace_spans(self, trace_id: str) -> list[SpanRow]:
        """All spans of one trace, ordered by start time.

        Finds the trace's time bounds in ``otel_traces_trace_id_ts`` first, as the
        exporter's documented Grafana query does, so only the trace's days are scanned.
        Two queries, not the Grafana query's one with scalar subqueries: the bounds are
        passed as parameters, and an unknown trace costs one small lookup (a third of the
        single query's CPU; a stored trace about the same: bench/read_trace.py).
        Each span id appears once (duplicates from client retries are dropped).
        ``trace_id``: 32 hex characters (any case). Returns ``[]`` for an unknown trace.
        Raises ``ValueError`` for a malformed ``trace_id``.
        """
        if not isinstance(trace_id, str) or not _TRACE_ID.match(trace_id):
            raise ValueError(f"trace_id must be 32 hex characters, got {trace_id!r}")
        params: dict[str, Any] = {"trace_id": trace_id.lower()}
        bounds = self.store.query(
            "SELECT count(), toUInt32(min(Start)), toUInt32(max(End)) FROM otel_traces_trace_id_ts"
            " WHERE TraceId = {trace_id:String}"
            # A primary-key lookup (the table is ordered by TraceId): one thread does it in
            # a third of the CPU that the default two take (1.8 against 6.2 ms measured).
            " SETTINGS max_threads = 1",
            params,
        )
        if not bounds or not bounds[0][0]:
            return []
        _, params["trace_start"], params["trace_end"] = bounds[0]  # Unix seconds
        columns = ", ".join(SPAN_COLUMNS)
        sql = (
            f"SELECT {columns} FROM otel_traces"
            " WHERE TraceId = {trace_id:String}"
            # Start/End are whole seconds (DateTime): +1 covers the last span's fraction.
            " AND Timestamp >= toDateTime64({trace_start:UInt32}, 9, 'UTC')"
            " AND Timestamp < toDateTime64({trace_end:UInt32} + 1, 9, 'UTC')"
            " ORDER BY Timestamp, SpanId"
            # A span re-sent inside a different export body (so not deduplicated at insert)
            # is shown once.
            " LIMIT 1 BY SpanId"
        )
        rows = self.store.query(sql, params)
        return [SpanRow.from_db_row(row) for row in rows]

    # ------------------------------------------------------------------ time series
    def ttft_timeseries(
        self,
        start: datetime,
        end: datetime,
        *,
        step_seconds: int,
        endpoint_class: str | None = None,
    ) -> list[dict]:
        """Time to first token per time bucket and endpoint class.

        TTFT of a request: the client-side ``client_ttft_ns`` if measured, else the
        gateway's ``ttft_ns``; requests with neither are left out. Buckets are
        ``step_seconds`` wide, aligned to the Unix epoch, labelled by their start.
        Returns dicts ordered by bucket, endpoint class with keys ``bucket`` (aware UTC
        datetime), ``endpoint_class``, ``count``, ``avg_seconds``, ``p50_seconds``,
        ``p99_seconds``.
        """
        params: dict[str, Any] = self._range(start, end)
        params["step"] = self._step(params["start"], params["end"], step_seconds)
        where = self._filters(params, None, endpoint_class)
        sql = (
            "SELECT toDateTime64(intDiv(toUnixTimestamp(timestamp), {step:UInt32}) * {step:UInt32}, 0, 'UTC') AS bucket,"
            " endpoint_class, count() AS n, avg(ttft) AS avg_ns,"
            " quantilesExactInclusive(0.5, 0.99)(ttft) AS q"
            f" FROM (SELECT timestamp, endpoint_class, {CLIENT_FIRST_SQL['ttft']} AS ttft"
            f" {_REQUESTS_FROM} WHERE {where})"
            " WHERE ttft IS NOT NULL"
            " GROUP BY bucket, endpoint_class ORDER BY bucket, endpoint_class"
        )
        out = []
        for bucket, klass, count, avg_ns, quantiles in self.store.query(sql, params):
            out.append(
                {
                    "bucket": bucket,
                    "endpoint_class": klass,
                    "count": int(count),
                    "avg_seconds": _seconds(avg_ns),
                    "p50_seconds": _seconds(quantiles[0]),
                    "p99_seconds": _seconds(quantiles[1]),
                }
            )
        return out

    def gauge_timeseries(
        self,
        metric_name: str,
        start: datetime,
        end: datetime,
        *,
        step_seconds: int,
    ) -> list[dict]:
        """Average of one gauge metric per time bucket, service and attribute set.

        Reads ``otel_metrics_gauge`` rows named ``metric_name`` with ``TimeUnix`` in
        ``[start, end)``. Buckets as in :meth:`ttft_timeseries`. Returns dicts ordered by
        bucket with keys ``bucket`` (aware UTC datetime), ``service_name``, ``attributes``
        (dict), ``value`` (mean of the points in the bucket, in the metric's unit).
        """
        if not isinstance(metric_name, str) or not metric_name or len(metric_name) > 512:
            raise ValueError(f"metric_name must be a non-empty string of at most 512 characters, got {metric_name!r}")
        params: dict[str, Any] = self._range(start, end)
        params["step"] = self._step(params["start"], params["end"], step_seconds)
        params["metric"] = metric_name
        sql = (
            "SELECT toDateTime64(intDiv(toUnixTimestamp(TimeUnix), {step:UInt32}) * {step:UInt32}, 0, 'UTC') AS bucket,"
            " ServiceName, Attributes, avg(Value)"
            " FROM otel_metrics_gauge"
            " WHERE MetricName = {metric:String}"
            " AND TimeUnix >= {start:DateTime64(9, 'UTC')} AND TimeUnix < {end:DateTime64(9, 'UTC')}"
            " GROUP BY bucket, ServiceName, Attributes"
            " ORDER BY bucket, ServiceName, toString(Attributes)"
        )
        return [
            {"bucket": bucket, "service_name": service, "attributes": dict(attributes), "value": float(value)}
            for bucket, service, attributes, value in self.store.query(sql, params)
        ]

    def alert_changes(self, start: datetime, end: datetime, limit: int = 1000) -> list[dict]:
        """State changes of alerts in ``inferpath_alerts`` with ``start ≤ timestamp < end``
        (aware), oldest first, at most ``limit`` (1..:data:`MAX_LIMIT`): dicts with
        ``timestamp``, ``rule``, ``fingerprint``, ``state`` (``pending``, ``firing``,
        ``resolved``, ``inactive``), ``labels``, ``annotations`` (dicts), ``value``. The alert
        evaluator writes the table (few rows: state changes only, so any range is cheap);
        this is its read for the read API. ``ValueError`` for naive times, ``end <= start``
        or a bad ``limit``."""
        start_utc, end_utc = ensure_aware(start, "start"), ensure_aware(end, "end")
        if end_utc <= start_utc:
            raise ValueError(f"end must be after start, got start={start_utc} end={end_utc}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit must be an integer in 1..{MAX_LIMIT}, got {limit!r}")
        sql = (
            "SELECT timestamp, rule, fingerprint, state, labels, annotations, value FROM inferpath_alerts"
            " WHERE timestamp >= {start:DateTime64(9, 'UTC')} AND timestamp < {end:DateTime64(9, 'UTC')}"
            " ORDER BY timestamp, rule, fingerprint LIMIT {limit:UInt32}"
        )
        return self.store.query_dicts(sql, {"start": start_utc, "end": end_utc, "limit": limit})


# ---------------------------------------------------------------------------- dashboard views
def latency_view_points(
    store: Store,
    start: datetime,
    end: datetime,
    *,
    step_seconds: int,
    endpoint_class: str | None = None,
    plan: WindowPlan | None = None,
    columns: dict[str, str] | None = None,
) -> list[dict]:
    """Per bucket and endpoint class, ordered by them: dicts with ``bucket`` (aware UTC
    datetime, the bucket's start; buckets ``step_seconds`` wide, aligned to the Unix epoch),
    ``endpoint_class``, ``requests``, ``errors``, and for ``ttft``, ``itl`` and ``e2e`` the
    ``{measure}_avg_seconds``, ``_p50_seconds``, ``_p95_seconds``, ``_p99_seconds``
    (``None`` where no request of the bucket measured it).

    TTFT and E2E are the client's when measured, else the gateway's (as
    :meth:`Reader.ttft_timeseries`); ``errors`` counts rows with status ``error``.
    Percentiles are exact (R type 7) per bucket, or, given a rollup ``plan``
    (:meth:`Reader.latency_view_plan`, aligned to ``step_seconds``), merged per-minute
    DDSketches (within 0.5 % of a value of that rank). ``columns``: service / model /
    replica filters (:func:`row_filters`), which the rollups cannot apply: with any,
    ``plan`` must be ``None`` (``ValueError`` otherwise).
    """
    if plan is not None:
        if columns:
            raise ValueError("columns: the rollups hold no service, model or replica; read the raw rows")
        return _latency_points_from_rollup(store, plan, step_seconds, endpoint_class)
    params: dict = {"start": start, "end": end, "step": step_seconds}
    where = _REQUESTS_RANGE
    if endpoint_class:
        where += " AND endpoint_class = {endpoint_class:String}"
        params["endpoint_class"] = endpoint_class
    where += row_filter_sql(columns, params)
    measures = ("ttft", "itl", "e2e")
    aggregates = ", ".join(f"avg({m}), quantilesExactInclusive{VIEW_QUANTILES}({m})" for m in measures)
    sql = (
        "SELECT toDateTime64(intDiv(toUnixTimestamp(timestamp), {step:UInt32}) * {step:UInt32}, 0, 'UTC')"
        " AS bucket, endpoint_class, count(), countIf(status = 'error'), "
        + aggregates
        + " FROM (SELECT timestamp, endpoint_class, status,"
        f" {CLIENT_FIRST_SQL['ttft']} AS ttft, itl_ns AS itl,"
        f" {CLIENT_FIRST_SQL['e2e']} AS e2e"
        f" {_REQUESTS_FROM} WHERE {where})"
        " GROUP BY bucket, endpoint_class ORDER BY bucket, endpoint_class"
    )
    points = []
    for row in store.query(sql, params):
        bucket, klass, count, errors, *stats = row
        point = {"bucket": bucket, "endpoint_class": klass, "requests": int(count), "errors": int(errors)}
        for index, measure in enumerate(measures):
            avg_ns, quantiles_ns = stats[2 * index], stats[2 * index + 1]
            point[f"{measure}_avg_seconds"] = _seconds(avg_ns)
            for q, value in zip(("p50", "p95", "p99"), quantiles_ns or (None,) * 3):
                # An all-null bucket gives NaN quantiles: missing, not zero.
                point[f"{measure}_{q}_seconds"] = None if point[f"{measure}_avg_seconds"] is None else _seconds(value)
        points.append(point)
    return points


def _latency_points_from_rollup(
    store: Store, plan: WindowPlan, step_seconds: int, endpoint_class: str | None
) -> list[dict]:
    """:func:`latency_view_points` from the request rollups (:func:`~inferpath.storage.rollup.aggregate`)."""
    level = {q: QUANTILE_LEVELS.index(q) for q in VIEW_QUANTILES}
    measures = {"ttft": "ttft_best", "itl": "itl", "e2e": "e2e_best"}
    rows = aggregate(
        store,
        plan,
        measures=measures.values(),
        step_seconds=step_seconds,
        filters={"endpoint_class": endpoint_class} if endpoint_class else None,
    )
    points = []
    for row in rows:
        point = {
            "bucket": row["bucket"],
            "endpoint_class": row["endpoint_class"],
            "requests": row["requests"],
            "errors": row["errors"],
        }
        for name, measure in measures.items():
            count = row[f"{measure}_count"]
            point[f"{name}_avg_seconds"] = row[f"{measure}_sum_ns"] / count / _NS_PER_SECOND if count else None
            for q in VIEW_QUANTILES:
                point[f"{name}_p{round(q * 100)}_seconds"] = _seconds(row[f"{measure}_q"][level[q]]) if count else None
        points.append(point)
    return points


def gauge_step_rows(
    store: Store, metrics: Sequence[str], start: datetime, end: datetime, *, step_seconds: int
) -> list[dict]:
    """Per gauge of ``metrics`` (``otel_metrics_gauge`` names), step and series (service,
    attributes), ordered by metric and step: dicts with ``signal``, ``bucket`` (aware UTC
    datetime, the step's start; steps ``step_seconds`` wide, aligned to the Unix epoch),
    ``service_name``, ``attributes`` (dict), ``max_value`` and ``avg_value`` (of the
    series' samples in the step, the metric's unit), ``last_time`` (its last sample's time).
    A step without a sample of a series has no row."""
    sql = (
        "SELECT MetricName, toDateTime64(intDiv(toUnixTimestamp(TimeUnix), {step:UInt32}) * {step:UInt32}, 0, 'UTC')"
        " AS bucket, ServiceName, Attributes, max(Value), avg(Value), max(TimeUnix)"
        " FROM otel_metrics_gauge WHERE MetricName IN {names:Array(String)}"
        " AND TimeUnix >= {start:DateTime64(9, 'UTC')} AND TimeUnix < {end:DateTime64(9, 'UTC')}"
        " GROUP BY MetricName, bucket, ServiceName, Attributes ORDER BY MetricName, bucket"
    )
    return [
        {
            "signal": name,
            "bucket": bucket,
            "service_name": service,
            "attributes": dict(attributes),
            "max_value": float(high),
            "avg_value": float(mean),
            "last_time": last,
        }
        for name, bucket, service, attributes, high, mean, last in store.query(
            sql, {"names": list(metrics), "start": start, "end": end, "step": step_seconds}
        )
    ]


def fleet_series_rows(store: Store, start: datetime, end: datetime) -> list[dict]:
    """Every canonical signal series (:data:`~inferpath.vocabulary.SIGNALS`) with samples in
    ``[start, end)``, one dict per (signal, service, attributes), gauges first, each kind
    ordered by service, attributes, signal: ``signal``, ``kind`` (``gauge`` / ``sum``),
    ``service_name``, ``attributes`` (dict), ``samples``, ``last_time``, ``last_value``,
    ``min_value``, ``avg_value``, ``max_value`` (the signal's unit). Gauges from
    ``otel_metrics_gauge``, counters (``preemptions_total``) from ``otel_metrics_sum`` with
    ``increase`` = last − first (resets not handled: an estimate for a table)."""
    out = []
    for table, kind in (("otel_metrics_gauge", "gauge"), ("otel_metrics_sum", "sum")):
        names = [name for name, signal in SIGNALS.items() if signal.kind == kind]
        sql = (
            "SELECT MetricName, ServiceName, Attributes, count(), max(TimeUnix),"
            " argMax(Value, TimeUnix), argMin(Value, TimeUnix), min(Value), avg(Value), max(Value)"
            f" FROM {table} WHERE MetricName IN {{names:Array(String)}}"
            " AND TimeUnix >= {start:DateTime64(9, 'UTC')} AND TimeUnix < {end:DateTime64(9, 'UTC')}"
            " GROUP BY MetricName, ServiceName, Attributes"
            " ORDER BY ServiceName, toString(Attributes), MetricName"
        )
        for name, service, attributes, count, last_time, last, first, low, mean, high in store.query(
            sql, {"names": names, "start": start, "end": end}
        ):
            row = {
                "signal": name,
                "kind": kind,
                "service_name": service,
                "attributes": dict(attributes),
                "samples": int(count),
                "last_time": last_time,
                "last_value": float(last),
                "min_value": float(low),
                "avg_value": float(mean),
                "max_value": float(high),
            }
            if kind == "sum":
                row["increase"] = float(last) - float(first)
            out.append(row)
    return out
