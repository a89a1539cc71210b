"""The requests of one window as the diagnosis reads them: counts, exact quantiles, a few rows.

The diagnosis rules (:mod:`inferpath.analysis.diagnosis`) need, per window, the request
count, exact quantiles of a dozen columns, the rows of the tail band (about a tenth) and the
rows of replicas that are starting. Two implementations answer the same questions:

- :class:`RowsWindow` over request-row dicts held in Python (tests, other sources);
- :class:`StoredWindow` over ``inferpath_requests`` (``FINAL``): counts and quantiles are
  aggregated in ClickHouse (``quantilesExactInclusive``, type 7 like
  :func:`inferpath.analysis.percentiles.quantile`), and only the tail band's and starting
  replicas' rows are read. An hour of traffic at 50 requests/s is 180,000 rows; the tail is
  18,000.

Quantiles agree to float rounding (interpolated by ClickHouse instead of Python); a value
never crosses a band edge because of it, as the values are integer nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from inferpath.analysis.breakdown import (
    FINAL_SETTINGS, REST, STAGES, measure_stages, request_breakdown, request_filter,
)
from inferpath.analysis.percentiles import sorted_quantile

WINDOW_COLUMNS: tuple[str, ...] = ("timestamp", "trace_id", "replica", "ttft_ns", "e2e_ns", "itl_ns",
                                   *(f"{stage}_ns" for stage in STAGES))
"""The request columns the diagnosis reads."""
MEASURED_COLUMNS: tuple[str, ...] = tuple(c for c in WINDOW_COLUMNS if c.endswith("_ns"))
QUANTILE_LEVELS: tuple[float, ...] = (0.5, 0.9, 0.99)
"""The quantiles :class:`StoredWindow` computes in one pass; others cost a query each."""


@dataclass
class TailSums:
    """Integer sums over the tail band of one measure (rows whose measure is ``≥`` an edge).

    ``count``: rows in the band; ``total_ns``: sum of the measure over them; ``stage_ns``:
    stage -> sum over them of the measure's stages (unmeasured = 0) and ``"rest"`` (measure −
    stages); ``kept_count`` / ``kept_stage_ns``: the same over the rows whose ``trace_id`` was
    not excluded; ``excluded_total_ns``: sum of the measure over the excluded rows. All ns.
    """

    count: int
    total_ns: int
    stage_ns: dict[str, int]
    kept_count: int
    kept_stage_ns: dict[str, int]
    excluded_total_ns: int


class RowsWindow:
    """A window's request rows in memory. ``rows``: dicts of :data:`WINDOW_COLUMNS` (more
    keys are fine). Each column is sorted once, on first use."""

    def __init__(self, rows: Iterable[Mapping[str, Any]] = ()) -> None:
        self.rows = list(rows)
        self._sorted: dict[str, list[float]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def values(self, column: str) -> list[float]:
        """``column``'s non-null values, sorted ascending."""
        if column not in self._sorted:
            self._sorted[column] = sorted(float(r[column]) for r in self.rows if r.get(column) is not None)
        return self._sorted[column]

    def measured(self, column: str) -> int:
        """Rows with a value in ``column``."""
        return len(self.values(column))

    def quantile(self, column: str, q: float) -> float | None:
        """Exact ``q``-quantile (type 7) of ``column``; ``None`` when no row measured it."""
        values = self.values(column)
        return sorted_quantile(values, q) if values else None

    def rows_at_or_above(self, column: str, edge: float) -> list[Mapping[str, Any]]:
        """Rows whose ``column`` is measured and ``≥ edge``, in row order."""
        return [r for r in self.rows if r.get(column) is not None and r[column] >= edge]

    def tail_sums(self, measure: str, edge: float, exclude: Iterable[str] = ()) -> TailSums:
        """:class:`TailSums` of the rows whose ``<measure>_ns`` is ``≥ edge``, rows with a
        ``trace_id`` in ``exclude`` left out of the kept sums. Raises ``ValueError`` for a
        negative duration (:func:`~inferpath.analysis.breakdown.request_breakdown`)."""
        names = (*measure_stages(measure), REST)
        excluded = set(exclude)
        sums, kept_sums = dict.fromkeys(names, 0), dict.fromkeys(names, 0)
        count = kept = total = excluded_total = 0
        for row in self.rows_at_or_above(f"{measure}_ns", edge):
            item = request_breakdown(row, measure)
            count, total = count + 1, total + item.total_ns
            for name in names:
                sums[name] += item.stage_ns[name]
            if row.get("trace_id") in excluded:
                excluded_total += item.total_ns
                continue
            kept += 1
            for name in names:
                kept_sums[name] += item.stage_ns[name]
        return TailSums(count, total, sums, kept, kept_sums, excluded_total)

    def replica_spans(self) -> dict[Any, tuple[datetime, datetime] | None]:
        """Replica -> (first, last) request time (``None`` when no row has a datetime)."""
        spans: dict[Any, tuple[datetime, datetime] | None] = {}
        for row in self.rows:
            replica, ts = row.get("replica"), row.get("timestamp")
            span = spans.setdefault(replica, None)
            if isinstance(ts, datetime):
                spans[replica] = (ts, ts) if span is None else (min(span[0], ts), max(span[1], ts))
        return spans

    def rows_of(self, replicas: Iterable[Any]) -> list[Mapping[str, Any]]:
        """The rows of ``replicas``, in row order."""
        wanted = set(replicas)
        return [r for r in self.rows if r.get("replica") in wanted]


