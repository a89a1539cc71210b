"""The engine's own latency histograms over a window: every request it counted, spans or not.

vLLM (and SGLang, TGI, Triton, TRT-LLM) observe each request's TTFT, queue time and E2E
latency into cumulative Prometheus histograms (``vllm:time_to_first_token_seconds``, …; the
collectors' catalog maps them to the canonical names of :mod:`inferpath.vocabulary`). Each
scrape is stored as one ``otel_metrics_histogram`` point: OTel explicit buckets, a count per
bucket, cumulative over time. A window's histogram is the increase of every bucket from the
latest scrape at or before its start to the latest scrape in it, reset-aware as PromQL's
``increase`` (a count lower than the scrape before is a restart, counted from zero), summed
over the engines bucket by bucket where their bounds agree.

Its quantiles are read as PromQL's ``histogram_quantile`` reads them: linear inside the
bucket that holds the rank, the lower bound of the first bucket 0, and the upper bound of
the last finite bucket for a rank in ``+Inf``. The resolution is the buckets': vLLM's TTFT
buckets around a 1 s objective are 0.75, 1 and 2.5 s, so a p99 in (1, 2.5] is over the
objective for certain and its value within that bucket is an interpolation.

They matter where the request spans do not show the requests: an engine that is scraped and
not traced, and spans that lag an incident (vLLM exports a request's span when it ends; the
requests still queued or decoding at the end of a window are in its TTFT histogram as soon
as their first token came, in its spans only later). The shared live capture ends so: 226
first tokens counted, 133 spans exported, the last 58 first tokens 1-2.5 s late.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from inferpath.analysis.signals import DEFAULT_LOOKBACK_SECONDS, aware_unix_ns
from inferpath.vocabulary import E2E_REQUEST_LATENCY_SECONDS, REQUEST_QUEUE_TIME_SECONDS, TIME_TO_FIRST_TOKEN_SECONDS

HISTOGRAM_COLUMNS: dict[str, str] = {
    "ttft_ns": TIME_TO_FIRST_TOKEN_SECONDS,
    "e2e_ns": E2E_REQUEST_LATENCY_SECONDS,
    "queue_ns": REQUEST_QUEUE_TIME_SECONDS,
}
"""Request column (as the diagnosis names it) → the canonical engine histogram that measures it."""


@dataclass(frozen=True)
class LatencyHistogram:
    """Observations of one latency over a window: ``bounds`` (seconds, ascending upper bounds;
    a last ``+Inf`` bucket is implied), ``counts`` (observations per bucket, one more than
    ``bounds``) and ``total_seconds`` (their sum)."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    total_seconds: float
    began_ns: int | None = None
    """When its counters began in the window (Unix ns), where every series of it did: not
    scraped at or before the window's start (within the lookback), or counting less at its
    first scrape in the window than before it (a restarted engine); the latest of them.
    ``None`` where a series ran on from before the window."""

    @property
    def count(self) -> float:
        """Observations in the window."""
        return math.fsum(self.counts)

    def mean_seconds(self) -> float | None:
        """Mean (seconds); ``None`` without observations."""
        count = self.count
        return self.total_seconds / count if count > 0 else None

    def quantile_seconds(self, q: float) -> float | None:
        """The ``q``-quantile (0..1) as PromQL's ``histogram_quantile`` estimates it (module
        docstring); ``None`` without observations. Raises ``ValueError`` for ``q`` outside 0..1."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in 0..1, got {q}")
        count = self.count
        if count <= 0:
            return None
        rank, below = q * count, 0.0
        for index, in_bucket in enumerate(self.counts):
            if below + in_bucket >= rank and in_bucket > 0:
                if index == len(self.bounds):  # +Inf: the highest finite bound is all PromQL says
                    return self.bounds[-1] if self.bounds else None
                upper = self.bounds[index]
                lower = self.bounds[index - 1] if index else min(0.0, upper)
                return lower + (upper - lower) * (rank - below) / in_bucket
            below += in_bucket
        return self.bounds[-1] if self.bounds else None


@dataclass
class _Point:
    time_ns: int
    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    total: float


def _increase(points: list[_Point], start_ns: int) -> tuple[tuple[float, ...], list[float], float] | None:
    """One series' increase after ``start_ns`` (points sorted by time): its bounds, counts per
    bucket and sum; ``None`` when it has no point after ``start_ns``. The base is the latest
    point at or before ``start_ns``, else the series' first point (what came before it was
    not observed); a point with a lower count than the one before, or other bounds, restarts.
    ``began`` of :class:`LatencyHistogram` tells the second case."""
    before = [p for p in points if p.time_ns <= start_ns]
    inside = [p for p in points if p.time_ns > start_ns]
    if not inside:
        return None
    previous = before[-1] if before else None
    bounds = inside[-1].bounds
    counts = [0.0] * (len(bounds) + 1)
    total = 0.0
    for point in inside:
        if previous is None:
            previous = point
            continue
        restarted = point.bounds != previous.bounds or sum(point.counts) < sum(previous.counts)
        if point.bounds == bounds:
            base = (0.0,) * len(point.counts) if restarted else previous.counts
            for i, (now, then) in enumerate(zip(point.counts, base)):
                counts[i] += max(0.0, now - then)
            total += point.total - (0.0 if restarted else previous.total)
        previous = point
    return bounds, counts, total


def _began(points: list[_Point], start_ns: int) -> int | None:
    """When the series' counters began at or after ``start_ns``: its first point there, where
    none came before or it counted less than the one before (the engine restarted). A window
    that starts at an engine's first scrape (the range ``inferpath import`` suggests) holds
    its beginning."""
    before = [p for p in points if p.time_ns < start_ns]
    inside = [p for p in points if p.time_ns >= start_ns]
    if inside and (not before or sum(inside[0].counts) < sum(before[-1].counts)):
        return inside[0].time_ns
    return None


def fetch_window_histograms(
    store: Any, start: datetime, end: datetime, *, lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS
) -> dict[str, LatencyHistogram]:
    """Request column (:data:`HISTOGRAM_COLUMNS`) → the engines' :class:`LatencyHistogram` over
    ``(start, end]`` (module docstring), for the columns some engine exported in it. Series
    with other bounds than the largest group of them are left out. ``start``/``end``:
    timezone-aware datetimes (``ValueError`` otherwise)."""
    start_ns, end_ns = aware_unix_ns(start, "start"), aware_unix_ns(end, "end")
    names = list(HISTOGRAM_COLUMNS.values())
    sql = (
        "SELECT MetricName, ServiceName, ResourceAttributes, Attributes, toUnixTimestamp64Nano(TimeUnix),"
        " ExplicitBounds, BucketCounts, Sum FROM otel_metrics_histogram"
        " WHERE MetricName IN ({m0:String}, {m1:String}, {m2:String})"
        " AND toUnixTimestamp64Nano(TimeUnix) > {from_ns:Int64} AND toUnixTimestamp64Nano(TimeUnix) <= {to_ns:Int64}"
        " ORDER BY toUnixTimestamp64Nano(TimeUnix)"
    )
    parameters: dict[str, Any] = {f"m{i}": name for i, name in enumerate(names)}
    parameters.update(from_ns=start_ns - int(lookback_seconds * 1e9), to_ns=end_ns)
    series: dict[tuple, list[_Point]] = {}
    for name, service, resource, attributes, time_ns, bounds, counts, total in store.query(sql, parameters):
        point = _Point(int(time_ns), tuple(float(b) for b in bounds), tuple(float(c) for c in counts), float(total))
        # The bounds are part of a series' identity: two engines whose labels the collector
        # merged, with other buckets, stay two series (a change of bounds is not a restart).
        resource_key, attributes_key = (
            tuple(sorted((resource or {}).items())),
            tuple(sorted((attributes or {}).items())),
        )
        if len(point.counts) == len(point.bounds) + 1:
            series.setdefault((name, service, resource_key, attributes_key, point.bounds), []).append(point)
    grouped: dict[str, dict[tuple[float, ...], tuple[list[float], float, int | None]]] = {}
    for key, points in series.items():
        got = _increase(points, start_ns)
        if got is None:
            continue
        bounds, counts, total = got
        same = grouped.setdefault(key[0], {})
        summed, summed_total, began = same.get(bounds, ([0.0] * len(counts), 0.0, 0))
        this = _began(points, start_ns)
        began = None if began is None or this is None else max(began, this)
        same[bounds] = ([a + b for a, b in zip(summed, counts)], summed_total + total, began)
    out: dict[str, LatencyHistogram] = {}
    column_of = {name: column for column, name in HISTOGRAM_COLUMNS.items()}
    for name, by_bounds in grouped.items():
        bounds, (counts, total, began) = max(by_bounds.items(), key=lambda item: math.fsum(item[1][0]))
        out[column_of[name]] = LatencyHistogram(bounds, tuple(counts), total, began)
    return out


__all__ = ["HISTOGRAM_COLUMNS", "LatencyHistogram", "fetch_window_histograms"]
