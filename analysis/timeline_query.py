"""The per-step columns of a correlation timeline, aggregated inside ClickHouse.

:func:`inferpath.analysis.correlate.build_timeline` defines the timeline over rows and
samples held in Python; over a day that is a million request rows and hundreds of thousands
of samples read out of the store for 600 steps. The functions here return the same columns
from a few hundred rows per series:

- Request columns: one ``GROUP BY`` step with ``count()`` and the exact p99
  (``quantileExactInclusive``, type 7 as :func:`inferpath.analysis.percentiles.quantile`)
  and sum of TTFT, ITL and E2E. Values agree with the Python path to float rounding
  (the p99 is interpolated in ns, then divided by 1e9).
- Gauges: per series and step, the latest sample at or before the step's end
  (``argMax(Value, time)``, plus the time); Python then carries the latest sample forward
  over empty steps and drops it once older than the lookback, which is exactly
  :meth:`inferpath.analysis.signals.Series.asof`, and combines series per
  :data:`inferpath.analysis.signals.COMBINE`.
- Counters: per series and step ``(t, t + step]``, the first sample and the reset-aware sum
  of increases between consecutive samples inside the step; Python adds the increase from
  the last earlier sample within the lookback, which is
  :meth:`~inferpath.analysis.signals.Series.counter_increase`.

Series are told apart as :func:`inferpath.analysis.signals.fetch_series` does, by
(ServiceName, ResourceAttributes, Attributes). Samples at one instant of one series are not
ordered by anything, here or in the Python path.

On these columns rest the window summaries a diagnosis reads (:func:`fetch_window_signals`,
:func:`fetch_signal_windows`, :class:`StoredSignalWindows`), equal to
:func:`inferpath.analysis.signals.fetch_window_signals_rows` over every sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from inferpath.analysis.breakdown import FINAL_SETTINGS, request_filter
from inferpath.analysis.signals import (
    COMBINE,
    DEFAULT_LOOKBACK_SECONDS,
    SeriesKey,
    SignalWindows,
    WindowSignals,
    alignment_grid,
    aware_unix_ns,
    combine_columns,
    window_step_seconds,
)
from inferpath.storage import gauge_rollup
from inferpath.storage.rows import unix_ns_from_datetime
from inferpath.vocabulary import CLIENT_FIRST_SQL, PREEMPTIONS_TOTAL, SATURATION_GAUGES

REQUEST_COLUMNS: tuple[str, ...] = (
    "requests",
    "ttft_p99_seconds",
    "ttft_avg_seconds",
    "itl_p99_seconds",
    "e2e_p99_seconds",
)
"""The request columns, as :data:`inferpath.analysis.correlate.REQUEST_COLUMNS`."""

_SAMPLE_TABLES = ("otel_metrics_gauge", "otel_metrics_sum")


def _check_step(step_ns: int, steps: int) -> None:
    if step_ns <= 0:
        raise ValueError(f"step_ns must be > 0, got {step_ns!r}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps!r}")


def fetch_request_columns(
    store: Any,
    *,
    start: datetime,
    end: datetime,
    step_ns: int,
    steps: int,
    endpoint: str | None = None,
    endpoint_class: str | None = None,
    status: str | None = "ok",
    columns: dict[str, str] | None = None,
) -> dict[str, list[float | None]]:
    """Per step ``i`` (requests with ``start + i·step_ns ≤ timestamp < start + (i+1)·step_ns``,
    ``0 ≤ i < steps``, and ``timestamp < end``): :data:`REQUEST_COLUMNS` in seconds,
    ``requests`` the row count (``0.0`` for a step without rows), the others ``None`` where
    no row measured them. Filters as
    :func:`~inferpath.analysis.breakdown.request_filter` (``ok`` rows by default; ``columns``:
    service / model / replica).
    Equals :func:`inferpath.analysis.correlate.request_columns` of those rows.
    Raises ``ValueError`` for a non-positive ``step_ns`` or naive datetimes.
    """
    _check_step(step_ns, steps)
    where, parameters = request_filter(
        start=start, end=end, endpoint=endpoint, endpoint_class=endpoint_class, status=status, columns=columns
    )
    parameters |= {"origin_ns": unix_ns_from_datetime(start), "step_ns": step_ns}
    # TTFT and E2E as the end user saw them (the client's, else the server's), as every view shows them.
    measures = (CLIENT_FIRST_SQL["ttft"], "itl_ns", CLIENT_FIRST_SQL["e2e"])
    aggregates = ", ".join(f"count({m}), quantileExactInclusive(0.99)({m}), sum({m})" for m in measures)
    sql = (
        "SELECT intDiv(toUnixTimestamp64Nano(timestamp) - {origin_ns:Int64}, {step_ns:Int64}) AS step,"
        f" count(), {aggregates} FROM inferpath_requests FINAL WHERE {where}"
        f" GROUP BY step ORDER BY step{FINAL_SETTINGS}"
    )
    out: dict[str, list[float | None]] = {name: [None] * steps for name in REQUEST_COLUMNS}
    out["requests"] = [0.0] * steps
    for step, count, *stats in store.query(sql, parameters):
        if not 0 <= step < steps:
            continue
        (ttft_n, ttft_p99, ttft_sum), (itl_n, itl_p99, _), (e2e_n, e2e_p99, _) = (stats[0:3], stats[3:6], stats[6:9])
        out["requests"][step] = float(count)
        if ttft_n:
            out["ttft_p99_seconds"][step] = float(ttft_p99) / 1e9
            out["ttft_avg_seconds"][step] = int(ttft_sum) / 1e9 / ttft_n
        if itl_n:
            out["itl_p99_seconds"][step] = float(itl_p99) / 1e9
        if e2e_n:
            out["e2e_p99_seconds"][step] = float(e2e_p99) / 1e9
    return out


def _sample_sql(table: str, bucket: str, aggregates: str, service_name: str | None) -> str:
    if table not in _SAMPLE_TABLES:
        raise ValueError(f"table must be otel_metrics_gauge or otel_metrics_sum, got {table!r}")
    service = " AND ServiceName = {service:String}" if service_name is not None else ""
    return (
        f"SELECT MetricName, ServiceName, ResourceAttributes, Attributes, {bucket} AS bucket, {aggregates}"
        " FROM (SELECT MetricName, ServiceName, ResourceAttributes, Attributes, Value,"
        "  toUnixTimestamp64Nano(TimeUnix) AS time_ns"
        f"  FROM {table} WHERE MetricName IN {{names:Array(String)}}"
        "  AND toUnixTimestamp64Nano(TimeUnix) > {from_ns:Int64}"
        f"  AND toUnixTimestamp64Nano(TimeUnix) <= {{to_ns:Int64}}{service})"
        " GROUP BY MetricName, ServiceName, ResourceAttributes, Attributes, bucket"
        " ORDER BY bucket"
    )


def _sample_parameters(
    names: Sequence[str],
    start: datetime,
    end: datetime,
    step_ns: int,
    lookback_seconds: float,
    service_name: str | None,
) -> dict[str, Any]:
    start_ns = unix_ns_from_datetime(start)
    parameters: dict[str, Any] = {
        "names": list(names),
        "origin_ns": start_ns,
        "step_ns": step_ns,
        "from_ns": start_ns - int(lookback_seconds * 1e9),
        "to_ns": unix_ns_from_datetime(end),
    }
    if service_name is not None:
        parameters["service"] = service_name
    return parameters


def minute_grid(start: datetime, step_ns: int) -> bool:
    """Whether steps of ``step_ns`` from ``start`` are whole minutes from a minute's start,
    so that :func:`fetch_gauge_columns` may read the per-minute gauge rollup."""
    return step_ns % gauge_rollup.MINUTE_NS == 0 and unix_ns_from_datetime(start) % gauge_rollup.MINUTE_NS == 0


def _rollup_sql(bucket: str, service_name: str | None) -> str:
    """The gauge query of :func:`fetch_gauge_columns` over ``otel_metrics_gauge_1m``: per
    series and step, the latest of its minutes' latest samples. A minute is read when it may
    hold a sample of ``from < time ≤ to``; its samples outside that range are either older
    than the lookback at every step's end or later than the last step, so they change nothing."""
    service = " AND ServiceName = {service:String}" if service_name is not None else ""
    return (
        f"SELECT MetricName, ServiceName, ResourceAttributes, Attributes, {bucket} AS bucket,"
        " max(LastTimeNs) AS last_ns, argMaxMerge(LastValue) AS last_value"
        " FROM (SELECT MetricName, ServiceName, ResourceAttributes, Attributes, LastTimeNs, LastValue,"
        "  toInt64(toUnixTimestamp(Minute)) * 1000000000 AS time_ns"
        f"  FROM {gauge_rollup.GAUGE_ROLLUP_TABLE} WHERE MetricName IN {{names:Array(String)}}"
        "  AND Minute > toDateTime(intDiv({from_ns:Int64}, 1000000000) - 60, 'UTC')"
        f"  AND Minute <= toDateTime(intDiv({{to_ns:Int64}}, 1000000000), 'UTC'){service})"
        " GROUP BY MetricName, ServiceName, ResourceAttributes, Attributes, bucket"
        " ORDER BY bucket"
    )


