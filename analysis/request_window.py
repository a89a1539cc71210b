"""The requests of one window as the diagnosis reads them: counts, exact quantiles, a few rows.

The diagnosis rules (:mod:`inferpath.analysis.diagnosis`) need, per window, the request
count, exact quantiles of a dozen columns, the rows of the tail band (about a tenth) and the
rows of replicas that are starting. Two implementations answer the same questions:

- :class:`RowsWindow` over request-row dicts held in Python (tests, other sources);
- :class:`StoredWindow` over ``inferpath_requests`` (``FINAL``): counts, quantiles and the
  tail band's sums are aggregated in ClickHouse (``quantilesExactInclusive``, type 7 like
  :func:`inferpath.analysis.percentiles.quantile`), and only starting replicas' rows are
  read. An hour of traffic at 50 requests/s is 180,000 rows; the tail is 18,000.

The table is ordered by ``trace_id``, so a time filter skips little inside an hourly
partition and a query costs about what the columns it reads cost. Hence
:meth:`StoredWindow.pair`: the window and its baseline are read by the same scans
(``-If`` combinators), and each scan reads only the columns the verdict needs so far —
the three compared measures for a healthy verdict; the stages of the degraded measure
when a cause is attributed (:func:`prepare_attribution`); the columns the evidence quotes
(:func:`prefetch_quantiles`).

Quantiles agree to float rounding (interpolated by ClickHouse instead of Python); a value
never crosses a band edge because of it, as the values are integer nanoseconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from inferpath.analysis.breakdown import (
    FINAL_SETTINGS,
    REST,
    measure_stages,
    request_breakdown,
    request_filter,
    stage_columns,
    stage_sql,
)
from inferpath.analysis.engine_histograms import LatencyHistogram
from inferpath.analysis.percentiles import sorted_quantile
from inferpath.vocabulary import (
    BREAKDOWN_STAGES,
    CLIENT_FIRST_SQL,
    ENGINE_SEND_COLUMN,
    TTFT_PHASE_COLUMNS,
    client_first_ns,
)

MEASURE_SQL: dict[str, str] = {f"{measure}_ns": sql for measure, sql in CLIENT_FIRST_SQL.items()}
"""A request's TTFT and E2E as the diagnosis reads them, keyed by column: the client's own
measure, else the server's (:data:`~inferpath.vocabulary.CLIENT_FIRST_SQL`, what every
reader shows). The hop from the client to the first server is then a stage of it
(``network_ttft_ns``); a row with only client spans (OpenLLMetry, the GenAI
instrumentations in the caller) has all its time in ``rest``."""


def column_sql(column: str) -> str:
    """SQL of ``column`` as the diagnosis reads it (:data:`MEASURE_SQL`)."""
    return MEASURE_SQL.get(column, column)


def with_client_measures(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """``row`` with ``ttft_ns`` / ``e2e_ns`` as :data:`MEASURE_SQL` reads them (the client's
    where measured)."""
    judged = {f"{m}_ns": client_first_ns(row, m) for m in CLIENT_FIRST_SQL}
    if all(row.get(c) == v for c, v in judged.items()):
        return row
    return {**row, **judged}


WINDOW_COLUMNS: tuple[str, ...] = (
    "timestamp",
    "trace_id",
    "replica",
    "endpoint_class",
    "ttft_ns",
    "e2e_ns",
    "client_ttft_ns",
    "client_e2e_ns",
    "itl_ns",
    *(f"{stage}_ns" for stage in BREAKDOWN_STAGES),
    *TTFT_PHASE_COLUMNS.values(),
    ENGINE_SEND_COLUMN,
)
"""The request columns the diagnosis reads (the TTFT-phase parts of gateway and network too:
a TTFT tail is attributed with them, as the breakdown does; the hop into the engine's trip
out, to tell a queue in front of the engine from a late read)."""
MEASURED_COLUMNS: tuple[str, ...] = (
    "ttft_ns",
    "e2e_ns",
    "itl_ns",
    *(f"{stage}_ns" for stage in BREAKDOWN_STAGES),
    *TTFT_PHASE_COLUMNS.values(),
    ENGINE_SEND_COLUMN,
)
QUANTILE_LEVELS: tuple[float, ...] = (0.1, 0.5, 0.9, 0.99)
"""The quantiles :class:`StoredWindow` computes in one pass (0.1: a hop's floor,
``diagnosis.HOP_FLOOR_QUANTILE``); others cost a query each."""
FIRST_COLUMNS: tuple[str, ...] = ("ttft_ns", "e2e_ns", "itl_ns")
"""The columns every diagnosis reads (the measures compared at p99); a healthy verdict reads
no other. Each column read costs about as much as the scan itself, so the stage columns
wait until a cause is attributed."""


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


@dataclass(frozen=True)
class ClassStats:
    """One measure over one endpoint class of a window: ``count`` rows with it, ``mean_ns``,
    ``quantiles_ns`` (quantile → exact value, type 7, ns)."""

    count: int
    mean_ns: float
    quantiles_ns: dict[float, float]


class RowsWindow:
    """A window's request rows in memory. ``rows``: dicts of :data:`WINDOW_COLUMNS` (more
    keys are fine). Each column is sorted once, on first use."""

    def __init__(self, rows: Iterable[Mapping[str, Any]] = ()) -> None:
        self.rows = [with_client_measures(row) for row in rows]
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
            if item is None:  # no such measure on the row: not part of the tail
                continue
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

    def class_stats(self, measures: Sequence[str], quantiles: Sequence[float]) -> dict[str, dict[str, ClassStats]]:
        """Measure → endpoint class → :class:`ClassStats` of ``<measure>_ns`` (rows without it skipped)."""
        out: dict[str, dict[str, ClassStats]] = {}
        for measure in measures:
            grouped: dict[str, list[float]] = {}
            for row in self.rows:
                value = row.get(f"{measure}_ns")
                if value is not None:
                    grouped.setdefault(str(row.get("endpoint_class") or ""), []).append(float(value))
            per_class = out.setdefault(measure, {})
            for name, values in grouped.items():
                values.sort()
                per_class[name] = ClassStats(
                    len(values), sum(values) / len(values), {q: sorted_quantile(values, q) for q in quantiles}
                )
        return out

    def replicas(self) -> set[Any]:
        """The replicas serving the window's rows."""
        return {row.get("replica") for row in self.rows}

    def replica_spans(self) -> dict[Any, tuple[datetime, datetime] | None]:
        """Replica -> (first, last) request time (``None`` when no row has a datetime)."""
        spans: dict[Any, tuple[datetime, datetime] | None] = {}
        for row in self.rows:
            replica, ts = row.get("replica"), row.get("timestamp")
            span = spans.setdefault(replica, None)
            if isinstance(ts, datetime):
                spans[replica] = (ts, ts) if span is None else (min(span[0], ts), max(span[1], ts))
        return spans

    def missing_reasons(self, limit: int = 3) -> list[tuple[str, int]]:
        """The most common ``missing_measures`` texts of the window's rows (why a measure
        could not be taken from their source) with their counts, most common first."""
        counts: dict[str, int] = {}
        for row in self.rows:
            text = row.get("missing_measures") or ""
            if text:
                counts[text] = counts.get(text, 0) + 1
        return sorted(counts.items(), key=lambda item: -item[1])[:limit]

    def quantiles_excluding(
        self, replicas: Iterable[Any], column: str, quantiles: Sequence[float]
    ) -> list[float] | None:
        """Exact quantiles of ``column`` over the rows of every replica but ``replicas``;
        ``None`` when those rows have no value."""
        unwanted = set(replicas)
        values = sorted(
            float(r[column]) for r in self.rows if r.get("replica") not in unwanted and r.get(column) is not None
        )
        return [sorted_quantile(values, q) for q in quantiles] if values else None

    def rows_of(self, replicas: Iterable[Any]) -> list[Mapping[str, Any]]:
        """The rows of ``replicas``, in row order."""
        wanted = set(replicas)
        return [r for r in self.rows if r.get("replica") in wanted]


