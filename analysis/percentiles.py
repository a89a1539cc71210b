"""Exact percentiles of raw values, as numpy and ClickHouse compute them.

Quantiles are never averaged: the p99 of two replicas is not the mean of their p99s, it is
the p99 of the pooled values. (Engine latency histograms are stored as buckets in
``otel_metrics_histogram`` for the OTel Collector's and Grafana's readers; inferpath's own
verdicts read the per-request rows, so no bucket estimate is made here.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


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


def _check_q(q: float) -> None:
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be a number in [0, 1], got {q!r}")


__all__ = ["quantile", "quantiles", "sorted_quantile"]