def _series_key(service: str, resource: Any, attributes: Any) -> tuple:
    return (service, tuple(sorted((resource or {}).items())), tuple(sorted((attributes or {}).items())))


def fetch_gauge_columns(store: Any, names: Sequence[str], *, steps: int, **query: Any) -> dict[str, list[float | None]]:
    """Per gauge name, one value per step ``i < steps``: the series of
    :func:`fetch_gauge_series_columns` (``query``: its keyword arguments) combined per
    :data:`~inferpath.analysis.signals.COMBINE` (``max`` for a name not in it); ``None``
    where no series has a value. Equals :func:`~inferpath.analysis.signals.combined_asof`
    at each step's end."""
    by_series = fetch_gauge_series_columns(store, names, steps=steps, **query)
    return {name: combine_columns(by_series[name], COMBINE.get(name, max)) or [None] * steps for name in names}


def fetch_gauge_series_columns(
    store: Any,
    names: Sequence[str],
    *,
    start: datetime,
    end: datetime,
    step_ns: int,
    steps: int,
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS,
    service_name: str | None = None,
) -> dict[str, dict[SeriesKey, list[float | None]]]:
    """Per gauge name and series key, one value per step ``i < steps``: the series' latest
    sample at or before ``start + (i+1)·step_ns − 1`` and no older than
    ``lookback_seconds``, else ``None``. Samples are read with
    ``start − lookback < time ≤ end``, as :func:`~inferpath.analysis.signals.fetch_series`.
    Raises ``ValueError`` for a non-positive ``step_ns`` or naive datetimes.
    """
    _check_step(step_ns, steps)
    # A sample at time τ is visible from the step holding τ on: bucket ⌊(τ − start) / step⌋,
    # everything before the window's start in bucket −1.
    bucket = "if(time_ns < {origin_ns:Int64}, -1, intDiv(time_ns - {origin_ns:Int64}, {step_ns:Int64}))"
    parameters = _sample_parameters(names, start, end, step_ns, lookback_seconds, service_name)
    if minute_grid(start, step_ns) and gauge_rollup.is_ready(store):
        # Every step is whole minutes from a minute's start, so each step's latest sample is
        # the latest of its minutes' latest samples: the rollup answers with ~1/30 the rows.
        sql = _rollup_sql(bucket, service_name)
    else:
        sql = _sample_sql(
            "otel_metrics_gauge", bucket, "max(time_ns) AS last_ns, argMax(Value, time_ns) AS last_value", service_name
        )
    # One row per series with its steps as an array: turning each row's two Map columns into
    # Python dicts cost more than the query itself at hundreds of steps per series.
    rows = store.query(
        "SELECT MetricName, ServiceName, ResourceAttributes, Attributes,"
        " arraySort(groupArray((bucket, last_ns, last_value)))"
        f" FROM ({sql}) GROUP BY MetricName, ServiceName, ResourceAttributes, Attributes",
        parameters,
    )
    latest: dict[str, dict[tuple, list[tuple[int, int, float]]]] = {name: {} for name in names}
    for name, service, resource, attributes, points in rows:
        latest[name].setdefault(_series_key(service, resource, attributes), []).extend(
            (int(index), int(time_ns), float(value)) for index, time_ns, value in points
        )
    for by_series in latest.values():
        for buckets in by_series.values():
            buckets.sort()  # series told apart by ClickHouse but equal here come in two runs
    lookback_ns = int(lookback_seconds * 1e9)
    origin_ns = unix_ns_from_datetime(start)
    return {
        name: {key: _carry_asof(buckets, steps, origin_ns, step_ns, lookback_ns) for key, buckets in by.items()}
        for name, by in latest.items()
    }