class _StoredAggregates:
    """Counts, exact quantiles, tail-band sums and replica spans of one or more windows of
    ``inferpath_requests FINAL``, each kind read for every window in one scan (``-If``
    combinators over the union of the windows).

    The first pass (at construction) holds what every diagnosis needs: the row counts, the
    replica sets and the quantiles of :data:`FIRST_COLUMNS`, the measures compared at p99. A
    healthy verdict stops there. :func:`prepare_attribution` reads the tail-band sums and the
    queue time's quantiles in one more scan; :func:`prefetch_quantiles`
    reads the columns the evidence will quote in one scan; any other column's quantiles are
    read (for every window) on first use.
    """

    def __init__(
        self,
        store: Any,
        windows: Sequence[tuple[datetime, datetime]],
        endpoint: str | None,
        columns: dict[str, str] | None = None,
        endpoint_class: str | None = None,
    ) -> None:
        self.store = store
        self.windows = list(windows)
        union_start, union_end = min(w[0] for w in windows), max(w[1] for w in windows)
        where, self.parameters = request_filter(
            start=union_start, end=union_end, endpoint=endpoint, endpoint_class=endpoint_class, columns=columns
        )
        self.conditions: list[str] = []
        for index, (start, end) in enumerate(self.windows):
            self.parameters |= {f"start_{index}": start, f"end_{index}": end}
            self.conditions.append(
                f"(timestamp >= {{start_{index}:DateTime64(9)}} AND timestamp < {{end_{index}:DateTime64(9)}})"
            )
        # Windows that do not touch leave a gap in the union: the OR keeps its partitions out.
        self.where = f"{where} AND ({' OR '.join(self.conditions)})"
        self.counts: list[int] = []
        self.measured: list[dict[str, int]] = [{} for _ in self.windows]
        self.quantiles: list[dict[tuple[str, float], float | None]] = [{} for _ in self.windows]
        self.tails: dict[tuple[int, str, float], tuple[int, int, dict[str, int]]] = {}
        self.spans: list[dict[Any, tuple[datetime, datetime] | None]] | None = None
        # The replica set rides along (a LowCardinality column costs little): with no new
        # replica and no start-up, the cold-start rule needs no replica spans.
        row = self._select(
            [f"countIf({c})" for c in self.conditions] + [f"groupUniqArrayIf(replica, {c})" for c in self.conditions],
            FIRST_COLUMNS,
        )
        n = len(self.windows)
        self.counts = [int(v) for v in row[:n]]
        self.replicas: list[list[Any]] = [list(v) for v in row[n : 2 * n]]
        self._read_quantiles(row[2 * n :], FIRST_COLUMNS)

    def _quantile_aggregates(self, columns: Sequence[str]) -> list[str]:
        levels = ", ".join(repr(q) for q in QUANTILE_LEVELS)
        return [
            aggregate
            for column in columns
            for condition in self.conditions
            for aggregate in (
                f"countIf({column_sql(column)} IS NOT NULL AND {condition})",
                f"quantilesExactInclusiveIf({levels})({column_sql(column)}, {condition})",
            )
        ]

    def _select(self, head: list[str], columns: Sequence[str], parameters: Mapping[str, Any] | None = None) -> tuple:
        aggregates = ", ".join([*head, *self._quantile_aggregates(columns)])
        return self.store.query(
            f"SELECT {aggregates} FROM inferpath_requests FINAL WHERE {self.where}{FINAL_SETTINGS}",
            self.parameters | dict(parameters or {}),
        )[0]

    def _read_quantiles(self, values: Sequence[Any], columns: Sequence[str]) -> None:
        position = 0
        for column in columns:
            for index in range(len(self.windows)):
                count, quantiles = int(values[position]), values[position + 1]
                position += 2
                self.measured[index][column] = count
                for q, value in zip(QUANTILE_LEVELS, quantiles):
                    self.quantiles[index][(column, q)] = float(value) if count else None

    def _read_spans(self) -> None:
        # One GROUP BY replica for every window (inside the other scans it would split their
        # aggregates per replica, and key/value arrays per row cost more than this query).
        bounds = ", ".join(f"minIf(timestamp, {c}), maxIf(timestamp, {c}), countIf({c})" for c in self.conditions)
        rows = self.store.query(
            f"SELECT replica, {bounds} FROM inferpath_requests FINAL WHERE {self.where}"
            f" GROUP BY replica{FINAL_SETTINGS}",
            self.parameters,
        )
        self.spans = [
            {row[0]: (row[1 + 3 * i], row[2 + 3 * i]) for row in rows if row[3 + 3 * i]}
            for i in range(len(self.windows))
        ]

    def load_rest(
        self, columns: Sequence[str] = (), tails: Mapping[int, tuple[str, float]] | None = None, spans: bool = False
    ) -> None:
        """Quantiles of ``columns`` not read yet and, per window index in ``tails``, the
        tail-band sums of ``(measure, edge)``, in one scan (none when there is nothing to
        read); with ``spans``, each window's replica spans (one more query, once)."""
        columns = [c for c in columns if c not in self.measured[0]]
        head: list[str] = []
        parameters: dict[str, Any] = {}
        tail_layout: list[tuple[int, str, float, tuple[str, ...]]] = []
        for index, (measure, edge) in sorted((tails or {}).items()):
            stages = measure_stages(measure)
            in_tail = f"({self.conditions[index]} AND {column_sql(f'{measure}_ns')} >= {{edge_{index}:Float64}})"
            parameters[f"edge_{index}"] = float(edge)
            head += [
                f"countIf({in_tail})",
                f"sumIf(assumeNotNull({column_sql(f'{measure}_ns')}), {in_tail})",
                *(f"sumIf({stage_sql(measure, s)}, {in_tail})" for s in stages),
            ]
            tail_layout.append((index, measure, float(edge), stages))
        if spans and self.spans is None:
            self._read_spans()
        if not head and not columns:
            return
        row = self._select(head, columns, parameters)
        position = 0
        for index, measure, edge, stages in tail_layout:
            count, total = int(row[position]), int(row[position + 1])
            sums = {s: int(v) for s, v in zip(stages, row[position + 2 : position + 2 + len(stages)])}
            self.tails[(index, measure, edge)] = (count, total, sums)
            position += 2 + len(stages)
        if columns:
            self._read_quantiles(row[position:], columns)


