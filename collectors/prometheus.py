"""Prometheus text exposition -> canonical samples, through the signal catalog.

:func:`map_scrape` keeps only the lines whose metric name the catalog knows for the source
(one compiled regular expression, so the many process, HTTP and ``_created`` series of a
real scrape cost almost nothing), parses them with prometheus_client's own parser, converts
units and returns one :class:`Sample` per gauge/counter series and one
:class:`HistogramSample` per histogram series (buckets, count and sum: never quantiles).
Kinds come from the catalog, not from ``# TYPE`` lines, so the result does not depend on
line order. A malformed line of a known metric raises ``ValueError``; lines of metrics the
catalog does not know are not read at all.

Dropped values: NaN and infinities, and dcgm-exporter's "blank" sentinels, which DCGM
writes for a field that is not supported, not found or not permitted (``dcgm_structs.h``:
``DCGM_INT32_BLANK`` 0x7ffffff0, ``DCGM_INT64_BLANK`` 0x7ffffffffffffff0 — e.g.
9223372036854775794 = NOT_SUPPORTED — and ``DCGM_FP64_BLANK`` 140737488355328.0, each
followed by a few reserved codes).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cache, lru_cache
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

from inferpath.collectors.catalog import SourceMetric, derived_for, metrics_for, signal
from inferpath.collectors.identity import attributes_from_labels

logger = logging.getLogger(__name__)

_DCGM_INT32_BLANK = 0x7FFFFFF0
_DCGM_INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)  # as a float it is 2**63; anything from there is blank
_DCGM_FP64_BLANK = 140737488355328.0
_DCGM_RESERVED_CODES = 16
_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


# Plain slotted dataclasses, not frozen: a frozen one costs ~1.7 µs to build against ~0.3 µs,
# and the NVML poller builds ten per GPU every second. Treat them as immutable all the same.
@dataclass(slots=True)
class Sample:
    """One value of one canonical gauge or counter signal from one series of one scrape.

    ``value`` is in ``unit`` (the catalog's unit of ``signal``); ``kind`` is ``gauge`` or
    ``sum`` (a monotonic counter); ``attributes`` are the series' labels (renamed by
    :mod:`.identity`) plus any extra attributes; ``timestamp`` is the timezone-aware UTC
    time of the scrape; ``source_metric`` is the sample name it came from (``A+B`` for a
    derived signal).
    """

    signal: str
    value: float
    kind: Literal["gauge", "sum"]
    unit: str
    attributes: dict[str, str] = field(hash=False)
    timestamp: datetime
    source_metric: str


@dataclass(slots=True)
class HistogramSample:
    """One cumulative explicit-bucket histogram of one series of one scrape.

    ``bounds``: finite upper bounds, ascending, in ``unit`` (converted like values);
    ``cumulative_counts``: Prometheus ``_bucket`` counts, one per bound plus the ``+Inf``
    bucket last; ``count``/``sum``: ``_count`` and ``_sum`` (sum in ``unit``). Other fields
    as in :class:`Sample`; ``kind`` is always ``histogram``.
    """

    signal: str
    bounds: tuple[float, ...]
    cumulative_counts: tuple[float, ...]
    count: float
    sum: float
    unit: str
    attributes: dict[str, str] = field(hash=False)
    timestamp: datetime
    source_metric: str
    kind: Literal["histogram"] = "histogram"

    def bucket_counts(self) -> list[int]:
        """Per-bucket (non-cumulative) counts, ``len(bounds) + 1`` of them, as OTLP stores them."""
        counts, previous = [], 0.0
        for cumulative in self.cumulative_counts:
            counts.append(int(round(max(cumulative - previous, 0.0))))
            previous = max(previous, cumulative)
        return counts


@dataclass
class MappedScrape:
    """Per-series canonical samples of one scrape, before any combining."""

    samples: list[Sample]
    histograms: list[HistogramSample]


def is_dcgm_blank(value: float) -> bool:
    """True for DCGM's "no value" sentinels (see the module docstring)."""
    return (
        value >= _DCGM_INT64_BLANK
        or _DCGM_INT32_BLANK <= value < _DCGM_INT32_BLANK + _DCGM_RESERVED_CODES
        or _DCGM_FP64_BLANK <= value < _DCGM_FP64_BLANK + _DCGM_RESERVED_CODES
    )