def _carry_asof(
    buckets: list[tuple[int, int, float]], steps: int, origin_ns: int, step_ns: int, lookback_ns: int
) -> list[float | None]:
    """One series' as-of value at each step's end (buckets ascending), ``None`` where stale."""
    out: list[float | None] = []
    position, current = 0, None
    for step in range(steps):
        while position < len(buckets) and buckets[position][0] <= step:
            current = buckets[position]
            position += 1
        at_ns = origin_ns + (step + 1) * step_ns - 1
        out.append(current[2] if current is not None and at_ns - current[1] <= lookback_ns else None)
    return out


def fetch_counter_increases(
    store: Any,
    name: str,
    *,
    start: datetime,
    end: datetime,
    step_ns: int,
    steps: int,
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS,
    service_name: str | None = None,
) -> list[float | None]:
    """Per step ``i < steps``: the reset-aware increase of counter ``name``
    (``otel_metrics_sum``) over ``(start + i·step_ns, start + (i+1)·step_ns]``, summed over
    series (``math.fsum``); ``None`` where no series has a sample in the step. Equals the sum
    of :meth:`~inferpath.analysis.signals.Series.counter_increase` per series.
    Raises ``ValueError`` for a non-positive ``step_ns`` or naive datetimes.
    """
    by_series = fetch_counter_series_increases(
        store,
        name,
        start=start,
        end=end,
        step_ns=step_ns,
        steps=steps,
        lookback_seconds=lookback_seconds,
        service_name=service_name,
    )
    per_step = [[v[i] for v in by_series.values() if v[i] is not None] for i in range(steps)]
    return [math.fsum(values) if values else None for values in per_step]  # type: ignore[arg-type]