class StoredWindow:
    """The ``ok`` request rows with ``start ≤ timestamp < end`` (of ``endpoint`` when given;
    ``columns``: exact-match filters on ``service_name`` / ``model`` / ``replica``, as
    :func:`inferpath.storage.reader.row_filters` gives) in ``store``, answered by aggregate queries. Datetimes must be timezone-aware
    (``ValueError`` from the store otherwise). One query at construction reads the count and
    :data:`QUANTILE_LEVELS` of :data:`FIRST_COLUMNS`; the other columns' quantiles come in one
    more query on first use, the replica spans on first use. :meth:`pair` reads two windows
    with the same queries."""

    def __init__(
        self,
        store: Any,
        *,
        start: datetime,
        end: datetime,
        endpoint: str | None = None,
        columns: dict[str, str] | None = None,
        endpoint_class: str | None = None,
        _aggregates: _StoredAggregates | None = None,
        _index: int = 0,
    ) -> None:
        self.store, self.start, self.end, self.endpoint = store, start, end, endpoint
        self._where, self._parameters = request_filter(
            start=start, end=end, endpoint=endpoint, endpoint_class=endpoint_class, columns=columns
        )
        self._aggregates = _aggregates or _StoredAggregates(store, [(start, end)], endpoint, columns, endpoint_class)
        self._index = _index
        self._count = self._aggregates.counts[_index]

    @classmethod
    def pair(
        cls,
        store: Any,
        current: tuple[datetime, datetime],
        baseline: tuple[datetime, datetime],
        endpoint: str | None = None,
        columns: dict[str, str] | None = None,
        endpoint_class: str | None = None,
    ) -> tuple[StoredWindow, StoredWindow]:
        """``(current, baseline)`` windows whose aggregates are read together: one scan per
        pass over both windows instead of one per window. ``current`` / ``baseline``:
        ``(start, end)`` aware datetimes; they may overlap or be apart."""
        aggregates = _StoredAggregates(store, [current, baseline], endpoint, columns, endpoint_class)

        def window(index: int, bounds: tuple[datetime, datetime]) -> StoredWindow:
            return cls(
                store,
                start=bounds[0],
                end=bounds[1],
                endpoint=endpoint,
                columns=columns,
                endpoint_class=endpoint_class,
                _aggregates=aggregates,
                _index=index,
            )

        return window(0, current), window(1, baseline)

    def __len__(self) -> int:
        return self._count

    def measured(self, column: str) -> int:
        """Rows with a value in ``column`` (one of :data:`MEASURED_COLUMNS`, ``KeyError`` otherwise)."""
        if column in MEASURED_COLUMNS and column not in self._aggregates.measured[self._index]:
            self._aggregates.load_rest([column])
        return self._aggregates.measured[self._index][column]

    def quantile(self, column: str, q: float) -> float | None:
        """Exact ``q``-quantile (type 7) of ``column``; ``None`` when no row measured it."""
        if column not in MEASURED_COLUMNS:
            raise ValueError(f"column: {column!r} is not one of {MEASURED_COLUMNS}")
        cache = self._aggregates.quantiles[self._index]
        key = (column, q)
        if key not in cache and q in QUANTILE_LEVELS:
            self._aggregates.load_rest([column])
        if key not in cache:
            value = self.store.query(
                f"SELECT quantileExactInclusive({float(q)!r})({column_sql(column)}) FROM inferpath_requests FINAL"
                f" WHERE {self._where} AND {column_sql(column)} IS NOT NULL{FINAL_SETTINGS}",
                self._parameters,
            )[0][0]
            cache[key] = float(value) if self.measured(column) else None
        return cache[key]

    def rows_at_or_above(self, column: str, edge: float) -> list[Mapping[str, Any]]:
        """Rows (dicts of :data:`WINDOW_COLUMNS`) whose ``column`` is ``≥ edge``, oldest first."""
        if column not in MEASURED_COLUMNS:
            raise ValueError(f"column: {column!r} is not one of {MEASURED_COLUMNS}")
        sql = (
            f"SELECT {', '.join(WINDOW_COLUMNS)} FROM inferpath_requests FINAL"
            f" WHERE {self._where} AND {column_sql(column)} >= {{edge:Float64}} ORDER BY timestamp{FINAL_SETTINGS}"
        )
        return [with_client_measures(r) for r in self.store.query_dicts(sql, self._parameters | {"edge": float(edge)})]

    def tail_sums(self, measure: str, edge: float, exclude: Iterable[str] = ()) -> TailSums:
        """:class:`TailSums` of the rows whose ``<measure>_ns`` is ``≥ edge``, summed in the
        store (``Int64`` sums are exact, so they equal :meth:`RowsWindow.tail_sums`). Uses the
        band's sums read by :func:`prepare_attribution` when there are any; the excluded rows
        are then summed apart (looked up by ``trace_id``, the table's key) and taken off."""
        stages = measure_stages(measure)
        excluded = sorted(set(exclude))
        cached = self._aggregates.tails.get((self._index, measure, float(edge)))
        if cached is None:
            count, total, stage_sum, kept, kept_sum, excluded_total = self._tail_query(measure, edge, excluded)
        else:
            count, total, stage_sum = cached[0], cached[1], dict(cached[2])
            kept, kept_sum, excluded_total = count, dict(stage_sum), 0
            if excluded:
                out_count, out_total, out_sum, *_ = self._tail_query(measure, edge, [], only=excluded)
                kept, excluded_total = count - out_count, out_total
                kept_sum = {s: stage_sum[s] - out_sum[s] for s in stages}
        kept_total = sum(kept_sum[s] for s in stages)
        stage_sum[REST] = total - sum(stage_sum[s] for s in stages)
        kept_sum[REST] = (total - excluded_total) - kept_total
        return TailSums(count, total, stage_sum, kept, kept_sum, excluded_total)

    def _tail_query(
        self, measure: str, edge: float, exclude: Sequence[str], only: Sequence[str] | None = None
    ) -> tuple[int, int, dict[str, int], int, dict[str, int], int]:
        """(count, total, stage sums, kept count, kept stage sums, excluded total) of the band,
        over the rows whose ``trace_id`` is in ``only`` when given."""
        stages = measure_stages(measure)
        column = column_sql(f"{measure}_ns")
        stage_values = ", ".join(f"{stage_sql(measure, s)} AS {s}" for s in stages)
        sums = ", ".join(f"sum({s})" for s in stages)
        kept_sums = ", ".join(f"sumIf({s}, kept)" for s in stages)
        among = " AND trace_id IN {only:Array(String)}" if only is not None else ""
        sql = (
            f"SELECT count(), sum(total), {sums}, countIf(kept), {kept_sums}, sumIf(total, NOT kept)"
            f" FROM (SELECT assumeNotNull({column}) AS total, {stage_values},"
            "  NOT has({exclude:Array(String)}, trace_id) AS kept"
            f"  FROM inferpath_requests FINAL WHERE {self._where} AND {column} >= {{edge:Float64}}{among})"
            f"{FINAL_SETTINGS}"
        )
        parameters = self._parameters | {"edge": float(edge), "exclude": list(exclude)}
        if only is not None:
            parameters["only"] = list(only)
        row = self.store.query(sql, parameters)[0]
        n = len(stages)
        stage_sum = {s: int(v) for s, v in zip(stages, row[2 : 2 + n])}
        kept_sum = {s: int(v) for s, v in zip(stages, row[3 + n : 3 + 2 * n])}
        return int(row[0]), int(row[1]), stage_sum, int(row[2 + n]), kept_sum, int(row[3 + 2 * n])

    def class_stats(self, measures: Sequence[str], quantiles: Sequence[float]) -> dict[str, dict[str, ClassStats]]:
        """Measure → endpoint class → :class:`ClassStats` of ``<measure>_ns``: one ``GROUP BY``
        over the window for every measure."""
        columns = []
        for measure in measures:
            if f"{measure}_ns" not in MEASURED_COLUMNS:
                raise ValueError(f"measure: {measure!r} has no column in {MEASURED_COLUMNS}")
            columns.append(column_sql(f"{measure}_ns"))
        levels = ", ".join(repr(float(q)) for q in quantiles) or "0.5"
        aggregates = ", ".join(
            f"countIf({c} IS NOT NULL), avgIf({c}, {c} IS NOT NULL), "
            f"quantilesExactInclusiveIf({levels})({c}, {c} IS NOT NULL)"
            for c in columns
        )
        rows = self.store.query(
            f"SELECT endpoint_class, {aggregates} FROM inferpath_requests FINAL"
            f" WHERE {self._where} GROUP BY endpoint_class{FINAL_SETTINGS}",
            self._parameters,
        )
        out: dict[str, dict[str, ClassStats]] = {measure: {} for measure in measures}
        for row in rows:
            for index, measure in enumerate(measures):
                count, mean, values = row[1 + 3 * index : 4 + 3 * index]
                if count:
                    out[measure][str(row[0])] = ClassStats(
                        int(count), float(mean), {q: float(v) for q, v in zip(quantiles, values)}
                    )
        return out

    def replicas(self) -> set[Any]:
        """The replicas serving the window's rows (read with the first pass)."""
        return set(self._aggregates.replicas[self._index])

    def replica_spans(self) -> dict[Any, tuple[datetime, datetime] | None]:
        """Replica -> (first, last) request time."""
        if self._aggregates.spans is None:
            self._aggregates.load_rest(spans=True)
        return self._aggregates.spans[self._index]  # type: ignore[index]

    def missing_reasons(self, limit: int = 3) -> list[tuple[str, int]]:
        """The most common ``missing_measures`` texts of the window's rows with their counts."""
        rows = self.store.query(
            "SELECT missing_measures, count() AS n FROM inferpath_requests FINAL"
            f" WHERE {self._where} AND missing_measures != '' GROUP BY missing_measures"
            f" ORDER BY n DESC LIMIT {int(limit)}{FINAL_SETTINGS}",
            self._parameters,
        )
        return [(str(text), int(n)) for text, n in rows]

    def quantiles_excluding(
        self, replicas: Iterable[Any], column: str, quantiles: Sequence[float]
    ) -> list[float] | None:
        """Exact quantiles of ``column`` over the rows of every replica but ``replicas``, in
        the store; ``None`` when those rows have no value."""
        if column not in MEASURED_COLUMNS:
            raise ValueError(f"column: {column!r} is not one of {MEASURED_COLUMNS}")
        levels = ", ".join(repr(float(q)) for q in quantiles)
        expression = column_sql(column)
        count, values = self.store.query(
            f"SELECT count(), quantilesExactInclusive({levels})({expression}) FROM inferpath_requests FINAL"
            f" WHERE {self._where} AND {expression} IS NOT NULL AND replica NOT IN {{unwanted:Array(String)}}"
            f"{FINAL_SETTINGS}",
            self._parameters | {"unwanted": sorted(str(r) for r in replicas)},
        )[0]
        return [float(v) for v in values] if count else None

    def rows_of(self, replicas: Iterable[Any]) -> list[Mapping[str, Any]]:
        """The rows (dicts of :data:`WINDOW_COLUMNS`) of ``replicas``, oldest first."""
        wanted = sorted(str(r) for r in set(replicas) if r is not None)
        if not wanted:
            return []
        return [
            with_client_measures(r)
            for r in self.store.query_dicts(
                f"SELECT {', '.join(WINDOW_COLUMNS)} FROM inferpath_requests FINAL WHERE {self._where}"
                f" AND replica IN {{replicas:Array(String)}} ORDER BY timestamp{FINAL_SETTINGS}",
                self._parameters | {"replicas": wanted},
            )
        ]


