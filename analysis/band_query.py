"""Stage breakdown per percentile band computed inside ClickHouse.

Same answer as :func:`inferpath.analysis.breakdown.breakdown_by_band` over the rows
:func:`~inferpath.analysis.breakdown.fetch_request_rows` would return, without moving those
rows into Python: over a day of traffic that is a million rows, and the Python work per row
cost tens of seconds where ClickHouse needs a fraction of one.

How it stays the same:

- Band edges are ``quantilesExactInclusive`` of the measure: linear interpolation between
  closest ranks (Hyndman & Fan type 7), the definition of
  :func:`inferpath.analysis.percentiles.quantiles`.
- A row sits in the band whose range ``[lower, upper)`` holds its measure, the last band
  including its upper edge (the maximum), so every row with the measure is in one band.
- Per band: the count, the integer sums of the measure and of each stage
  (``coalesce(stage_ns, 0)``: an unmeasured stage counts 0, as in
  :func:`~inferpath.analysis.breakdown.request_breakdown`), and each stage's exact p99.
  ``rest`` = sum of the measure − sum of its stages. Sums of ``Int64`` are exact, so means
  and shares equal the Python ones exactly; p99s agree to float rounding.

Unlike :func:`~inferpath.analysis.breakdown.request_breakdown`, a negative stored duration
is not rejected here (the writer never stores one).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from inferpath.analysis.breakdown import (
    BANDS, FINAL_SETTINGS, MEASURES, REST, STAGES, StageSummary, measure_stages, request_filter,
)

_EDGE_QUANTILES: tuple[float, ...] = tuple(sorted({q for _, lo, hi in BANDS for q in (lo, hi)}))


def _sql(where: str) -> str:
    levels = ", ".join(repr(q) for q in _EDGE_QUANTILES)
    edges = ", ".join(f"quantilesExactInclusive({levels})({m}_ns)" for m in MEASURES)
    # The band of a value: the highest band whose lower edge it reaches (edges ascend and
    # every value is ≥ the minimum), which is [lower, upper) with the top band closed.
    position = {q: i + 1 for i, q in enumerate(_EDGE_QUANTILES)}  # ClickHouse arrays are 1-based
    band_of = "multiIf(" + ", ".join(
        f"total >= edges[{position[lo]}], {index}"
        for index, (_, lo, _) in reversed(list(enumerate(BANDS))) if index > 0) + ", 0)"
    stage_sums = ", ".join(f"sum({s})" for s in STAGES)
    stage_p99 = ", ".join(f"quantileExactInclusive(0.99)({s})" for s in STAGES)
    stage_values = ", ".join(f"coalesce({s}_ns, 0) AS {s}" for s in STAGES)
    measure_index = {m: i for i, m in enumerate(MEASURES)}
    pairs = ", ".join(f"({measure_index[m]}, {m}_ns)" for m in MEASURES)
    measure_edges = ", ".join(f"window.{i + 2}" for i in range(len(MEASURES)))
    measure_columns = ", ".join(f"{m}_ns" for m in MEASURES)
    return (
        f"WITH (SELECT tuple(count(), {edges}) FROM inferpath_requests FINAL WHERE {where}) AS window"
        f" SELECT measure, band, count(), sum(total), {stage_sums}, {stage_p99}, any(window)"
        " FROM (SELECT measure_total.1 AS measure, assumeNotNull(measure_total.2) AS total,"
        f" {', '.join(STAGES)}, [{measure_edges}][measure + 1] AS edges, {band_of} AS band"
        f"  FROM (SELECT {measure_columns}, {stage_values} FROM inferpath_requests FINAL WHERE {where})"
        f"  ARRAY JOIN [{pairs}] AS measure_total WHERE measure_total.2 IS NOT NULL)"
        f" GROUP BY measure, band ORDER BY measure, band{FINAL_SETTINGS}"
    )


def fetch_breakdown_bands(
    store: Any, *, start: datetime, end: datetime, endpoint: str | None = None,
    endpoint_class: str | None = None, status: str | None = "ok",
) -> tuple[int, dict[str, list[StageSummary]]]:
    """``(request_count, {measure: [StageSummary per band]})`` for ``"ttft"`` and ``"e2e"``
    over request rows with ``start ≤ timestamp < end`` (filters as
    :func:`~inferpath.analysis.breakdown.fetch_request_rows`; ``FINAL``, so a re-assembled
    trace counts once). ``request_count``: rows selected, with or without the measures.

    Each list equals :func:`~inferpath.analysis.breakdown.breakdown_by_band` of those rows
    (bands fastest first, empty bands left out, ``lower_ns``/``upper_ns`` the band edges in
    ns). Datetimes must be timezone-aware (``ValueError`` otherwise, from the store).
    """
    where, parameters = request_filter(start=start, end=end, endpoint=endpoint,
                                       endpoint_class=endpoint_class, status=status)
    rows = store.query(_sql(where), parameters)
    bands: dict[str, list[StageSummary]] = {m: [] for m in MEASURES}
    request_count = 0
    n = len(STAGES)
    for measure_index, band, count, total_sum, *rest in rows:
        sums = dict(zip(STAGES, rest[:n]))
        p99s = dict(zip(STAGES, rest[n:2 * n]))
        window = rest[2 * n]
        request_count = int(window[0])
        measure = MEASURES[measure_index]
        edges = dict(zip(_EDGE_QUANTILES, window[measure_index + 1]))
        name, low_q, high_q = BANDS[band]
        bands[measure].append(_summary(measure, name, int(count), int(total_sum), sums, p99s,
                                       edges[low_q], edges[high_q]))
    if not rows:
        request_count = int(store.query(
            f"SELECT count() FROM inferpath_requests FINAL WHERE {where}{FINAL_SETTINGS}", parameters)[0][0])
    return request_count, bands


def _summary(measure: str, band: str, count: int, total_sum: int, sums: dict[str, Any],
             p99s: dict[str, Any], lower_ns: float, upper_ns: float) -> StageSummary:
    stages = measure_stages(measure)
    stage_sum = {s: int(sums[s]) for s in stages}
    stage_sum[REST] = total_sum - sum(stage_sum.values())
    return StageSummary(
        group=band, measure=measure, count=count, total_mean_ns=total_sum / count,
        stage_mean_ns={s: v / count for s, v in stage_sum.items()},
        stage_share={s: (v / total_sum if total_sum else 0.0) for s, v in stage_sum.items()},
        stage_p99_ns={s: float(p99s[s]) for s in stages},
        lower_ns=float(lower_ns), upper_ns=float(upper_ns),
    )


__all__ = ["fetch_breakdown_bands"]