def fetch_counter_series_increases(
    store: Any,
    name: str,
    *,
    start: datetime,
    end: datetime,
    step_ns: int,
    steps: int,
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS,
    service_name: str | None = None,
) -> dict[SeriesKey, list[float | None]]:
    """:func:`fetch_counter_increases` series by series: series key → per step, its
    increase (``None`` where it has no sample in the step)."""
    _check_step(step_ns, steps)
    # A counter sample at τ counts events before τ: step (t, t + step] holds it, so the
    # bucket is ⌈(τ − start) / step⌉ − 1, and everything at or before start is bucket −1.
    bucket = "if(time_ns <= {origin_ns:Int64}, -1, intDiv(time_ns - {origin_ns:Int64} - 1, {step_ns:Int64}))"
    ordered = "arrayMap(p -> p.2, arraySort(p -> p.1, groupArray((time_ns, Value))))"
    aggregates = (
        f"min(time_ns), max(time_ns), argMax(Value, time_ns), {ordered} AS values,"
        " arraySum(arrayMap((v, p) -> if(v >= p, v - p, v), arrayPopFront(values), arrayPopBack(values)))"
    )
    sql = _sample_sql("otel_metrics_sum", bucket, aggregates, service_name)
    rows = store.query(sql, _sample_parameters([name], start, end, step_ns, lookback_seconds, service_name))
    series: dict[tuple, list[tuple]] = {}
    for _, service, resource, attributes, index, _first_ns, last_ns, last, values, inside in rows:
        series.setdefault(_series_key(service, resource, attributes), []).append(
            (int(index), int(last_ns), float(last), float(values[0]), float(inside))
        )
    lookback_ns = int(lookback_seconds * 1e9)
    origin_ns = unix_ns_from_datetime(start)
    out: dict[SeriesKey, list[float | None]] = {}
    for key, buckets in series.items():
        increases: list[float | None] = out.setdefault(key, [None] * steps)
        previous: tuple[int, float] | None = None  # (time, value) of the latest earlier sample
        for index, last_ns, last, first, inside in buckets:
            if 0 <= index < steps:
                base_ns = origin_ns + index * step_ns
                total = inside
                if previous is not None and base_ns - previous[0] <= lookback_ns:
                    total += first - previous[1] if first >= previous[1] else first
                increases[index] = total
            previous = (last_ns, last)
    return out


