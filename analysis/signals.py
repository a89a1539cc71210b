"""Engine and GPU signals read back from storage, aligned in time with an as-of join.

The collectors store canonical signals (units converted once, in the signal catalog) in
``otel_metrics_gauge`` and the preemption counter in ``otel_metrics_sum``, one series per
engine or GPU (its ``Attributes`` / ``ResourceAttributes``). This module reads them as
sorted per-series arrays, looks values up "as of" a time (the latest sample at or before
it, no older than a lookback, which is how PromQL evaluates an instant vector), combines
series, and summarizes a window.

How series combine across engines / GPUs, and why:

- ``queue_depth``, ``running_requests``: summed; requests waiting anywhere add up.
- ``kv_cache_usage_ratio``: maximum; the fullest engine is the one that preempts.
- ``gpu_utilization_ratio``: mean; "would more GPUs help" is a fleet-wide question.
- ``gpu_memory_used_bytes``, ``gpu_power_watts``: summed over GPUs.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Mapping, Sequence

from inferpath.analysis.percentiles import quantile
from inferpath.storage.rows import unix_ns_from_datetime

QUEUE_DEPTH = "queue_depth"
RUNNING_REQUESTS = "running_requests"
KV_CACHE_USAGE_RATIO = "kv_cache_usage_ratio"
GPU_UTILIZATION_RATIO = "gpu_utilization_ratio"
GPU_MEMORY_USED_BYTES = "gpu_memory_used_bytes"
GPU_POWER_WATTS = "gpu_power_watts"
PREEMPTIONS_TOTAL = "preemptions_total"

GAUGES: tuple[str, ...] = (
    QUEUE_DEPTH, RUNNING_REQUESTS, KV_CACHE_USAGE_RATIO,
    GPU_UTILIZATION_RATIO, GPU_MEMORY_USED_BYTES, GPU_POWER_WATTS,
)

DEFAULT_LOOKBACK_SECONDS = 300.0
"""A sample older than this is stale, as in Prometheus' default 5 m lookback delta."""


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


COMBINE: dict[str, Callable[[Sequence[float]], float]] = {
    QUEUE_DEPTH: math.fsum,
    RUNNING_REQUESTS: math.fsum,
    KV_CACHE_USAGE_RATIO: max,
    GPU_UTILIZATION_RATIO: _mean,
    GPU_MEMORY_USED_BYTES: math.fsum,
    GPU_POWER_WATTS: math.fsum,
}


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


SeriesKey = tuple
"""(service name, sorted resource attributes, sorted attributes): identifies a series."""


def combined_asof(
    series: Mapping[SeriesKey, Series], at_ns: int, combine: Callable[[Sequence[float]], float],
    lookback_ns: int,
) -> float | None:
    """As-of value of each series at ``at_ns`` combined with ``combine``; ``None`` if none has one."""
    values = [v for v in (s.asof(at_ns, lookback_ns) for s in series.values()) if v is not None]
    return combine(values) if values else None


