"""Percentiles the honest way: exact ones from raw values, estimated ones from merged buckets.

Two rules this module exists to keep:

- Quantiles are never averaged. The p99 of two replicas is not the mean of their p99s; it is
  the p99 of the pooled values, or, when only histograms exist, the quantile of the
  bucket-wise *sum* of their cumulative buckets (what ``sum by (le)`` does in PromQL).
- A bucket estimate is labelled as one. :func:`histogram_quantile` reproduces Prometheus'
  ``histogram_quantile`` (``promql/quantile.go``, ``bucketQuantile``): linear interpolation
  inside the bucket that holds the rank, the lower bound of the first bucket taken as 0,
  and the upper bound of the second-highest bucket returned when the rank falls into the
  ``+Inf`` bucket. ClickHouse's ``quantilePrometheusHistogram`` follows the same rules.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence


def quantile(values: Iterable[float], q: float) -> float:
    """Exact ``q``-quantile (0 ≤ q ≤ 1) of ``values`` in their own unit.

    Linear interpolation between closest ranks (Hyndman & Fan type 7), the default of
    ``numpy.quantile`` and of ClickHouse's ``quantileExact``-family interpolation, so the
    numbers compare. Raises ``ValueError`` for an empty input, a NaN value or q outside [0, 1].
    """
    _check_q(q)
    ordered = sorted(float(v) for v in values)
    if not ordered:
        raise ValueError("values is empty: a quantile needs at least one value")
    if any(math.isnan(v) for v in ordered):
        raise ValueError("values contains NaN")
    return _sorted_quantile(ordered, q)


def quantiles(values: Iterable[float], qs: Sequence[float] = (0.5, 0.9, 0.99)) -> dict[float, float]:
    """Exact quantiles ``{q: value}`` for each ``q`` in ``qs``, sorting ``values`` once.

    Raises ``ValueError`` as :func:`quantile` does.
    """
    for q in qs:
        _check_q(q)
    ordered = sorted(float(v) for v in values)
    if not ordered:
        raise ValueError("values is empty: a quantile needs at least one value")
    return {q: _sorted_quantile(ordered, q) for q in qs}


def sorted_quantile(ordered: Sequence[float], q: float) -> float:
    """:func:`quantile` of values already sorted ascending (not checked: the caller sorted
    them, e.g. once for many quantiles). Raises ``ValueError`` for an empty input or q
    outside [0, 1]."""
    _check_q(q)
    if not ordered:
        raise ValueError("values is empty: a quantile needs at least one value")
    return _sorted_quantile(ordered, q)


def _sorted_quantile(ordered: Sequence[float], q: float) -> float:
    position = q * (len(ordered) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    fraction = position - lower
    return ordered[lower] + (ordered[upper] - ordered[lower]) * fraction


def tail_ratio(values: Iterable[float], q: float = 0.99) -> float:
    """``quantile(values, q) / mean(values)``: how far the tail sits from the average.

    A ratio near 1 means every request waits about the same; a p99/avg of 5 or more means
    a minority of requests pays for something the average hides (queueing, cold starts,
    preemptions). Raises ``ValueError`` for an empty input or a mean of 0.
    """
    pooled = [float(v) for v in values]
    if not pooled:
        raise ValueError("values is empty: a tail ratio needs at least one value")
    mean = math.fsum(pooled) / len(pooled)
    if mean == 0:
        raise ValueError("mean of values is 0: the tail ratio is undefined")
    return quantile(pooled, q) / mean


def _check_q(q: float) -> None:
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be a number in [0, 1], got {q!r}")


# ---------------------------------------------------------------------------- histograms

Buckets = Mapping[float, float]
"""Cumulative buckets: upper bound (``le``, ``math.inf`` for ``+Inf``) -> count of values ≤ it."""


def merge_buckets(histograms: Iterable[Buckets]) -> dict[float, float]:
    """Bucket-wise sum of cumulative histograms, as PromQL's ``sum by (le)``.

    Each input maps upper bound -> cumulative count. Bounds missing from one input simply
    do not contribute to that bound (as in Prometheus); :func:`histogram_quantile` repairs
    the non-monotonic counts this can produce. Returns a new dict sorted by bound.
    Raises ``ValueError`` for a NaN bound or a negative count.
    """
    merged: dict[float, float] = {}
    for index, histogram in enumerate(histograms):
        for bound, count in histogram.items():
            bound, count = float(bound), float(count)
            if math.isnan(bound):
                raise ValueError(f"histogram {index} has a NaN bucket bound")
            if count < 0 or math.isnan(count):
                raise ValueError(f"histogram {index} bucket le={bound} has invalid count {count}")
            merged[bound] = merged.get(bound, 0.0) + count
    return dict(sorted(merged.items()))


def otlp_to_cumulative(explicit_bounds: Sequence[float], bucket_counts: Sequence[float]) -> dict[float, float]:
    """Convert an OTLP explicit-bucket histogram point to cumulative Prometheus buckets.

    OTLP stores per-bucket counts, ``len(explicit_bounds) + 1`` of them, the last one for
    values above the highest bound (OTLP metrics data model, "Histogram"). Returns
    upper bound -> cumulative count with a ``math.inf`` bucket. Raises ``ValueError`` when
    the lengths do not match.
    """
    if len(bucket_counts) != len(explicit_bounds) + 1:
        raise ValueError(
            f"bucket_counts must have len(explicit_bounds) + 1 = {len(explicit_bounds) + 1} "
            f"entries, got {len(bucket_counts)}"
        )
    cumulative: dict[float, float] = {}
    running = 0.0
    for bound, count in zip([*explicit_bounds, math.inf], bucket_counts):
        running += float(count)
        cumulative[float(bound)] = running
    return cumulative


def bucket_increase(earlier: Buckets, later: Buckets) -> dict[float, float]:
    """Per-bucket increase of a cumulative histogram between two scrapes of one series.

    This is what ``increase(x_bucket[window])`` gives PromQL before ``histogram_quantile``:
    the histogram of only the values observed inside the window. A counter reset (any
    bucket of ``later`` below ``earlier``, e.g. an engine restart) means ``later`` counts
    from zero, so ``later`` is returned as is, as Prometheus' reset handling assumes.
    """
    if any(float(later.get(b, 0.0)) < float(c) for b, c in earlier.items()):
        return dict(sorted((float(b), float(c)) for b, c in later.items()))
    return dict(sorted((float(b), float(c) - float(earlier.get(b, 0.0))) for b, c in later.items()))


def histogram_quantile(q: float, buckets: Buckets) -> float:
    """Estimate the ``q``-quantile from cumulative ``buckets`` exactly as Prometheus does.

    Follows ``bucketQuantile`` in prometheus/prometheus ``promql/quantile.go``: q < 0 gives
    -Inf, q > 1 gives +Inf; NaN when there is no ``+Inf`` bucket, fewer than two buckets or no
    observations; counts are made monotonic first; rank = q × total; the first bucket
    whose count reaches the rank holds the quantile, interpolated linearly between its
    lower bound (0 for the first bucket) and its upper bound; a rank in the ``+Inf`` bucket
    returns the highest finite bound. Unit: that of the bounds.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted((float(b), float(c)) for b, c in buckets.items())
    if len(ordered) < 2 or ordered[-1][0] != math.inf:
        return math.nan
    # Scrapes of several series are not atomic, so a higher bucket may hold slightly fewer
    # counts than a lower one; Prometheus carries the maximum forward (ensureMonotonic).
    bounds = [b for b, _ in ordered]
    counts: list[float] = []
    for _, count in ordered:
        counts.append(max(count, counts[-1]) if counts else count)
    observations = counts[-1]
    if observations == 0:
        return math.nan
    rank = q * observations
    index = next(i for i, count in enumerate(counts) if count >= rank)
    if index == len(counts) - 1:
        return bounds[-2]
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    bucket_start, bucket_end, count = 0.0, bounds[index], counts[index]
    if index > 0:
        bucket_start = bounds[index - 1]
        count -= counts[index - 1]
        rank -= counts[index - 1]
    if count == 0:
        # Only q = 0 over an empty first bucket gets here; Go's 0/0 makes Prometheus say NaN.
        return math.nan
    return bucket_start + (bucket_end - bucket_start) * (rank / count)


__all__ = ["sorted_quantile", 
    "Buckets",
    "bucket_increase",
    "histogram_quantile",
    "merge_buckets",
    "otlp_to_cumulative",
    "quantile",
    "quantiles",
    "tail_ratio",
]
