"""Latency and engine/GPU state on one time axis, and the windows where latency spiked.

A :class:`Timeline` has one row per step: TTFT p99 and mean (exact, from the requests that
*started* in the step) next to the engine and GPU signals as of the end of that step (the
latest sample before the next step starts: an as-of join at sample resolution, see
:mod:`inferpath.analysis.signals`). Percentiles are computed per step from raw request
values, never averaged across steps.

Spike detection compares each step's TTFT p99 with the median of the steps before it: a
median ignores the spikes it is looking for, where a mean would be dragged up by them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from statistics import median
from typing import Any

from inferpath.analysis.breakdown import fetch_request_rows
from inferpath.analysis.percentiles import quantile
from inferpath.analysis.signals import (
    COMBINE,
    DEFAULT_LOOKBACK_SECONDS,
    Series,
    SeriesKey,
    combined_asof,
    fetch_series,
)
from inferpath.analysis.timeline_query import (
    REQUEST_COLUMNS,
    fetch_counter_increases,
    fetch_gauge_columns,
    fetch_request_columns,
)
from inferpath.storage.rows import unix_ns_from_datetime
from inferpath.vocabulary import PREEMPTIONS_TOTAL, SATURATION_GAUGES, client_first_ns

PREEMPTION_RATE = "preemptions_per_second"

SPIKE_FACTOR = 3.0
"""A step is a spike when TTFT p99 > 3 × the baseline median: step-to-step p99 noise of a
healthy engine stays well under 2×, and a 3× jump is what users notice as a stall."""
SPIKE_BASELINE_STEPS = 30
"""Steps of history in the rolling baseline (30 × the step, e.g. 5 minutes at 10 s)."""
SPIKE_MIN_BASELINE_STEPS = 5
"""Fewer steps of history than this give no baseline, so no spike is called."""


@dataclass
class Timeline:
    """Aligned per-step columns.

    ``step_start_ns``: Unix ns of each step's start; ``step_seconds``: step length;
    ``columns``: name -> one value per step (``None`` where nothing was measured).
    Request columns: :data:`REQUEST_COLUMNS`; signal columns: the canonical gauge names
    and :data:`PREEMPTION_RATE`.
    """

    step_start_ns: list[int]
    step_seconds: float
    columns: dict[str, list[float | None]] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """The timeline as one dict per step (``step_start_ns`` plus every column)."""
        return [
            {"step_start_ns": t, **{name: values[i] for name, values in self.columns.items()}}
            for i, t in enumerate(self.step_start_ns)
        ]


def request_columns(
    rows: Iterable[Mapping[str, Any]], step_start_ns: Sequence[int], step_ns: int
) -> dict[str, list[float | None]]:
    """Per-step request measures (:data:`REQUEST_COLUMNS`, seconds) of ``rows``.

    A row belongs to the step holding its ``timestamp`` (aware datetime or Unix ns). TTFT and
    E2E are the client's where the row has them, else the server's
    (:func:`~inferpath.vocabulary.client_first_ns`), as every view shows them.
    """
    buckets: list[list[Mapping[str, Any]]] = [[] for _ in step_start_ns]
    first = step_start_ns[0] if step_start_ns else 0
    for row in rows:
        ts = row["timestamp"]
        ts_ns = unix_ns_from_datetime(ts) if isinstance(ts, datetime) else int(ts)
        index = (ts_ns - first) // step_ns
        if 0 <= index < len(buckets):
            buckets[index].append(row)
    columns: dict[str, list[float | None]] = {name: [] for name in REQUEST_COLUMNS}
    for members in buckets:
        # TTFT and E2E as the end user saw them: the client's, else the server's.
        ttft = [v / 1e9 for r in members if (v := client_first_ns(r, "ttft")) is not None]
        itl = [r["itl_ns"] / 1e9 for r in members if r.get("itl_ns") is not None]
        e2e = [v / 1e9 for r in members if (v := client_first_ns(r, "e2e")) is not None]
        columns["requests"].append(float(len(members)))
        columns["ttft_p99_seconds"].append(quantile(ttft, 0.99) if ttft else None)
        columns["ttft_avg_seconds"].append(math.fsum(ttft) / len(ttft) if ttft else None)
        columns["itl_p99_seconds"].append(quantile(itl, 0.99) if itl else None)
        columns["e2e_p99_seconds"].append(quantile(e2e, 0.99) if e2e else None)
    return columns


def build_timeline(
    rows: Iterable[Mapping[str, Any]],
    gauges: Mapping[str, Mapping[SeriesKey, Series]],
    preemptions: Mapping[SeriesKey, Series],
    *,
    start_ns: int,
    end_ns: int,
    step_seconds: float,
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS,
) -> Timeline:
    """Join request measures and signals on steps of ``step_seconds`` over ``[start_ns, end_ns)``.

    Each gauge is taken as of the step's end (its latest sample before the next step
    starts) and combined across series per
    :data:`inferpath.analysis.signals.COMBINE`; the preemption rate is the counter's
    reset-aware increase in the step divided by the step length (per second).
    Raises ``ValueError`` for a non-positive step or an empty range.
    """
    if step_seconds <= 0:
        raise ValueError(f"step_seconds must be > 0, got {step_seconds!r}")
    if end_ns <= start_ns:
        raise ValueError("end must be after start")
    step_ns, lookback_ns = int(step_seconds * 1e9), int(lookback_seconds * 1e9)
    starts = list(range(start_ns, end_ns, step_ns))
    timeline = Timeline(step_start_ns=starts, step_seconds=step_seconds, columns=request_columns(rows, starts, step_ns))
    for name, series in gauges.items():
        combine = COMBINE.get(name, max)
        timeline.columns[name] = [combined_asof(series, t + step_ns - 1, combine, lookback_ns) for t in starts]
    rates: list[float | None] = []
    # Unlike a gauge, a counter sample at the step's end counts events that happened before
    # that instant, i.e. inside the step, so the counter window is (start, end].
    for t in starts:
        increases = [
            c for c in (s.counter_increase(t, t + step_ns, lookback_ns) for s in preemptions.values()) if c is not None
        ]
        rates.append(math.fsum(increases) / step_seconds if increases else None)
    timeline.columns[PREEMPTION_RATE] = rates
    return timeline


def fetch_timeline(
    store: Any,
    *,
    start: datetime,
    end: datetime,
    step_seconds: float = 10.0,
    endpoint: str | None = None,
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS,
    endpoint_class: str | None = None,
    columns: dict[str, str] | None = None,
) -> Timeline:
    """:func:`build_timeline` over the ``ok`` requests (of ``endpoint`` / ``endpoint_class``
    when given; ``columns``: service / model / replica filters on the rows; the engine and GPU
    signals stay every engine's) and the
    signals stored for ``[start, end)``, aggregated inside the store
    (:mod:`inferpath.analysis.timeline_query`): the same columns without reading every row
    and sample. Raises ``ValueError`` as :func:`build_timeline` does."""
    start_ns, end_ns = unix_ns_from_datetime(start), unix_ns_from_datetime(end)
    if step_seconds <= 0:
        raise ValueError(f"step_seconds must be > 0, got {step_seconds!r}")
    if end_ns <= start_ns:
        raise ValueError("end must be after start")
    step_ns = int(step_seconds * 1e9)
    starts = list(range(start_ns, end_ns, step_ns))
    window: dict[str, Any] = {"start": start, "end": end, "step_ns": step_ns, "steps": len(starts)}
    timeline = Timeline(
        step_start_ns=starts,
        step_seconds=step_seconds,
        columns=fetch_request_columns(
            store, endpoint=endpoint, endpoint_class=endpoint_class, columns=columns, **window
        ),
    )
    timeline.columns.update(fetch_gauge_columns(store, SATURATION_GAUGES, lookback_seconds=lookback_seconds, **window))
    increases = fetch_counter_increases(store, PREEMPTIONS_TOTAL, lookback_seconds=lookback_seconds, **window)
    timeline.columns[PREEMPTION_RATE] = [None if v is None else v / step_seconds for v in increases]
    return timeline


def fetch_timeline_rows(
    store: Any,
    *,
    start: datetime,
    end: datetime,
    step_seconds: float = 10.0,
    endpoint: str | None = None,
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS,
) -> Timeline:
    """:func:`build_timeline` over request rows and samples read into Python: the reference
    definition :func:`fetch_timeline` must match (slow over wide windows: every row moves)."""
    rows = fetch_request_rows(store, start=start, end=end, endpoint=endpoint)
    gauges = {
        name: fetch_series(store, name, start, end, lookback_seconds=lookback_seconds) for name in SATURATION_GAUGES
    }
    counters = fetch_series(
        store, PREEMPTIONS_TOTAL, start, end, table="otel_metrics_sum", lookback_seconds=lookback_seconds
    )
    return build_timeline(
        rows,
        gauges,
        counters,
        start_ns=unix_ns_from_datetime(start),
        end_ns=unix_ns_from_datetime(end),
        step_seconds=step_seconds,
        lookback_seconds=lookback_seconds,
    )


def pearson(xs: Sequence[float | None], ys: Sequence[float | None]) -> float | None:
    """Pearson correlation over the steps where both are measured; ``None`` for fewer than
    3 such steps or a constant column (correlation undefined)."""
    pairs = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    if len(pairs) < 3:
        return None
    mean_x = math.fsum(x for x, _ in pairs) / len(pairs)
    mean_y = math.fsum(y for _, y in pairs) / len(pairs)
    sxy = math.fsum((x - mean_x) * (y - mean_y) for x, y in pairs)
    sxx = math.fsum((x - mean_x) ** 2 for x, _ in pairs)
    syy = math.fsum((y - mean_y) ** 2 for _, y in pairs)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation: :func:`pearson` of the ranks (ties share their mean rank);
    ``None`` where that is undefined. Insensitive to the scale of either column: a wait that
    grows with a backlog in any monotone way reads near 1."""
    return pearson(_ranks(xs), _ranks(ys))


def _ranks(values: Sequence[float]) -> list[float | None]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks: list[float | None] = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


@dataclass(frozen=True)
class SpikeWindow:
    """Consecutive spiking steps: ``[start_ns, end_ns)``, the ``peak`` value in it, the
    ``baseline`` median before it and ``ratio`` = peak / baseline."""

    start_ns: int
    end_ns: int
    peak: float
    baseline: float
    ratio: float


def detect_spikes(
    step_start_ns: Sequence[int],
    values: Sequence[float | None],
    step_seconds: float,
    *,
    factor: float = SPIKE_FACTOR,
    baseline_steps: int = SPIKE_BASELINE_STEPS,
    min_baseline_steps: int = SPIKE_MIN_BASELINE_STEPS,
) -> list[SpikeWindow]:
    """Windows where ``values`` (e.g. TTFT p99 per step) exceed ``factor`` × the rolling median
    of the up to ``baseline_steps`` measured, non-spiking steps before them.

    Spiking steps are kept out of the baseline, so a long stall does not become its own
    normal. Adjacent spiking steps merge into one window. Raises ``ValueError`` when the
    lengths differ or ``factor`` ≤ 1.
    """
    if len(step_start_ns) != len(values):
        raise ValueError("step_start_ns and values must have the same length")
    if factor <= 1:
        raise ValueError(f"factor must be > 1, got {factor!r}")
    step_ns = int(step_seconds * 1e9)
    history: list[float] = []
    windows: list[SpikeWindow] = []
    current: dict[str, Any] | None = None
    for t, value in zip(step_start_ns, values):
        if value is None:
            continue
        recent = history[-baseline_steps:]
        baseline = median(recent) if len(recent) >= min_baseline_steps else None
        if baseline is not None and baseline > 0 and value > factor * baseline:
            if current is not None and current["end_ns"] == t:
                current["end_ns"] = t + step_ns
                current["peak"] = max(current["peak"], value)
            else:
                if current is not None:
                    windows.append(_close(current))
                current = {"start_ns": t, "end_ns": t + step_ns, "peak": value, "baseline": baseline}
            continue
        if current is not None:
            windows.append(_close(current))
            current = None
        history.append(value)
    if current is not None:
        windows.append(_close(current))
    return windows


def _close(window: dict[str, Any]) -> SpikeWindow:
    return SpikeWindow(
        start_ns=window["start_ns"],
        end_ns=window["end_ns"],
        peak=window["peak"],
        baseline=window["baseline"],
        ratio=window["peak"] / window["baseline"],
    )


__all__ = [
    "PREEMPTION_RATE",
    "REQUEST_COLUMNS",
    "SPIKE_BASELINE_STEPS",
    "SPIKE_FACTOR",
    "SPIKE_MIN_BASELINE_STEPS",
    "SpikeWindow",
    "Timeline",
    "build_timeline",
    "detect_spikes",
    "fetch_timeline",
    "fetch_timeline_rows",
    "pearson",
    "request_columns",
    "spearman",
]