def fetch_series(
    store: Any, metric_name: str, start: datetime, end: datetime, *,
    table: str = "otel_metrics_gauge", lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS,
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
    start_ns, end_ns = _unix_ns(start, "start"), _unix_ns(end, "end")
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


def _unix_ns(value: datetime, name: str) -> int:
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
    def of(cls, values: Sequence[float]) -> "SignalStats | None":
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
    steps: list[tuple[float | None, float | None, float | None]] = field(default_factory=list)
    """Per aligned step: (queue depth, running requests, KV-cache usage ratio), ``None``
    where not reported: what :mod:`~inferpath.analysis.engine_state` reads to tell what
    held requests back at the same moment."""

    def stat(self, name: str, which: str = "mean") -> float | None:
        """``which`` (mean, p90, max) of gauge ``name``, or ``None`` when not reported."""
        stats = self.gauges.get(name)
        return None if stats is None else getattr(stats, which)

    @classmethod
    def from_values(cls, values: Mapping[str, Iterable[float]], preemptions: float | None = None) -> "WindowSignals":
        """Build from already-aligned values per gauge (tests, other sources)."""
        gauges = {}
        for name, series in values.items():
            stats = SignalStats.of([float(v) for v in series])
            if stats is not None:
                gauges[name] = stats
        return cls(gauges=gauges, preemptions=preemptions, steps=aligned_steps(
            {name: [None if v is None else float(v) for v in series] for name, series in values.items()}))


def aligned_steps(columns: Mapping[str, Sequence[float | None]]) -> list[tuple[float | None, float | None, float | None]]:
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


class StoredSignalWindows:
    """The :class:`SignalWindows` of two windows of ``store``, read with
    :func:`fetch_signal_windows` on first use of :attr:`current` or :attr:`baseline` (a
    diagnosis that finds nothing degraded reads neither). ``current`` / ``baseline``:
    ``(start, end)`` timezone-aware datetimes; ``baseline`` ``None`` when the diagnosis has
    none (its signals are then empty)."""

    def __init__(self, store: Any, current: tuple[datetime, datetime], baseline: tuple[datetime, datetime] | None,
                 *, service_name: str | None = None) -> None:
        self.store, self.service_name = store, service_name
        self._windows = (current, baseline)
        self._read: SignalWindows | None = None

    def _get(self) -> SignalWindows:
        if self._read is None:
            current, baseline = self._windows
            if baseline is None:
                self._read = SignalWindows(current=fetch_window_signals(self.store, *current,
                                                                        service_name=self.service_name))
            else:
                self._read = fetch_signal_windows(self.store, current, baseline, service_name=self.service_name)
        return self._read

    @property
    def current(self) -> WindowSignals:
        """Signals of the window under diagnosis."""
        return self._get().current

    @property
    def baseline(self) -> WindowSignals:
        """Signals of the baseline window."""
        return self._get().baseline


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
    start_ns, end_ns = _unix_ns(start, "start"), _unix_ns(end, "end")
    step_ns = int(step_seconds * 1e9)
    if step_ns <= 0:
        raise ValueError(f"step_seconds must be > 0, got {step_seconds!r}")
    origin_ns = start_ns
    if step_ns >= MINUTE_NS:
        step_ns = -(-step_ns // MINUTE_NS) * MINUTE_NS
        origin_ns = start_ns - start_ns % step_ns
    # As of just before each step's end: a sample at the end belongs to the next step.
    return origin_ns, step_ns, len(range(origin_ns + step_ns - 1, end_ns, step_ns))


def fetch_window_signals(
    store: Any, start: datetime, end: datetime, *, step_seconds: float | None = None,
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS, service_name: str | None = None,
) -> WindowSignals:
    """Summarize every canonical signal over ``[start, end)``.

    Each gauge is sampled as of the end of every step of :func:`alignment_grid` (step
    ``step_seconds``, default :func:`window_step_seconds`), series combined per
    :data:`COMBINE`, and the aligned values summarized. Preemptions: increase of
    ``preemptions_total`` summed over series. The alignment runs inside the store
    (:mod:`inferpath.analysis.timeline_query`; from the per-minute gauge rollup on a grid of
    whole minutes); the result equals :func:`fetch_window_signals_rows`, which does it over
    every sample in Python.
    """
    # Imported here: timeline_query builds on this module's COMBINE.
    from inferpath.analysis.timeline_query import fetch_counter_increases, fetch_gauge_columns

    step = step_seconds or window_step_seconds(start, end)
    start_ns, end_ns = _unix_ns(start, "start"), _unix_ns(end, "end")
    origin_ns, step_ns, steps = alignment_grid(start, end, step)
    origin = _datetime_of_ns(origin_ns, start)
    options = {"lookback_seconds": lookback_seconds, "service_name": service_name}
    result = WindowSignals()
    columns = fetch_gauge_columns(store, GAUGES, start=origin, end=end, step_ns=step_ns, steps=steps, **options)
    for name, aligned in columns.items():
        stats = SignalStats.of([v for v in aligned if v is not None])
        if stats is not None:
            result.gauges[name] = stats
    result.steps = aligned_steps(columns)
    if end_ns > start_ns:
        result.preemptions = fetch_counter_increases(store, PREEMPTIONS_TOTAL, start=start, end=end,
                                                     step_ns=end_ns - start_ns, steps=1, **options)[0]
    return result


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _datetime_of_ns(unix_ns: int, exact: datetime) -> datetime:
    """``exact`` when it is that instant, else the UTC datetime of a whole-µs Unix-ns instant."""
    return exact if unix_ns_from_datetime(exact) == unix_ns else _EPOCH + timedelta(microseconds=unix_ns // 1000)


def fetch_signal_windows(
    store: Any, current: tuple[datetime, datetime], baseline: tuple[datetime, datetime], *,
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS, service_name: str | None = None,
) -> SignalWindows:
    """:func:`fetch_window_signals` of both windows (default steps), with one gauge query
    for both when their :func:`alignment_grid` points lie on one grid (always for windows
    over 10 h of the same length; for a baseline of the same length right before the window
    when the step divides it) and one counter query when the baseline ends where the window
    starts and is as long. The answer equals the two calls'.
    """
    from inferpath.analysis.timeline_query import fetch_counter_increases, fetch_gauge_columns

    grids = [alignment_grid(start, end, window_step_seconds(start, end)) for start, end in (current, baseline)]
    (c_origin, c_step, c_steps), (b_origin, b_step, b_steps) = grids
    first_origin = min(c_origin, b_origin)
    if c_step != b_step or (c_origin - b_origin) % c_step or not (c_steps and b_steps):
        return SignalWindows(
            current=fetch_window_signals(store, *current, lookback_seconds=lookback_seconds,
                                         service_name=service_name),
            baseline=fetch_window_signals(store, *baseline, lookback_seconds=lookback_seconds,
                                          service_name=service_name))
    options = {"lookback_seconds": lookback_seconds, "service_name": service_name}
    offsets = [(origin - first_origin) // c_step for origin in (c_origin, b_origin)]
    steps = max(offset + count for offset, count in zip(offsets, (c_steps, b_steps)))
    earliest = current if c_origin <= b_origin else baseline
    # Each window's points are a run of the shared grid; reading the union's samples
    # changes no as-of value (see fetch_gauge_columns).
    columns = fetch_gauge_columns(store, GAUGES, start=_datetime_of_ns(first_origin, earliest[0]),
                                  end=max(current[1], baseline[1]), step_ns=c_step, steps=steps, **options)
    out = []
    for offset, count in zip(offsets, (c_steps, b_steps)):
        signals = WindowSignals()
        for name, aligned in columns.items():
            stats = SignalStats.of([v for v in aligned[offset:offset + count] if v is not None])
            if stats is not None:
                signals.gauges[name] = stats
        signals.steps = aligned_steps({name: aligned[offset:offset + count] for name, aligned in columns.items()})
        out.append(signals)
    length_ns = _unix_ns(current[1], "end") - _unix_ns(current[0], "start")
    if baseline[1] == current[0] and baseline[1] - baseline[0] == current[1] - current[0] and length_ns > 0:
        # Steps (baseline_start, baseline_end] and (window_start, window_end]: as two calls.
        out[1].preemptions, out[0].preemptions = fetch_counter_increases(
            store, PREEMPTIONS_TOTAL, start=baseline[0], end=current[1], step_ns=length_ns, steps=2, **options)
    else:
        for signals, (start, end) in zip(out, (current, baseline)):
            if end > start:
                signals.preemptions = fetch_counter_increases(
                    store, PREEMPTIONS_TOTAL, start=start, end=end,
                    step_ns=_unix_ns(end, "end") - _unix_ns(start, "start"), steps=1, **options)[0]
    return SignalWindows(current=out[0], baseline=out[1])


def fetch_window_signals_rows(
    store: Any, start: datetime, end: datetime, *, step_seconds: float | None = None,
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS, service_name: str | None = None,
) -> WindowSignals:
    """:func:`fetch_window_signals` over every sample read into Python (:func:`fetch_series`):
    the reference definition, slow over wide windows."""
    step = step_seconds or window_step_seconds(start, end)
    start_ns, end_ns = _unix_ns(start, "start"), _unix_ns(end, "end")
    origin_ns, step_ns, _ = alignment_grid(start, end, step)
    lookback_ns = int(lookback_seconds * 1e9)
    points = range(origin_ns + step_ns - 1, end_ns, step_ns)
    result = WindowSignals()
    columns = {}
    for name in GAUGES:
        series = fetch_series(store, name, start, end, lookback_seconds=lookback_seconds, service_name=service_name)
        aligned = [combined_asof(series, t, COMBINE[name], lookback_ns) for t in points]
        columns[name] = aligned
        stats = SignalStats.of([v for v in aligned if v is not None])
        if stats is not None:
            result.gauges[name] = stats
    result.steps = aligned_steps(columns)
    counters = fetch_series(store, PREEMPTIONS_TOTAL, start, end, table="otel_metrics_sum",
                            lookback_seconds=lookback_seconds, service_name=service_name)
    increases = [c for c in (s.counter_increase(start_ns, end_ns, lookback_ns) for s in counters.values())
                 if c is not None]
    result.preemptions = math.fsum(increases) if increases else None
    return result


__all__ = [
    "COMBINE",
    "DEFAULT_LOOKBACK_SECONDS",
    "GAUGES",
    "GPU_MEMORY_USED_BYTES",
    "GPU_POWER_WATTS",
    "GPU_UTILIZATION_RATIO",
    "KV_CACHE_USAGE_RATIO",
    "PREEMPTIONS_TOTAL",
    "QUEUE_DEPTH",
    "RUNNING_REQUESTS",
    "Series",
    "SignalStats",
    "SignalWindows",
    "StoredSignalWindows",
    "WindowSignals",
    "aligned_steps",
    "alignment_grid",
    "combined_asof",
    "fetch_series",
    "fetch_signal_windows",
    "fetch_window_signals",
    "fetch_window_signals_rows",
    "window_step_seconds",
]