def prepare_attribution(
    current: RequestWindow, baseline: RequestWindow, measure: str, current_edge: float, baseline_edge: float
) -> None:
    """Read, in one scan, what attributing ``measure``'s growth needs from two stored windows
    made by :meth:`StoredWindow.pair`: the tail-band sums at each window's edge (ns) and the
    queue time's quantiles. Later calls of :meth:`StoredWindow.tail_sums` and the queue
    time's :meth:`~StoredWindow.quantile` are then answered from memory. Windows held in Python,
    or stored windows read apart, need nothing: the call does nothing for them."""
    if not (isinstance(current, StoredWindow) and isinstance(baseline, StoredWindow)):
        return
    if current._aggregates is not baseline._aggregates:
        return
    # The queue time's quantiles ride along (the batching-window rule always reads them), and
    # the hop's (its floor splits the wire from an engine's door).
    current._aggregates.load_rest(
        ["queue_ns", *stage_columns(measure, "network")],
        tails={current._index: (measure, float(current_edge)), baseline._index: (measure, float(baseline_edge))},
    )


def prefetch_quantiles(current: RequestWindow, baseline: RequestWindow, columns: Iterable[str]) -> None:
    """Read the :data:`QUANTILE_LEVELS` of ``columns`` (of :data:`MEASURED_COLUMNS`) for two
    stored windows made by :meth:`StoredWindow.pair` in one scan, rather than one scan per
    column on first use. Does nothing for other windows. Raises ``ValueError`` for an
    unknown column."""
    wanted = list(dict.fromkeys(columns))
    for column in wanted:
        if column not in MEASURED_COLUMNS:
            raise ValueError(f"column: {column!r} is not one of {MEASURED_COLUMNS}")
    if (
        isinstance(current, StoredWindow)
        and isinstance(baseline, StoredWindow)
        and current._aggregates is baseline._aggregates
    ):
        current._aggregates.load_rest(wanted)


