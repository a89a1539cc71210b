"""Stage breakdown per percentile band computed inside ClickHouse.

Same answer as :func:`inferpath.analysis.breakdown.breakdown_by_band` over the rows
:func:`~inferpath.analysis.breakdown.fetch_request_rows` would return, without moving those
rows into Python: over a day of traffic that is a million rows, and the Python work per row
cost tens of seconds where ClickHouse needs a fraction of one.

How it stays the same:

- The measure is the client's TTFT / E2E when measured, else the server's
  (:data:`~inferpath.vocabulary.CLIENT_FIRST_SQL`), as in
  :func:`~inferpath.analysis.breakdown.request_breakdown`.
- Band edges are ``quantilesExactInclusive`` of the measure: linear interpolation between
  closest ranks (Hyndman & Fan type 7), the definition of
  :func:`inferpath.analysis.percentiles.quantiles`.
- A row sits in the band whose range ``[lower, upper)`` holds its measure, the last band
  including its upper edge (the maximum), so every row with the measure is in one band.
- Per band: the count, the integer sums of the measure and of each stage, and each stage's
  exact p99. A stage's value is :func:`~inferpath.analysis.breakdown.stage_sql` (e.g.
  ``coalesce(gateway_ttft_ns, gateway_ns, 0)`` for the gateway in TTFT: an unmeasured stage
  counts 0), the columns :func:`~inferpath.analysis.breakdown.request_breakdown` reads.
  ``rest`` = sum of the measure − sum of its stages. Sums of ``Int64`` are exact, so means
  and shares equal the Python ones exactly; p99s agree to float rounding.

Unlike :func:`~inferpath.analysis.breakdown.request_breakdown`, a negative stored duration
is not rejected here (the writer never stores one).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from inferpath.analysis.breakdown import (
    BANDS,
    FINAL_SETTINGS,
    REST,
    StageSummary,
    measure_stages,
    request_filter,
    stage_sql,
)
from inferpath.vocabulary import BREAKDOWN_MEASURES, CLIENT_FIRST_SQL

_EDGE_QUANTILES: tuple[float, ...] = tuple(sorted({q for _, lo, hi in BANDS for q in (lo, hi)}))


def _stage_aliases() -> tuple[list[tuple[str, str]], dict[tuple[str, str], str]]:
    """The distinct stage expressions of all measures as ``[(alias, sql)]``, and
    ``(measure, stage) -> alias``: a stage read alike by both measures is summed once."""
    by_sql: dict[str, str] = {}
    of_stage: dict[tuple[str, str], str] = {}
    for measure in BREAKDOWN_MEASURES:
        for stage in measure_stages(measure):
            sql = stage_sql(measure, stage)
            of_stage[(measure, stage)] = by_sql.setdefault(sql, f"stage_{len(by_sql)}")
    return [(alias, sql) for sql, alias in by_sql.items()], of_stage


_STAGE_VALUES, _STAGE_ALIAS = _stage_aliases()


def _band_of(column: str, edges: str) -> str:
    """SQL: the band index of ``column`` given its edge array, ``-1`` when it is NULL. The
    band of a value is the highest band whose lower edge it reaches (edges ascend and every
    value is ≥ the minimum): ``[lower, upper)`` with the top band closed."""
    position = {q: i + 1 for i, q in enumerate(_EDGE_QUANTILES)}  # ClickHouse arrays are 1-based
    conditions = ", ".join(
        f"{column} >= {edges}[{position[lo]}], {index}"
        for index, (_, lo, _) in reversed(list(enumerate(BANDS)))
        if index > 0
    )
    return f"if(isNull({column}), -1, multiIf({conditions}, 0))"


def _sql(where: str) -> str:
    """One query: the window's count and exact band edges (a scalar subquery, one pass over
    two columns), then one pass over the rows grouped twice (``GROUPING SETS``): by TTFT
    band and by E2E band. Each row is read once and lands in one group per measure; with
    ``group_by_use_nulls`` the other measure's band key is NULL, which tells the two
    apart. A NULL measure has band ``-1`` (dropped by the caller)."""
    levels = ", ".join(repr(q) for q in _EDGE_QUANTILES)
    edges = ", ".join(f"quantilesExactInclusive({levels})({CLIENT_FIRST_SQL[m]})" for m in BREAKDOWN_MEASURES)
    stage_values = ", ".join(f"{sql} AS {alias}" for alias, sql in _STAGE_VALUES)
    measure_values = ", ".join(f"{CLIENT_FIRST_SQL[m]} AS {m}_measure" for m in BREAKDOWN_MEASURES)
    bands = ", ".join(
        f"{_band_of(f'{m}_measure', f'window.{i + 2}')} AS {m}_band" for i, m in enumerate(BREAKDOWN_MEASURES)
    )
    measure_sums = ", ".join(f"sum({m}_measure)" for m in BREAKDOWN_MEASURES)
    stage_sums = ", ".join(f"sum({alias})" for alias, _ in _STAGE_VALUES)
    stage_p99 = ", ".join(f"quantileExactInclusive(0.99)({alias})" for alias, _ in _STAGE_VALUES)
    keys = ", ".join(f"{m}_band" for m in BREAKDOWN_MEASURES)
    sets = ", ".join(f"({m}_band)" for m in BREAKDOWN_MEASURES)
    return (
        f"WITH (SELECT tuple(count(), {edges}) FROM inferpath_requests FINAL WHERE {where}) AS window"
        f" SELECT {keys}, count(), {measure_sums}, {stage_sums}, {stage_p99}, any(window)"
        f" FROM (SELECT {measure_values}, {stage_values}, {bands}"
        f"  FROM inferpath_requests FINAL WHERE {where})"
        f" GROUP BY GROUPING SETS ({sets}){FINAL_SETTINGS}, group_by_use_nulls = 1"
    )


def fetch_breakdown_bands(
    store: Any,
    *,
    start: datetime,
    end: datetime,
    endpoint: str | None = None,
    endpoint_class: str | None = None,
    status: str | None = "ok",
    columns: dict[str, str] | None = None,
) -> tuple[int, dict[str, list[StageSummary]]]:
    """``(request_count, {measure: [StageSummary per band]})`` for ``"ttft"`` and ``"e2e"``
    over request rows with ``start ≤ timestamp < end`` (filters as
    :func:`~inferpath.analysis.breakdown.fetch_request_rows`; ``FINAL``, so a re-assembled
    trace counts once; ``columns``: service / model / replica filters, as
    :func:`~inferpath.analysis.breakdown.request_filter`). ``request_count``: rows selected, with or without the measures.

    Each list equals :func:`~inferpath.analysis.breakdown.breakdown_by_band` of those rows
    (bands fastest first, empty bands left out, ``lower_ns``/``upper_ns`` the band edges in
    ns). Datetimes must be timezone-aware (``ValueError`` otherwise, from the store).
    """
    where, parameters = request_filter(
        start=start, end=end, endpoint=endpoint, endpoint_class=endpoint_class, status=status, columns=columns
    )
    rows = store.query(_sql(where), parameters)
    bands: dict[str, list[StageSummary]] = {m: [] for m in BREAKDOWN_MEASURES}
    request_count = 0
    n, k = len(_STAGE_VALUES), len(BREAKDOWN_MEASURES)
    aliases = [alias for alias, _ in _STAGE_VALUES]
    for row in sorted(rows, key=lambda r: [(-1 if b is None else b) for b in r[:k]]):
        band_keys, count, measure_sums = row[:k], row[k], row[k + 1 : 2 * k + 1]
        rest = row[2 * k + 1 :]
        alias_sums = dict(zip(aliases, rest[:n]))
        alias_p99s = dict(zip(aliases, rest[n : 2 * n]))
        window = rest[2 * n]
        request_count = int(window[0])
        measure_index = next(i for i, b in enumerate(band_keys) if b is not None)
        band = band_keys[measure_index]
        if band < 0:  # rows without this measure
            continue
        measure = BREAKDOWN_MEASURES[measure_index]
        sums = {s: alias_sums[_STAGE_ALIAS[(measure, s)]] for s in measure_stages(measure)}
        p99s = {s: alias_p99s[_STAGE_ALIAS[(measure, s)]] for s in measure_stages(measure)}
        edges = dict(zip(_EDGE_QUANTILES, window[measure_index + 1]))
        name, low_q, high_q = BANDS[band]
        bands[measure].append(
            _summary(
                measure, name, int(count), int(measure_sums[measure_index]), sums, p99s, edges[low_q], edges[high_q]
            )
        )
    if not rows:
        request_count = int(
            store.query(f"SELECT count() FROM inferpath_requests FINAL WHERE {where}{FINAL_SETTINGS}", parameters)[0][0]
        )
    return request_count, bands


def _summary(
    measure: str,
    band: str,
    count: int,
    total_sum: int,
    sums: dict[str, Any],
    p99s: dict[str, Any],
    lower_ns: float,
    upper_ns: float,
) -> StageSummary:
    stages = measure_stages(measure)
    stage_sum = {s: int(sums[s]) for s in stages}
    stage_sum[REST] = total_sum - sum(stage_sum.values())
    return StageSummary(
        group=band,
        measure=measure,
        count=count,
        total_mean_ns=total_sum / count,
        stage_mean_ns={s: v / count for s, v in stage_sum.items()},
        stage_share={s: (v / total_sum if total_sum else 0.0) for s, v in stage_sum.items()},
        stage_p99_ns={s: float(p99s[s]) for s in stages},
        lower_ns=float(lower_ns),
        upper_ns=float(upper_ns),
    )


__all__ = ["fetch_breakdown_bands"]