class StoredWindow:
    """The ``ok`` request rows with ``start ≤ timestamp < end`` (of ``endpoint`` when given)
    in ``store``, answered by aggregate queries. Datetimes must be timezone-aware
    (``ValueError`` from the store otherwise). One query at construction reads the count and
    :data:`QUANTILE_LEVELS` of every measured column; the replica spans are read on first use."""

    def __init__(self, store: Any, *, start: datetime, end: datetime, endpoint: str | None = None) -> None:
        self.store, self.start, self.end, self.endpoint = store, start, end, endpoint
        self._where, self._parameters = request_filter(start=start, end=end, endpoint=endpoint)
        levels = ", ".join(repr(q) for q in QUANTILE_LEVELS)
        aggregates = ", ".join(f"count({c}), quantilesExactInclusive({levels})({c})" for c in MEASURED_COLUMNS)
        row = store.query(f"SELECT count(), {aggregates} FROM inferpath_requests FINAL WHERE {self._where}"
                          f"{FINAL_SETTINGS}",
                          self._parameters)[0]
        self._count = int(row[0])
        self._measured: dict[str, int] = {}
        self._quantiles: dict[tuple[str, float], float | None] = {}
        for index, column in enumerate(MEASURED_COLUMNS):
            count, values = int(row[1 + 2 * index]), row[2 + 2 * index]
            self._measured[column] = count
            for q, value in zip(QUANTILE_LEVELS, values):
                self._quantiles[(column, q)] = float(value) if count else None
        self._spans: dict[Any, tuple[datetime, datetime] | None] | None = None

    def __len__(self) -> int:
        return self._count

    def measured(self, column: str) -> int:
        """Rows with a value in ``column`` (one of :data:`MEASURED_COLUMNS`, ``KeyError`` otherwise)."""
        return self._measured[column]

    def quantile(self, column: str, q: float) -> float | None:
        """Exact ``q``-quantile (type 7) of ``column``; ``None`` when no row measured it."""
        key = (column, q)
        if key not in self._quantiles:
            if column not in MEASURED_COLUMNS:
                raise ValueError(f"column: {column!r} is not one of {MEASURED_COLUMNS}")
            value = self.store.query(
                f"SELECT quantileExactInclusive({float(q)!r})({column}) FROM inferpath_requests FINAL"
                f" WHERE {self._where} AND {column} IS NOT NULL{FINAL_SETTINGS}", self._parameters)[0][0]
            self._quantiles[key] = float(value) if self._measured[column] else None
        return self._quantiles[key]

    def rows_at_or_above(self, column: str, edge: float) -> list[Mapping[str, Any]]:
        """Rows (dicts of :data:`WINDOW_COLUMNS`) whose ``column`` is ``≥ edge``, oldest first."""
        if column not in MEASURED_COLUMNS:
            raise ValueError(f"column: {column!r} is not one of {MEASURED_COLUMNS}")
        sql = (f"SELECT {', '.join(WINDOW_COLUMNS)} FROM inferpath_requests FINAL"
               f" WHERE {self._where} AND {column} >= {{edge:Float64}} ORDER BY timestamp{FINAL_SETTINGS}")
        return self.store.query_dicts(sql, self._parameters | {"edge": float(edge)})

    def tail_sums(self, measure: str, edge: float, exclude: Iterable[str] = ()) -> TailSums:
        """:class:`TailSums` of the rows whose ``<measure>_ns`` is ``≥ edge``, summed in the
        store (``Int64`` sums are exact, so they equal :meth:`RowsWindow.tail_sums`)."""
        stages = measure_stages(measure)
        column = f"{measure}_ns"
        stage_values = ", ".join(f"coalesce({s}_ns, 0) AS {s}" for s in stages)
        sums = ", ".join(f"sum({s})" for s in stages)
        kept_sums = ", ".join(f"sumIf({s}, kept)" for s in stages)
        sql = (
            f"SELECT count(), sum(total), {sums}, countIf(kept), {kept_sums}, sumIf(total, NOT kept)"
            f" FROM (SELECT assumeNotNull({column}) AS total, {stage_values},"
            "  NOT has({exclude:Array(String)}, trace_id) AS kept"
            f"  FROM inferpath_requests FINAL WHERE {self._where} AND {column} >= {{edge:Float64}})"
            f"{FINAL_SETTINGS}"
        )
        row = self.store.query(sql, self._parameters | {"edge": float(edge),
                                                       "exclude": sorted(set(exclude))})[0]
        n = len(stages)
        count, total = int(row[0]), int(row[1])
        stage_sum = {s: int(v) for s, v in zip(stages, row[2:2 + n])}
        kept, kept_sum = int(row[2 + n]), {s: int(v) for s, v in zip(stages, row[3 + n:3 + 2 * n])}
        kept_total = sum(int(v) for v in row[3 + n:3 + 2 * n])
        excluded_total = int(row[3 + 2 * n])
        stage_sum[REST] = total - sum(stage_sum[s] for s in stages)
        kept_sum[REST] = (total - excluded_total) - kept_total
        return TailSums(count, total, stage_sum, kept, kept_sum, excluded_total)

    def replica_spans(self) -> dict[Any, tuple[datetime, datetime] | None]:
        """Replica -> (first, last) request time."""
        if self._spans is None:
            rows = self.store.query(
                f"SELECT replica, min(timestamp), max(timestamp) FROM inferpath_requests FINAL"
                f" WHERE {self._where} GROUP BY replica{FINAL_SETTINGS}", self._parameters)
            self._spans = {replica: (first, last) for replica, first, last in rows}
        return self._spans

    def rows_of(self, replicas: Iterable[Any]) -> list[Mapping[str, Any]]:
        """The rows (dicts of :data:`WINDOW_COLUMNS`) of ``replicas``, oldest first."""
        wanted = sorted(str(r) for r in set(replicas) if r is not None)
        if not wanted:
            return []
        return self.store.query_dicts(
            f"SELECT {', '.join(WINDOW_COLUMNS)} FROM inferpath_requests FINAL WHERE {self._where}"
            f" AND replica IN {{replicas:Array(String)}} ORDER BY timestamp{FINAL_SETTINGS}",
            self._parameters | {"replicas": wanted})


RequestWindow = RowsWindow | StoredWindow


def as_window(rows: RequestWindow | Sequence[Mapping[str, Any]]) -> RequestWindow:
    """``rows`` as a window: a :class:`RowsWindow` or :class:`StoredWindow` as is, a sequence
    of request-row dicts wrapped in a :class:`RowsWindow`."""
    if isinstance(rows, (RowsWindow, StoredWindow)):
        return rows
    return RowsWindow(rows)


__all__ = ["MEASURED_COLUMNS", "QUANTILE_LEVELS", "RequestWindow", "RowsWindow", "StoredWindow",
           "TailSums", "WINDOW_COLUMNS", "as_window"]