class HistogramWindow:
    """A window's requests as the engine's own latency histograms count them
    (:mod:`~inferpath.analysis.engine_histograms`): the same questions for the columns they
    measure (``ttft_ns``, ``e2e_ns``, ``queue_ns``; none for the others), quantiles estimated
    from the buckets, no endpoint class (``""``), no rows. ``histograms``: request column →
    :class:`~inferpath.analysis.engine_histograms.LatencyHistogram`."""

    def __init__(self, histograms: Mapping[str, LatencyHistogram]) -> None:
        self.histograms = dict(histograms)

    def __len__(self) -> int:
        """The first tokens counted (the requests that reached one in the window); the E2E
        count where no TTFT histogram is exported."""
        return self.measured("ttft_ns") or self.measured("e2e_ns")

    def measured(self, column: str) -> int:
        """Requests the engine counted in ``column``'s histogram (0 without one)."""
        histogram = self.histograms.get(column)
        return round(histogram.count) if histogram is not None else 0

    def quantile(self, column: str, q: float) -> float | None:
        """``column``'s estimated ``q``-quantile (ns); ``None`` without observations. A
        request's queue time is part of its TTFT, so the queue's quantile is at most the
        TTFT's (coarser queue buckets would otherwise interpolate past it)."""
        histogram = self.histograms.get(column)
        value = histogram.quantile_seconds(q) if histogram is not None else None
        if value is None:
            return None
        first = self.histograms.get("ttft_ns")
        bound = first.quantile_seconds(q) if column == "queue_ns" and first is not None else None
        return (value if bound is None else min(value, bound)) * 1e9

    def mean_ns(self, column: str) -> float | None:
        """``column``'s mean (ns); ``None`` without observations."""
        histogram = self.histograms.get(column)
        value = histogram.mean_seconds() if histogram is not None else None
        return None if value is None else value * 1e9

    def class_stats(self, measures: Sequence[str], quantiles: Sequence[float]) -> dict[str, dict[str, ClassStats]]:
        """Measure → ``{"": ClassStats}`` for each measure with a histogram."""
        out: dict[str, dict[str, ClassStats]] = {measure: {} for measure in measures}
        for measure in measures:
            column, mean = f"{measure}_ns", self.mean_ns(f"{measure}_ns")
            if mean is not None:
                levels = {q: self.quantile(column, q) or 0.0 for q in quantiles}
                out[measure][""] = ClassStats(self.measured(column), mean, levels)
        return out

    def replicas(self) -> set[Any]:
        """None told apart: the histograms are summed over the engines."""
        return set()

    def replica_spans(self) -> dict[Any, tuple[datetime, datetime] | None]:
        return {}

    def rows_of(self, replicas: Iterable[Any]) -> list[Mapping[str, Any]]:
        return []

    def missing_reasons(self, limit: int = 3) -> list[tuple[str, int]]:
        return []


