"""Engine and GPU signals read back from storage, aligned in time with an as-of join.

The collectors store canonical signals (units converted once, in the signal catalog) in
``otel_metrics_gauge`` and the preemption counter in ``otel_metrics_sum``, one series per
engine or GPU (its ``Attributes`` / ``ResourceAttributes``). This module reads them as
sorted per-series arrays, looks values up "as of" a time (the latest sample at or before
it, no older than a lookback, which is how PromQL evaluates an instant vector), combines
series, and summarizes a window.

How series combine across engines / GPUs, and why, is the vocabulary's
(:attr:`inferpath.vocabulary.Signal.across`): queue depth and running requests summed
(requests waiting anywhere add up), KV-cache usage the maximum (the fullest engine is the
one that preempts), GPU utilization the mean ("would more GPUs help" is a fleet-wide
question), GPU memory and power summed over GPUs. What held a queue is a question about
one engine (its own batch limit, its own KV pool), so the steps of each engine are kept
too (:attr:`WindowSignals.engines`).

The in-database path that answers the same questions over wide windows (alignment in
ClickHouse, :func:`~inferpath.analysis.timeline_query.fetch_window_signals`) builds on the
definitions here; :func:`fetch_window_signals_rows` is its reference, over every sample.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from inferpath.analysis.percentiles import quantile
from inferpath.storage.rows import unix_ns_from_datetime
from inferpath.vocabulary import (
    KV_CACHE_USAGE_RATIO,
    PREEMPTIONS_TOTAL,
    QUEUE_DEPTH,
    RUNNING_REQUESTS,
    SATURATION_GAUGES,
    SIGNALS,
    SOURCE_METRIC_ATTRIBUTE,
)

DEFAULT_LOOKBACK_SECONDS = 300.0
"""A sample older than this is stale, as in Prometheus' default 5 m lookback delta."""


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


_ACROSS: dict[str, Callable[[Sequence[float]], float]] = {"sum": math.fsum, "max": max, "mean": _mean}

COMBINE: dict[str, Callable[[Sequence[float]], float]] = {
    name: _ACROSS[signal.across] for name, signal in SIGNALS.items() if signal.kind == "gauge"
}
"""Gauge name → how its series (engines, GPUs) combine into one value: the vocabulary's
:attr:`~inferpath.vocabulary.Signal.across` as a function of the series' values."""


@dataclass
class Series:
    """One time series: ``times_ns`` (Unix ns, ascending) and ``values`` of equal length."""

    times_ns: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def asof(self, at_ns: int, lookback_ns: int) -> float | None:
        """Value of the latest sample with ``at_ns - lookback_ns ≤ time ≤ at_ns``, else ``None``."""
        index = bisect_right(self.times_ns, at_ns) - 1
        if index < 0 or at_ns - self.times_ns[index] > lookback_ns:
            return None
        return self.values[index]

    def counter_increase(self, start_ns: int, end_ns: int, lookback_ns: int) -> float | None:
        """Increase of a cumulative counter over ``(start_ns, end_ns]``, reset-aware.

        The base is the latest sample at or before ``start_ns`` (within the lookback); a
        sample lower than its predecessor is a restart counted from zero, as PromQL's
        ``increase`` treats resets. ``None`` when no sample lies in the window.
        """
        previous = self.asof(start_ns, lookback_ns)
        first = bisect_right(self.times_ns, start_ns)
        last = bisect_right(self.times_ns, end_ns)
        if first >= last:
            return None
        total = 0.0
        for value in self.values[first:last]:
            if previous is not None:
                total += value - previous if value >= previous else value
            previous = value
        return total


def combined_asof(
    series: Mapping[SeriesKey, Series],
    at_ns: int,
    combine: Callable[[Sequence[float]], float],
    lookback_ns: int,
) -> float | None:
    """As-of value of each series at ``at_ns`` combined with ``combine``; ``None`` if none has one."""
    values = [v for v in (s.asof(at_ns, lookback_ns) for s in series.values()) if v is not None]
    return combine(values) if values else None


