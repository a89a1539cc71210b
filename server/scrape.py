"""Background scraping of Prometheus-text endpoints (engines, dcgm-exporter) into metric rows.

Each tick scrapes every ``settings.scrape_targets`` entry with the collectors' ``Scraper``,
which already maps source metric names and units to canonical signals. Each sample becomes
one row: ``kind="gauge"`` → ``otel_metrics_gauge``, ``kind="sum"`` → ``otel_metrics_sum``
(cumulative, monotonic), ``kind="histogram"`` → ``otel_metrics_histogram`` (cumulative
explicit buckets: OTLP per-bucket counts and the finite bounds), with ``MetricName`` = the canonical signal, ``ServiceName`` = the
source (``vllm``, ``dcgm``, …) and the sample's attributes plus
``inferpath.source_metric`` (the metric name the source used).

A failing target is logged (rate-limited) and counted per target; it never stops the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from inferpath.config import ScrapeTarget
from inferpath.ratelimited_log import RateLimitedLog
from inferpath.storage.periodic import PeriodicPasses
from inferpath.storage.rows import GaugeRow, HistogramRow, SumRow
from inferpath.storage.writer import BatchWriter
from inferpath.vocabulary import SOURCE_METRIC_ATTRIBUTE

__all__ = ["ScrapeLoop", "samples_to_rows"]

logger = logging.getLogger(__name__)

_OTLP_CUMULATIVE = 2


def samples_to_rows(samples: Iterable[Any], source: str) -> tuple[list[GaugeRow], list[SumRow], list[HistogramRow]]:
    """Convert collector samples to gauge, sum and histogram rows.

    Gauge/counter samples carry ``signal``, ``value``, ``kind``, ``unit``, ``attributes``,
    aware ``timestamp`` and ``source_metric``; histogram samples (``kind="histogram"``)
    carry ``bounds``, ``bucket_counts()``, ``count`` and ``sum`` instead of ``value``.
    Samples of any other kind are skipped.
    """
    gauges: list[GaugeRow] = []
    sums: list[SumRow] = []
    histograms: list[HistogramRow] = []
    resource = {"service.name": source}
    for sample in samples:
        attributes = {str(k): str(v) for k, v in dict(sample.attributes).items()}
        attributes[SOURCE_METRIC_ATTRIBUTE] = str(sample.source_metric)
        common = dict(
            resource_attributes=dict(resource),
            service_name=source,
            metric_name=str(sample.signal),
            description="",
            unit=str(sample.unit or ""),
            attributes=attributes,
            start_time=None,
            time=sample.timestamp,
            scope_name="inferpath.collectors",
        )
        if sample.kind == "gauge":
            gauges.append(GaugeRow(**common, value=float(sample.value)))
        elif sample.kind == "sum":
            sums.append(
                SumRow(**common, value=float(sample.value), aggregation_temporality=_OTLP_CUMULATIVE, is_monotonic=True)
            )
        elif sample.kind == "histogram":
            histograms.append(
                HistogramRow(
                    **common,
                    count=int(round(sample.count)),
                    sum=float(sample.sum),
                    bucket_counts=list(sample.bucket_counts()),
                    explicit_bounds=[float(b) for b in sample.bounds],
                    aggregation_temporality=_OTLP_CUMULATIVE,
                )
            )
    return gauges, sums, histograms


def _default_scraper_factory(target: ScrapeTarget) -> Any:
    from inferpath.collectors.scraper import Scraper  # lazy: collectors is optional here

    return Scraper(target.url, target.source)


class ScrapeLoop(PeriodicPasses):
    """Scrape ``targets`` every ``interval_seconds`` and submit rows to the two writers.

    ``scraper_factory(target)`` returns an object with ``scrape() -> list[Sample]`` (default:
    ``inferpath.collectors.scraper.Scraper``). ``histogram_writer``: the
    ``otel_metrics_histogram`` writer; without one, histogram samples are counted in
    ``histograms_skipped_total`` and not stored. Counters: ``samples_total``,
    ``scrape_errors_total`` and ``scrape_errors_by_target`` (url → count).
    """

    thread_name = "inferpath-scrape"
    failure_message = "scrape pass failed"
    first_pass_at_start = True

    def __init__(
        self,
        targets: Sequence[ScrapeTarget],
        gauge_writer: BatchWriter,
        sum_writer: BatchWriter,
        *,
        interval_seconds: float = 1.0,
        scraper_factory: Callable[[ScrapeTarget], Any] = _default_scraper_factory,
        histogram_writer: BatchWriter | None = None,
    ) -> None:
        super().__init__(interval_seconds)
        self.targets = list(targets)
        self.gauge_writer = gauge_writer
        self.sum_writer = sum_writer
        self.histogram_writer = histogram_writer
        self.histograms_skipped_total = 0
        self._factory = scraper_factory
        self._scrapers: dict[int, Any] = {}
        self._failure_log = RateLimitedLog(logger, interval_seconds=10.0)
        self.samples_total = 0
        self.scrape_errors_total = 0
        self.scrape_errors_by_target: dict[str, int] = {}

    def scrape_once(self) -> int:
        """Scrape every target once; return the number of samples submitted. Never raises."""
        submitted = 0
        for index, target in enumerate(self.targets):
            try:
                scraper = self._scrapers.get(index)
                if scraper is None:
                    scraper = self._scrapers[index] = self._factory(target)
                # The collectors' Scraper returns [] and counts its own errors instead of raising.
                errors_before = getattr(scraper, "errors_total", 0)
                samples = scraper.scrape()
                failed = getattr(scraper, "errors_total", 0) - errors_before
                gauges, sums, histograms = samples_to_rows(samples, target.source)
            except Exception as exc:  # noqa: BLE001 - one bad target must not stop the loop
                failed = 1
                gauges, sums, histograms = [], [], []
                self._failure_log.warning("scrape of %s (%s) failed: %s", target.url, target.source, exc)
            if failed:
                self.scrape_errors_total += failed
                self.scrape_errors_by_target[target.url] = self.scrape_errors_by_target.get(target.url, 0) + failed
            self.gauge_writer.submit([row.to_insert_row() for row in gauges])
            self.sum_writer.submit([row.to_insert_row() for row in sums])
            if self.histogram_writer is not None:
                self.histogram_writer.submit([row.to_insert_row() for row in histograms])
                submitted += len(histograms)
            else:
                self.histograms_skipped_total += len(histograms)
            submitted += len(gauges) + len(sums)
        self.samples_total += submitted
        return submitted

    def run_pass(self) -> None:
        self.scrape_once()

    def start(self) -> None:
        """Start the daemon thread (no-op without targets). Idempotent."""
        if self.targets:
            super().start()

    def stop(self, timeout_seconds: float = 5.0) -> None:
        """Stop the thread and close the scrapers; idempotent."""
        super().stop(timeout_seconds)
        for scraper in self._scrapers.values():
            close = getattr(scraper, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - shutting down anyway
                    logger.debug("closing a scraper failed", exc_info=True)
        self._scrapers.clear()