RequestWindow = RowsWindow | StoredWindow


def as_window(rows: RequestWindow | Sequence[Mapping[str, Any]]) -> RequestWindow:
    """``rows`` as a window: a :class:`RowsWindow` or :class:`StoredWindow` as is, a sequence
    of request-row dicts wrapped in a :class:`RowsWindow`."""
    if isinstance(rows, (RowsWindow, StoredWindow)):
        return rows
    if isinstance(rows, HistogramWindow):  # answers what judging a window asks, not the tail's rows
        return rows  # type: ignore[return-value]
    return RowsWindow(rows)


def _failure_label(status: str, code: int) -> str:
    """``error (HTTP 503)``; ``error after HTTP 200`` where the response had begun well (a
    stream cut short); the status alone without a code."""
    if not code:
        return status
    return f"{status} (HTTP {code})" if code >= 400 else f"{status} after HTTP {code}"


def failed_requests(
    store: Any,
    *,
    start: datetime,
    end: datetime,
    endpoint: str | None = None,
    endpoint_class: str | None = None,
    columns: dict[str, str] | None = None,
    times_limit: int = 100_000,
) -> tuple[dict[str, int], list[datetime]]:
    """The requests of the window that did not end ``ok`` (``error``, ``incomplete``): counted
    by what they ended with, e.g. ``{"error (HTTP 502)": 40, "error after HTTP 200": 2,
    "incomplete": 3}``, the most
    common first (``{}`` when none failed), and when they arrived, oldest first (the first
    ``times_limit``). Same filters as :class:`StoredWindow`."""
    where, parameters = request_filter(
        start=start, end=end, endpoint=endpoint, endpoint_class=endpoint_class, status=None, columns=columns
    )
    rows = store.query(
        "SELECT status, http_status_code, count() AS n FROM inferpath_requests FINAL"
        f" WHERE {where} AND status != 'ok' GROUP BY status, http_status_code ORDER BY n DESC{FINAL_SETTINGS}",
        parameters,
    )
    counts = {_failure_label(str(status), int(code or 0)): int(count) for status, code, count in rows if int(count)}
    if not counts:
        return counts, []
    times = store.query(
        "SELECT timestamp FROM inferpath_requests FINAL"
        f" WHERE {where} AND status != 'ok' ORDER BY timestamp LIMIT {int(times_limit)}{FINAL_SETTINGS}",
        parameters,
    )
    return counts, [t[0] if t[0].tzinfo else t[0].replace(tzinfo=timezone.utc) for t in times]


__all__ = [
    "ClassStats",
    "MEASURE_SQL",
    "column_sql",
    "with_client_measures",
    "FIRST_COLUMNS",
    "HistogramWindow",
    "MEASURED_COLUMNS",
    "QUANTILE_LEVELS",
    "RequestWindow",
    "RowsWindow",
    "StoredWindow",
    "TailSums",
    "WINDOW_COLUMNS",
    "as_window",
    "failed_requests",
    "prefetch_quantiles",
    "prepare_attribution",
]