def fetch_series(
    store: Any,
    metric_name: str,
    start: datetime,
    end: datetime,
    *,
    table: str = "otel_metrics_gauge",
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS,
    service_name: str | None = None,
) -> dict[SeriesKey, Series]:
    """Samples of ``metric_name`` with ``start - lookback < TimeUnix ≤ end``, one :class:`Series`
    per distinct (ServiceName, ResourceAttributes, Attributes).

    ``table`` is ``otel_metrics_gauge`` or ``otel_metrics_sum`` (``ValueError`` otherwise);
    ``start``/``end`` are timezone-aware datetimes.
    """
    if table not in ("otel_metrics_gauge", "otel_metrics_sum"):
        raise ValueError(f"table must be otel_metrics_gauge or otel_metrics_sum, got {table!r}")
    sql = (
        "SELECT ServiceName, ResourceAttributes, Attributes, toUnixTimestamp64Nano(TimeUnix), Value"
        f" FROM {table}"
        " WHERE MetricName = {metric:String}"
        " AND toUnixTimestamp64Nano(TimeUnix) > {from_ns:Int64}"
        " AND toUnixTimestamp64Nano(TimeUnix) <= {to_ns:Int64}"
    )
    start_ns, end_ns = aware_unix_ns(start, "start"), aware_unix_ns(end, "end")
    parameters: dict[str, Any] = {
        "metric": metric_name,
        "from_ns": start_ns - int(lookback_seconds * 1e9),
        "to_ns": end_ns,
    }
    if service_name is not None:
        sql += " AND ServiceName = {service:String}"
        parameters["service"] = service_name
    sql += " ORDER BY toUnixTimestamp64Nano(TimeUnix)"
    out: dict[SeriesKey, Series] = {}
    for service, resource, attributes, time_ns, value in store.query(sql, parameters):
        key = (service, tuple(sorted((resource or {}).items())), tuple(sorted((attributes or {}).items())))
        series = out.setdefault(key, Series())
        series.times_ns.append(int(time_ns))
        series.values.append(float(value))
    return out


SeriesKey = tuple
"""(service name, sorted resource attributes, sorted attributes): identifies a series."""

Step = tuple[float | None, float | None, float | None]
"""One aligned step of an engine: (queue depth, running requests, KV-cache usage ratio)."""


def aware_unix_ns(value: datetime, name: str) -> int:
    """Unix ns of ``value``; ``ValueError`` naming ``name`` when it is not timezone-aware."""
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got {value!r}")
    return unix_ns_from_datetime(value)


@dataclass(frozen=True)
class SignalStats:
    """Summary of one combined signal over a window, in the signal's unit.

    ``mean``, ``p90`` (exact, of the aligned values) and ``max``; ``samples``: aligned points.
    """

    mean: float
    p90: float
    max: float
    samples: int

    @classmethod
    def of(cls, values: Sequence[float]) -> SignalStats | None:
        """Stats of ``values``; ``None`` for no values."""
        if not values:
            return None
        return cls(mean=_mean(values), p90=quantile(values, 0.9), max=max(values), samples=len(values))


