"""One scrape, start to finish: map through the catalog, combine, fill, report what is missing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from inferpath.collectors.catalog import expected_signals
from inferpath.collectors.combine import combine, fill_utilization
from inferpath.collectors.prometheus import HistogramSample, Sample, map_scrape


@dataclass
class ScrapeResult:
    """What one scrape of one target (one pod or one GPU node) reports.

    ``samples``: combined gauge/counter samples; ``histograms``: combined histograms;
    ``missing``: expected signals (``catalog.expected_signals``) with no value in this
    scrape: nothing is stored for them, not 0; ``duplicated_by_pid``: signals whose series
    were repeated per process and de-duplicated (see :mod:`.combine`).
    """

    samples: list[Sample]
    histograms: list[HistogramSample]
    missing: tuple[str, ...] = ()
    duplicated_by_pid: frozenset[str] = field(default_factory=frozenset)

    def all(self) -> list[Sample | HistogramSample]:
        """Samples then histograms, as one list."""
        return [*self.samples, *self.histograms]


def parse_scrape(
    text: str,
    source: str,
    *,
    timestamp: datetime,
    scrape_host: str | None = None,
    extra_attributes: Mapping[str, str] | None = None,
) -> ScrapeResult:
    """Prometheus text of ``source`` -> :class:`ScrapeResult`.

    Arguments as :func:`inferpath.collectors.prometheus.map_scrape`, whose ``ValueError``
    (unknown source, naive timestamp, malformed text) it raises.
    """
    mapped = map_scrape(text, source, timestamp=timestamp, scrape_host=scrape_host, extra_attributes=extra_attributes)
    combined = combine(mapped.samples, mapped.histograms)
    samples = fill_utilization(combined.samples) if source == "dcgm" else combined.samples
    present = {s.signal for s in samples}
    missing = tuple(name for name in expected_signals(source) if name not in present)
    return ScrapeResult(samples, combined.histograms, missing, frozenset(combined.duplicated_by_pid))