def _usable(value: float, source: str) -> bool:
    if not math.isfinite(value):
        return False
    return not (source == "dcgm" and is_dcgm_blank(value))


@cache
def _wanted_lines_pattern(source: str) -> re.Pattern[str]:
    names = set(metrics_for(source))
    names |= {name for d in derived_for(source) for name in (*d.required, *d.optional)}
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    # A sample line: the name (a histogram's with its suffix), then labels or a blank.
    return re.compile(rf"^(?:{alternatives})(?:_bucket|_count|_sum)?[{{ \t].*$", re.MULTILINE)


_SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?[ \t]+(\S+)(?:[ \t]+-?\d+)?\s*$")


@lru_cache(maxsize=8192)
def _parse_labels(block: str) -> dict[str, str]:
    # Label blocks repeat verbatim across the lines and scrapes of one exporter (a GPU's
    # seven dcgm labels, an engine's model and engine labels), so each distinct block is
    # parsed once by prometheus_client and remembered. Callers copy before changing it.
    [family] = text_string_to_metric_families(f"x{block} 0\n")
    return family.samples[0].labels


def _parse(text: str, source: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each line of a metric the catalog knows for ``source``."""
    samples = []
    for line in _wanted_lines_pattern(source).findall(text):
        match = _SAMPLE_LINE.match(line)
        try:
            if match is None:
                raise ValueError("not a sample line")
            name, block, value = match.groups()
            samples.append((name, _parse_labels(block) if block else {}, float(value)))
        except Exception as exc:  # the label parser raises ValueError, but also others on odd input
            raise ValueError(_locate_error(text, line, exc)) from exc
    return samples


def _locate_error(text: str, bad_line: str, exc: Exception) -> str:
    number = next((n for n, line in enumerate(text.splitlines(), start=1) if line == bad_line.rstrip("\r")), 0)
    return f"invalid Prometheus text at line {number}: {bad_line[:200]!r}: {exc}"


def _row_for(rows: tuple[SourceMetric, ...], labels: Mapping[str, str]) -> SourceMetric | None:
    for row in rows:
        if all(labels.get(k) == v for k, v in row.labels):
            return row
    return None


def _check_timestamp(timestamp: datetime) -> datetime:
    if not isinstance(timestamp, datetime) or timestamp.tzinfo is None or timestamp.utcoffset() is None:
        raise ValueError("timestamp: must be a timezone-aware datetime")
    return timestamp.astimezone(timezone.utc)


def map_scrape(
    text: str,
    source: str,
    *,
    timestamp: datetime,
    scrape_host: str | None = None,
    extra_attributes: Mapping[str, str] | None = None,
) -> MappedScrape:
    """Parse a Prometheus text scrape of ``source`` into per-series canonical samples.

    ``source``: a catalog source (``dcgm``, ``vllm``, ``sglang``, ``tgi``, ``triton``,
    ``trtllm``); ``timestamp``: timezone-aware time of the scrape (stored as UTC);
    ``scrape_host``: the scraped machine, which replaces a ``localhost`` host label;
    ``extra_attributes`` are added to every sample (they win over labels of the same name).
    When a deprecated and a current name of one signal both appear, only the current one is
    kept. Raises ``ValueError`` for an unknown source, a naive timestamp, or text that does
    not parse (naming the first bad line when it can be found).
    """
    timestamp = _check_timestamp(timestamp)
    rows = metrics_for(source)
    derived = derived_for(source)
    derived_inputs = {name for d in derived for name in (*d.required, *d.optional)}

    samples: list[Sample] = []
    deprecated: set[int] = set()
    histogram_parts: dict[tuple, dict] = {}
    series_inputs: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
    for name, labels, value in _parse(text, source):
        candidates = rows.get(name)
        if candidates is None:
            base, suffix = _split_histogram_name(name)
            hrows = rows.get(base) if suffix else None
            if hrows is not None:
                _add_histogram_part(histogram_parts, hrows, suffix, labels, value)
                continue
            if name not in derived_inputs:
                continue
        if not _usable(value, source):
            logger.debug("dropped %s=%r from %s", name, value, source)
            continue
        if candidates is not None:
            row = _row_for(candidates, labels)
            spec = signal(row.signal) if row is not None else None
            if row is not None and spec is not None and spec.kind != "histogram":
                kept = {k: v for k, v in labels.items() if k not in dict(row.labels)}
                if row.deprecated:
                    deprecated.add(len(samples))
                samples.append(
                    Sample(
                        row.signal,
                        row.convert(value),
                        spec.kind,
                        spec.unit,
                        attributes_from_labels(kept, scrape_host=scrape_host, extra=extra_attributes),
                        timestamp,
                        name,
                    )
                )
        if name in derived_inputs:
            key = tuple(sorted(attributes_from_labels(labels, scrape_host=scrape_host, extra=extra_attributes).items()))
            series_inputs.setdefault(key, {})[name] = value

    for d in derived:
        spec = signal(d.signal)
        if spec.kind == "histogram":  # derived signals are gauges or sums (the catalog's own check)
            continue
        for key, values in series_inputs.items():
            if not all(name in values for name in d.required):
                continue
            used = [name for name in (*d.required, *d.optional) if name in values]
            samples.append(
                Sample(
                    d.signal,
                    d.convert(sum(values[n] for n in used)),
                    spec.kind,
                    spec.unit,
                    dict(key),
                    timestamp,
                    "+".join(used),
                )
            )
    samples = _prefer_current_names(samples, deprecated)
    histograms = _build_histograms(histogram_parts, timestamp, scrape_host, extra_attributes)
    return MappedScrape(samples, histograms)


def scrape_samples(
    text: str,
    source: str,
    *,
    timestamp: datetime,
    extra_attributes: Mapping[str, str] | None = None,
    scrape_host: str | None = None,
) -> list[Sample]:
    """The gauge and counter samples of :func:`map_scrape`, one per series (no combining)."""
    return map_scrape(
        text, source, timestamp=timestamp, scrape_host=scrape_host, extra_attributes=extra_attributes
    ).samples


def _split_histogram_name(name: str) -> tuple[str, str]:
    for suffix in _HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return name, ""


def _add_histogram_part(
    parts: dict, rows: tuple[SourceMetric, ...], suffix: str, labels: Mapping[str, str], value: float
) -> None:
    row = _row_for(rows, labels)
    if row is None or signal(row.signal).kind != "histogram":
        return
    series_labels = tuple(sorted((k, v) for k, v in labels.items() if k != "le" and k not in dict(row.labels)))
    part = parts.setdefault((row, series_labels), {"buckets": {}, "count": None, "sum": None})
    if suffix == "_bucket":
        try:
            part["buckets"][float(labels.get("le", "nan"))] = value
        except ValueError:
            raise ValueError(f"{row.metric}_bucket: invalid le label {labels.get('le')!r}") from None
    else:
        part[suffix[1:]] = value


def _build_histograms(
    parts: dict, timestamp: datetime, scrape_host: str | None, extra: Mapping[str, str] | None
) -> list[HistogramSample]:
    histograms = []
    for (row, series_labels), part in sorted(parts.items(), key=lambda item: (item[0][0].metric, item[0][1])):
        buckets = part["buckets"]
        if math.inf not in buckets or any(math.isnan(b) for b in buckets):
            logger.debug("histogram %s%s has no +Inf bucket; skipped", row.metric, series_labels)
            continue
        ordered = sorted(buckets.items())
        spec = signal(row.signal)
        count = part["count"] if part["count"] is not None else buckets[math.inf]
        total = part["sum"] if part["sum"] is not None else 0.0
        histograms.append(
            HistogramSample(
                row.signal,
                tuple(row.convert(b) for b, _ in ordered[:-1]),
                tuple(c for _, c in ordered),
                count,
                row.convert(total),
                spec.unit,
                attributes_from_labels(dict(series_labels), scrape_host=scrape_host, extra=extra),
                timestamp,
                row.metric,
            )
        )
    return histograms


def _prefer_current_names(samples: list[Sample], deprecated: set[int]) -> list[Sample]:
    # During vLLM's renames both names are exported (and the new one gained an engine
    # label); a deprecated name counts only for a signal that has no current-name sample.
    current = {s.signal for i, s in enumerate(samples) if i not in deprecated}
    return [s for i, s in enumerate(samples) if i not in deprecated or s.signal not in current]


def signals_of(samples: Iterable[Sample | HistogramSample]) -> dict[str, list]:
    """Group samples by signal name (a convenience for callers and tests)."""
    grouped: dict[str, list] = {}
    for sample in samples:
        grouped.setdefault(sample.signal, []).append(sample)
    return grouped