@dataclass
class WindowSignals:
    """Engine and GPU state over one window: ``gauges`` maps canonical gauge name ->
    :class:`SignalStats` (absent when never reported); ``preemptions`` is the preemption
    counter's increase over the window (``None`` when not reported); ``steps`` the aligned
    queue / running / KV values step by step."""

    gauges: dict[str, SignalStats] = field(default_factory=dict)
    preemptions: float | None = None
    steps: list[Step] = field(default_factory=list)
    """Per aligned step: (queue depth, running requests, KV-cache usage ratio), ``None``
    where not reported, combined over engines: what
    :mod:`~inferpath.analysis.engine_state` reads to tell what held requests back at the
    same moment."""
    engines: dict[SeriesKey, list[Step]] = field(default_factory=dict)
    """The same steps per engine (series key of its queue depth without the source-metric
    attribute), where two engines or more report a queue depth and each reports its running
    batch under the same labels; else empty."""
    engine_preemptions: dict[SeriesKey, float] = field(default_factory=dict)
    """The preemption counter's increase per engine (keyed as :attr:`engines`), for the
    engines whose counter carries their gauges' labels; else empty (then only the window's
    total tells)."""

    def set_preemptions(self, by_series: Mapping[SeriesKey, float | None]) -> None:
        """Set :attr:`preemptions` (the sum, ``None`` when no series reported) and
        :attr:`engine_preemptions` from the counter's increase per series."""
        reported = [v for v in by_series.values() if v is not None]
        self.preemptions = math.fsum(reported) if reported else None
        by_engine = {engine_key(key): value for key, value in by_series.items()}
        if not self.engines or len(by_engine) < len(by_series):  # two counters of one engine
            self.engine_preemptions = {}
            return
        self.engine_preemptions = {key: value for key in self.engines if (value := by_engine.get(key)) is not None}

    def stat(self, name: str, which: str = "mean") -> float | None:
        """``which`` (mean, p90, max) of gauge ``name``, or ``None`` when not reported."""
        stats = self.gauges.get(name)
        return None if stats is None else getattr(stats, which)

    @classmethod
    def from_values(cls, values: Mapping[str, Iterable[float]], preemptions: float | None = None) -> WindowSignals:
        """Build from already-aligned values per gauge, one engine (tests, other sources)."""
        gauges = {}
        for name, series in values.items():
            stats = SignalStats.of([float(v) for v in series])
            if stats is not None:
                gauges[name] = stats
        return cls(
            gauges=gauges,
            preemptions=preemptions,
            steps=aligned_steps(
                {name: [None if v is None else float(v) for v in series] for name, series in values.items()}
            ),
        )

    @classmethod
    def from_series_columns(
        cls, columns: Mapping[str, Mapping[SeriesKey, Sequence[float | None]]], lo: int = 0, hi: int | None = None
    ) -> WindowSignals:
        """Stats, combined steps and per-engine steps of the aligned steps ``lo:hi`` of
        ``columns`` (gauge name → series key → one as-of value per step); no preemptions."""
        sliced = {name: {key: list(col[lo:hi]) for key, col in by.items()} for name, by in columns.items()}
        combined = {name: combine_columns(by, COMBINE.get(name, max)) for name, by in sliced.items()}
        result = cls(steps=aligned_steps(combined), engines=engine_steps(sliced))
        for name, aligned in combined.items():
            stats = SignalStats.of([v for v in aligned if v is not None])
            if stats is not None:
                result.gauges[name] = stats
        return result


def combine_columns(
    by_series: Mapping[SeriesKey, Sequence[float | None]], combine: Callable[[Sequence[float]], float]
) -> list[float | None]:
    """One column from per-series columns of equal length: ``combine`` of the values present
    at each step, ``None`` where no series has one."""
    length = max((len(c) for c in by_series.values()), default=0)
    out: list[float | None] = []
    for i in range(length):
        values = [c[i] for c in by_series.values() if i < len(c) and c[i] is not None]
        out.append(combine(values) if values else None)  # type: ignore[arg-type]
    return out


def engine_steps(columns: Mapping[str, Mapping[SeriesKey, Sequence[float | None]]]) -> dict[SeriesKey, list[Step]]:
    """Aligned steps per engine: one per queue-depth series whose running batch is reported
    under the same series key (KV usage too where it is, else ``None``). Empty for fewer
    than two engines, or when a queue series has no running series of its own (the labels
    of the three gauges do not pair up, and one engine cannot be told from another)."""
    queues, running, kv = (
        _by_engine(columns.get(name) or {}) for name in (QUEUE_DEPTH, RUNNING_REQUESTS, KV_CACHE_USAGE_RATIO)
    )
    if len(queues) < 2 or any(key not in running for key in queues):
        return {}
    return {
        key: aligned_steps({QUEUE_DEPTH: q, RUNNING_REQUESTS: running[key], KV_CACHE_USAGE_RATIO: kv.get(key) or []})
        for key, q in queues.items()
    }


def engine_key(series: SeriesKey) -> SeriesKey:
    """The engine a series belongs to: its key without the source-metric attribute (which
    differs between two signals of one engine)."""
    service, resource, attributes = series
    return (service, resource, tuple(kv for kv in attributes if kv[0] != SOURCE_METRIC_ATTRIBUTE))


def _by_engine(by_series: Mapping[SeriesKey, Sequence[float | None]]) -> dict[SeriesKey, Sequence[float | None]]:
    """``by_series`` keyed by :func:`engine_key`; ``{}`` if two series share an engine."""
    out: dict[SeriesKey, Sequence[float | None]] = {}
    for series, column in by_series.items():
        key = engine_key(series)
        if key in out:
            return {}
        out[key] = column
    return out


