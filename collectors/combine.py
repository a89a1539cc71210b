"""Combine the series of one scrape into what one pod (or one GPU) reports.

A pod may run several engines (vLLM data parallel: ``engine="0"``, ``engine="1"``) or
several API-server processes whose prometheus_client multiprocess mode repeats a gauge
under one ``pid`` label per process. The rules, per signal (``Signal.combine``):

1. ``pid`` copies first: series that differ only by ``pid`` are views of one engine; their
   maximum is kept (the processes that never received the engine's stats report 0) and the
   signal is flagged in ``duplicated_by_pid``. Histograms are not de-duplicated: each
   process observed its own requests, so they add up below.
2. ``sum`` (queue depth, running requests, preemptions, batch size): with several engines,
   one series per pod, the sum over the engine labels (``engine``, ``dp_rank``), which are
   dropped, marked ``inferpath.combined="sum"``; a single engine's series is kept as it is.
3. ``max`` (KV-cache usage): the per-engine series are kept, and when there are several
   engines a pod series (engine labels dropped, ``inferpath.combined="max"``) holds the
   fullest engine's value.
4. histograms: bucket-wise sum over engine and ``pid`` labels (as PromQL's
   ``sum by (le)``); series with different bounds are not merged.
5. ``device``: one series per GPU, untouched.

Every step groups by sorted attribute items, so the result does not depend on line order.
:func:`fill_utilization` adds ``gpu_utilization_ratio`` from DCGM's graphics-engine-active
for GPUs (typically MIG instances) that have no utilization reading of their own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from inferpath.collectors.catalog import ENGINE_LABELS, PID_LABEL, signal
from inferpath.collectors.identity import device_key
from inferpath.collectors.prometheus import HistogramSample, Sample
from inferpath.vocabulary import GPU_GRAPHICS_ENGINE_ACTIVE_RATIO, GPU_UTILIZATION_RATIO

COMBINED_ATTRIBUTE = "inferpath.combined"
DERIVED_FROM_ATTRIBUTE = "inferpath.derived_from"


@dataclass
class Combined:
    """Samples and histograms after combining, and the signals that were repeated per ``pid``."""

    samples: list[Sample]
    histograms: list[HistogramSample]
    duplicated_by_pid: set[str] = field(default_factory=set)


def _key(attributes: dict[str, str], drop: frozenset[str] | set[str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in attributes.items() if k not in drop))


def _join_metric(samples: Sequence[Sample]) -> str:
    return "+".join(sorted({s.source_metric for s in samples}))


def combine(samples: Iterable[Sample], histograms: Iterable[HistogramSample] = ()) -> Combined:
    """Apply the module's rules to the samples and histograms of ONE scrape (one pod).

    Returns a :class:`Combined` whose lists are sorted by signal and attributes.
    """
    duplicated: set[str] = set()
    by_rule: dict[str, list[Sample]] = {"sum": [], "max": [], "device": []}
    # 1. pid copies -> max.
    groups: dict[tuple, list[Sample]] = {}
    for sample in samples:
        groups.setdefault((sample.signal, _key(sample.attributes, {PID_LABEL})), []).append(sample)
    for (name, key), members in groups.items():
        if len(members) > 1 or any(PID_LABEL in m.attributes for m in members):
            if len(members) > 1:
                duplicated.add(name)
            best = max(members, key=lambda s: s.value)
            members = [replace(best, attributes=dict(key))]
        by_rule[signal(name).combine].extend(members)

    out: list[Sample] = list(by_rule["device"])
    # 2. sum over engines.
    sums: dict[tuple, list[Sample]] = {}
    for sample in by_rule["sum"]:
        sums.setdefault((sample.signal, _key(sample.attributes, ENGINE_LABELS)), []).append(sample)
    for (name, key), members in sums.items():
        if len(members) == 1:  # one engine: its series is the pod's, labels unchanged
            out.append(members[0])
            continue
        first = members[0]
        attributes = dict(key)
        attributes[COMBINED_ATTRIBUTE] = "sum"
        out.append(
            Sample(
                name,
                math.fsum(m.value for m in members),
                first.kind,
                first.unit,
                attributes,
                first.timestamp,
                _join_metric(members),
            )
        )
    # 3. per engine + pod max.
    maxes: dict[tuple, list[Sample]] = {}
    for sample in by_rule["max"]:
        out.append(sample)
        maxes.setdefault((sample.signal, _key(sample.attributes, ENGINE_LABELS)), []).append(sample)
    for (name, key), members in maxes.items():
        if len(members) > 1:
            best = max(members, key=lambda s: s.value)
            attributes = dict(key)
            attributes[COMBINED_ATTRIBUTE] = "max"
            out.append(
                Sample(name, best.value, best.kind, best.unit, attributes, best.timestamp, _join_metric(members))
            )
    out.sort(key=lambda s: (s.signal, _key(s.attributes, set())))
    return Combined(out, merge_histograms(histograms), duplicated)


def merge_histograms(histograms: Iterable[HistogramSample]) -> list[HistogramSample]:
    """Bucket-wise sum of histograms that differ only by engine or ``pid`` labels.

    Histograms with different bounds stay separate (summing them would misplace counts).
    """
    drop = ENGINE_LABELS | {PID_LABEL}
    groups: dict[tuple, list[HistogramSample]] = {}
    for histogram in histograms:
        key = (histogram.signal, _key(histogram.attributes, drop), histogram.bounds)
        groups.setdefault(key, []).append(histogram)
    merged = []
    for (name, key, bounds), members in sorted(groups.items(), key=lambda item: item[0]):
        if len(members) == 1 and not (drop & members[0].attributes.keys()):
            merged.append(members[0])
            continue
        first = members[0]
        counts = tuple(math.fsum(col) for col in zip(*(m.cumulative_counts for m in members)))
        merged.append(
            HistogramSample(
                name,
                bounds,
                counts,
                math.fsum(m.count for m in members),
                math.fsum(m.sum for m in members),
                first.unit,
                dict(key),
                first.timestamp,
                "+".join(sorted({m.source_metric for m in members})),
            )
        )
    return merged


def fill_utilization(samples: Sequence[Sample]) -> list[Sample]:
    """Add ``gpu_utilization_ratio`` from ``gpu_graphics_engine_active_ratio`` for each GPU
    (host, UUID, MIG instance) that has the latter but not the former.

    NVML and dcgm-exporter report no utilization for MIG instances; DCGM's
    ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` is the closest measure (the fraction of time the
    graphics/compute engine was busy). The added sample says so in
    ``inferpath.derived_from``. Returns a new list; the input is not changed.
    """
    have = {device_key(s.attributes) for s in samples if s.signal == GPU_UTILIZATION_RATIO}
    added = []
    for sample in samples:
        if sample.signal == GPU_GRAPHICS_ENGINE_ACTIVE_RATIO and device_key(sample.attributes) not in have:
            attributes = dict(sample.attributes)
            attributes[DERIVED_FROM_ATTRIBUTE] = GPU_GRAPHICS_ENGINE_ACTIVE_RATIO
            added.append(replace(sample, signal=GPU_UTILIZATION_RATIO, attributes=attributes))
            have.add(device_key(sample.attributes))
    return [*samples, *added]
