"""Prometheus text exposition -> canonical :class:`Sample` rows, through the signal catalog.

``scrape_samples`` parses one scrape with prometheus_client's own parser, keeps the samples
that the catalog (:mod:`.catalog`) knows for the given source, converts their units and
returns one :class:`Sample` per series. Everything else in the scrape (histograms, process
metrics, ``_created`` series) is skipped.

Dropped values: NaN and infinities, and dcgm-exporter's "blank" sentinels, which DCGM
writes for a field that is not supported, not found or not permitted (``dcgm_structs.h``:
``DCGM_INT32_BLANK`` 0x7ffffff0, ``DCGM_INT64_BLANK`` 0x7ffffffffffffff0 — e.g.
9223372036854775794 = NOT_SUPPORTED — and ``DCGM_FP64_BLANK`` 140737488355328.0, each
followed by a few reserved codes).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Literal, Mapping

from prometheus_client.parser import text_string_to_metric_families

from inferpath.collectors.catalog import derived_for, metrics_for, signal

logger = logging.getLogger(__name__)

# Labels renamed on the way in, so that one attribute names the host whatever the exporter.
_RENAMED_LABELS = {"Hostname": "host", "hostname": "host"}

_DCGM_INT32_BLANK = 0x7FFFFFF0
_DCGM_INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)  # as a float it is 2**63; anything from there is blank
_DCGM_FP64_BLANK = 140737488355328.0
_DCGM_RESERVED_CODES = 16


@dataclass(frozen=True)
class Sample:
    """One value of one canonical signal from one series of one scrape.

    ``value`` is in ``unit`` (the catalog's unit of ``signal``); ``kind`` is ``gauge`` or
    ``sum`` (a monotonic counter); ``attributes`` are the series' labels (``Hostname`` or
    ``hostname`` renamed ``host``) plus any extra attributes; ``timestamp`` is the
    timezone-aware UTC time of the scrape; ``source_metric`` is the sample name it came from
    (``A+B`` for a derived signal).
    """

    signal: str
    value: float
    kind: Literal["gauge", "sum"]
    unit: str
    attributes: dict[str, str] = field(hash=False)
    timestamp: datetime
    source_metric: str


def is_dcgm_blank(value: float) -> bool:
    """True for DCGM's "no value" sentinels (see the module docstring)."""
    return (value >= _DCGM_INT64_BLANK
            or _DCGM_INT32_BLANK <= value < _DCGM_INT32_BLANK + _DCGM_RESERVED_CODES
            or _DCGM_FP64_BLANK <= value < _DCGM_FP64_BLANK + _DCGM_RESERVED_CODES)


def _usable(value: float, source: str) -> bool:
    if not math.isfinite(value):
        return False
    return not (source == "dcgm" and is_dcgm_blank(value))


def _parse(text: str) -> list:
    try:
        return list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError, but also others on odd input
        raise ValueError(_locate_error(text, exc)) from exc


def _locate_error(text: str, exc: Exception) -> str:
    # The parser does not say where it failed; re-parse line by line (error path only).
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
        except Exception as line_exc:
            return f"invalid Prometheus text at line {number}: {line[:200]!r}: {line_exc}"
    return f"invalid Prometheus text: {exc}"


def _attributes(labels: Mapping[str, str], extra: Mapping[str, str] | None) -> dict[str, str]:
    attributes = {_RENAMED_LABELS.get(k, k): v for k, v in labels.items()}
    if extra:
        attributes.update(extra)
    return attributes


def scrape_samples(text: str, source: str, *, timestamp: datetime,
                   extra_attributes: Mapping[str, str] | None = None) -> list[Sample]:
    """Parse a Prometheus text scrape of ``source`` into canonical samples.

    ``source``: a catalog source (``dcgm``, ``vllm``, ``sglang``, ``tgi``, ``triton``);
    ``timestamp``: timezone-aware time of the scrape (stored as UTC); ``extra_attributes``
    are added to every sample (they win over labels of the same name).
    Raises ``ValueError`` for an unknown source, a naive timestamp, or text that does not
    parse (naming the first bad line when it can be found).
    """
    if timestamp.tzinfo is None or timestamp.utcoffset() is None:
        raise ValueError("timestamp: must be timezone-aware")
    timestamp = timestamp.astimezone(timezone.utc)
    rows = metrics_for(source)
    derived = derived_for(source)
    derived_inputs = {name for d in derived for name in (*d.required, *d.optional)}

    samples: list[Sample] = []
    series_inputs: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
    for family in _parse(text):
        for raw in family.samples:
            row = rows.get(raw.name)
            if row is None and raw.name not in derived_inputs:
                continue
            value = float(raw.value)
            if not _usable(value, source):
                logger.debug("dropped %s=%r from %s", raw.name, raw.value, source)
                continue
            attributes = _attributes(raw.labels, extra_attributes)
            if row is not None:
                spec = signal(row.signal)
                samples.append(Sample(row.signal, row.convert(value), spec.kind, spec.unit, attributes,
                                      timestamp, raw.name))
            if raw.name in derived_inputs:
                series_inputs.setdefault(tuple(sorted(attributes.items())), {})[raw.name] = value

    for d in derived:
        spec = signal(d.signal)
        for key, values in series_inputs.items():
            if not all(name in values for name in d.required):
                continue
            used = [name for name in (*d.required, *d.optional) if name in values]
            samples.append(Sample(d.signal, d.convert(sum(values[n] for n in used)), spec.kind, spec.unit,
                                  dict(key), timestamp, "+".join(used)))
    return _prefer_current_names(samples, rows)


def _prefer_current_names(samples: list[Sample], rows: Mapping) -> list[Sample]:
    # During vLLM's renames both names are exported; keep the current one for a series.
    current = {(s.signal, tuple(sorted(s.attributes.items())))
               for s in samples if not getattr(rows.get(s.source_metric), "deprecated", False)}
    return [s for s in samples
            if not getattr(rows.get(s.source_metric), "deprecated", False)
            or (s.signal, tuple(sorted(s.attributes.items()))) not in current]


def signals_of(samples: Iterable[Sample]) -> dict[str, list[Sample]]:
    """Group samples by signal name (a convenience for callers and tests)."""
    grouped: dict[str, list[Sample]] = {}
    for sample in samples:
        grouped.setdefault(sample.signal, []).append(sample)
    return grouped