def aligned_steps(columns: Mapping[str, Sequence[float | None]]) -> list[Step]:
    """(queue depth, running, KV usage) per step from aligned gauge columns of equal length;
    empty when the engine reported none of the three."""
    picked = [list(columns.get(name) or []) for name in (QUEUE_DEPTH, RUNNING_REQUESTS, KV_CACHE_USAGE_RATIO)]
    length = max((len(c) for c in picked), default=0)
    if not length:
        return []
    padded = [c + [None] * (length - len(c)) for c in picked]
    return list(zip(*padded))


@dataclass
class SignalWindows:
    """The signals of the window under diagnosis and of its baseline window."""

    current: WindowSignals = field(default_factory=WindowSignals)
    baseline: WindowSignals = field(default_factory=WindowSignals)


def window_step_seconds(start: datetime, end: datetime, max_points: int = 600) -> float:
    """Alignment step for a window: 1 s (the usual scrape interval) up to ``max_points`` steps."""
    return max(1.0, (end - start).total_seconds() / max_points)


MINUTE_NS = 60_000_000_000


def alignment_grid(start: datetime, end: datetime, step_seconds: float) -> tuple[int, int, int]:
    """``(origin_ns, step_ns, steps)``: a window's gauges are sampled as of
    ``origin_ns + (i + 1)·step_ns − 1`` for ``i < steps``, every such point in ``[start, end)``.

    A step under a minute starts at ``start`` (``origin_ns`` = start). A step of a minute or
    more (windows over 10 h at 600 points) is rounded up to whole minutes and the grid is
    anchored at the Unix epoch: its points are then minutes' last nanoseconds, which the
    per-minute gauge rollup answers exactly, and two windows share one grid. A day is then
    480 points instead of 600; the verdict's means and p90s do not need more.
    Raises ``ValueError`` for naive datetimes or a step under 1 ns.
    """
    start_ns, end_ns = aware_unix_ns(start, "start"), aware_unix_ns(end, "end")
    step_ns = int(step_seconds * 1e9)
    if step_ns <= 0:
        raise ValueError(f"step_seconds must be > 0, got {step_seconds!r}")
    origin_ns = start_ns
    if step_ns >= MINUTE_NS:
        step_ns = -(-step_ns // MINUTE_NS) * MINUTE_NS
        origin_ns = start_ns - start_ns % step_ns
    # As of just before each step's end: a sample at the end belongs to the next step.
    return origin_ns, step_ns, len(range(origin_ns + step_ns - 1, end_ns, step_ns))


def fetch_window_signals_rows(
    store: Any,
    start: datetime,
    end: datetime,
    *,
    step_seconds: float | None = None,
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS,
    service_name: str | None = None,
) -> WindowSignals:
    """:func:`~inferpath.analysis.timeline_query.fetch_window_signals` over every sample read
    into Python (:func:`fetch_series`): the reference definition, slow over wide windows."""
    step = step_seconds or window_step_seconds(start, end)
    start_ns, end_ns = aware_unix_ns(start, "start"), aware_unix_ns(end, "end")
    origin_ns, step_ns, _ = alignment_grid(start, end, step)
    lookback_ns = int(lookback_seconds * 1e9)
    points = range(origin_ns + step_ns - 1, end_ns, step_ns)
    columns = {}
    for name in SATURATION_GAUGES:
        series = fetch_series(store, name, start, end, lookback_seconds=lookback_seconds, service_name=service_name)
        columns[name] = {key: [s.asof(t, lookback_ns) for t in points] for key, s in series.items()}
    result = WindowSignals.from_series_columns(columns)
    counters = fetch_series(
        store,
        PREEMPTIONS_TOTAL,
        start,
        end,
        table="otel_metrics_sum",
        lookback_seconds=lookback_seconds,
        service_name=service_name,
    )
    result.set_preemptions({key: s.counter_increase(start_ns, end_ns, lookback_ns) for key, s in counters.items()})
    return result


__all__ = [
    "COMBINE",
    "DEFAULT_LOOKBACK_SECONDS",
    "Series",
    "SeriesKey",
    "SignalStats",
    "SignalWindows",
    "WindowSignals",
    "Step",
    "aligned_steps",
    "combine_columns",
    "engine_steps",
    "alignment_grid",
    "aware_unix_ns",
    "combined_asof",
    "fetch_series",
    "fetch_window_signals_rows",
    "window_step_seconds",
]