# ----------------------------------------------------------------------------- window summaries
def fetch_window_signals(
    store: Any,
    start: datetime,
    end: datetime,
    *,
    step_seconds: float | None = None,
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS,
    service_name: str | None = None,
) -> WindowSignals:
    """Summarize every canonical signal over ``[start, end)``.

    Each gauge is sampled as of the end of every step of :func:`alignment_grid` (step
    ``step_seconds``, default :func:`window_step_seconds`), series combined per
    :data:`~inferpath.analysis.signals.COMBINE`, and the aligned values summarized. Preemptions: increase of
    ``preemptions_total`` summed over series. The alignment runs inside the store
    (:mod:`inferpath.analysis.timeline_query`; from the per-minute gauge rollup on a grid of
    whole minutes); the result equals :func:`fetch_window_signals_rows`, which does it over
    every sample in Python.
    """
    step = step_seconds or window_step_seconds(start, end)
    start_ns, end_ns = aware_unix_ns(start, "start"), aware_unix_ns(end, "end")
    origin_ns, step_ns, steps = alignment_grid(start, end, step)
    origin = _datetime_of_ns(origin_ns, start)
    options: dict[str, Any] = {"lookback_seconds": lookback_seconds, "service_name": service_name}
    columns = fetch_gauge_series_columns(
        store, SATURATION_GAUGES, start=origin, end=end, step_ns=step_ns, steps=steps, **options
    )
    result = WindowSignals.from_series_columns(columns)
    if end_ns > start_ns:
        by_series = fetch_counter_series_increases(
            store, PREEMPTIONS_TOTAL, start=start, end=end, step_ns=end_ns - start_ns, steps=1, **options
        )
        result.set_preemptions({key: steps[0] for key, steps in by_series.items()})
    return result


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _datetime_of_ns(unix_ns: int, exact: datetime) -> datetime:
    """``exact`` when it is that instant, else the UTC datetime of a whole-µs Unix-ns instant."""
    return exact if unix_ns_from_datetime(exact) == unix_ns else _EPOCH + timedelta(microseconds=unix_ns // 1000)


def fetch_signal_windows(
    store: Any,
    current: tuple[datetime, datetime],
    baseline: tuple[datetime, datetime],
    *,
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS,
    service_name: str | None = None,
) -> SignalWindows:
    """:func:`fetch_window_signals` of both windows (default steps), with one gauge query
    for both when their :func:`alignment_grid` points lie on one grid (always for windows
    over 10 h of the same length; for a baseline of the same length right before the window
    when the step divides it) and one counter query when the baseline ends where the window
    starts and is as long. The answer equals the two calls'.
    """
    grids = [alignment_grid(start, end, window_step_seconds(start, end)) for start, end in (current, baseline)]
    (c_origin, c_step, c_steps), (b_origin, b_step, b_steps) = grids
    first_origin = min(c_origin, b_origin)
    if c_step != b_step or (c_origin - b_origin) % c_step or not (c_steps and b_steps):
        return SignalWindows(
            current=fetch_window_signals(store, *current, lookback_seconds=lookback_seconds, service_name=service_name),
            baseline=fetch_window_signals(
                store, *baseline, lookback_seconds=lookback_seconds, service_name=service_name
            ),
        )
    options: dict[str, Any] = {"lookback_seconds": lookback_seconds, "service_name": service_name}
    offsets = [(origin - first_origin) // c_step for origin in (c_origin, b_origin)]
    steps = max(offset + count for offset, count in zip(offsets, (c_steps, b_steps)))
    earliest = current if c_origin <= b_origin else baseline
    # Each window's points are a run of the shared grid; reading the union's samples
    # changes no as-of value (see fetch_gauge_columns).
    columns = fetch_gauge_series_columns(
        store,
        SATURATION_GAUGES,
        start=_datetime_of_ns(first_origin, earliest[0]),
        end=max(current[1], baseline[1]),
        step_ns=c_step,
        steps=steps,
        **options,
    )
    out = [
        WindowSignals.from_series_columns(columns, offset, offset + count)
        for offset, count in zip(offsets, (c_steps, b_steps))
    ]
    length_ns = aware_unix_ns(current[1], "end") - aware_unix_ns(current[0], "start")
    if baseline[1] == current[0] and baseline[1] - baseline[0] == current[1] - current[0] and length_ns > 0:
        # Steps (baseline_start, baseline_end] and (window_start, window_end]: as two calls.
        by_series = fetch_counter_series_increases(
            store, PREEMPTIONS_TOTAL, start=baseline[0], end=current[1], step_ns=length_ns, steps=2, **options
        )
        out[1].set_preemptions({key: steps[0] for key, steps in by_series.items()})
        out[0].set_preemptions({key: steps[1] for key, steps in by_series.items()})
    else:
        for signals, (start, end) in zip(out, (current, baseline)):
            if end > start:
                by_series = fetch_counter_series_increases(
                    store,
                    PREEMPTIONS_TOTAL,
                    start=start,
                    end=end,
                    step_ns=aware_unix_ns(end, "end") - aware_unix_ns(start, "start"),
                    steps=1,
                    **options,
                )
                signals.set_preemptions({key: steps[0] for key, steps in by_series.items()})
    return SignalWindows(current=out[0], baseline=out[1])


class StoredSignalWindows:
    """The :class:`SignalWindows` of two windows of ``store``, read with
    :func:`fetch_signal_windows` on first use of :attr:`current` or :attr:`baseline` (a
    diagnosis that finds nothing degraded reads neither). ``current`` / ``baseline``:
    ``(start, end)`` timezone-aware datetimes; ``baseline`` ``None`` when the diagnosis has
    none (its signals are then empty)."""

    def __init__(
        self,
        store: Any,
        current: tuple[datetime, datetime],
        baseline: tuple[datetime, datetime] | None,
        *,
        service_name: str | None = None,
    ) -> None:
        self.store, self.service_name = store, service_name
        self._windows = (current, baseline)
        self._read: SignalWindows | None = None

    def _get(self) -> SignalWindows:
        if self._read is None:
            current, baseline = self._windows
            if baseline is None:
                self._read = SignalWindows(
                    current=fetch_window_signals(self.store, *current, service_name=self.service_name)
                )
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


__all__ = [
    "REQUEST_COLUMNS",
    "StoredSignalWindows",
    "fetch_counter_increases",
    "fetch_counter_series_increases",
    "fetch_gauge_columns",
    "fetch_gauge_series_columns",
    "fetch_request_columns",
    "fetch_signal_windows",
    "fetch_window_signals",
    "minute_grid",
]
