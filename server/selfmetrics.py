"""The server's own Prometheus metrics, read from the runtime's counters at scrape time.

A custom collector on a private registry (prometheus_client's process-collector habit):
nothing is updated on the ingest path beyond plain integer counters, and two servers in
one process (tests) never collide in the global registry. Each table row is
``(name, help, value)``; a name gets ``_total`` for a counter.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from inferpath.server.ingest import INSERT_SECONDS_BUCKETS
from inferpath.server.span_log import LoggedSpanIngest

if TYPE_CHECKING:  # pragma: no cover
    from inferpath.server.runtime import ServerRuntime

__all__ = ["RuntimeCollector", "make_registry"]


def _counters(rows) -> Iterator[Metric]:
    for name, doc, value in rows:
        yield CounterMetricFamily(name, doc, value=value)


def _gauges(rows) -> Iterator[Metric]:
    for name, doc, value in rows:
        yield GaugeMetricFamily(name, doc, value=value)


class RuntimeCollector:
    """Exposes a :class:`ServerRuntime`'s counters as ``inferpath_server_*`` metrics."""

    def __init__(self, runtime: ServerRuntime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        rt, assembler = self.runtime, self.runtime.assembler
        yield from _counters(
            (
                ("inferpath_server_spans_received", "Spans accepted from OTLP exports.", rt.spans_received_total),
                (
                    "inferpath_server_spans_duplicate",
                    "Of the spans received, those of exports committed before (client "
                    "retries), answered 200 without a second insert.",
                    rt.spans_duplicate_total,
                ),
                (
                    "inferpath_server_spans_rejected",
                    "Invalid spans rejected (OTLP partial success).",
                    rt.spans_rejected_total,
                ),
                (
                    "inferpath_server_spans_warned",
                    "Spans kept with a warning (OTLP partial success; e.g. an undefined"
                    " span kind stored as Unspecified), counted on every delivery.",
                    rt.spans_warned_total,
                ),
                (
                    "inferpath_server_spans_refused",
                    "Valid spans not accepted after decoding: answered 503 (busy, span "
                    "log backlog full, store unavailable; the client retries) or 400 (the store refused their "
                    "data). Exports refused before decoding are counted by "
                    "inferpath_span_log_refused_backlog_full_total.",
                    rt.spans_refused_total,
                ),
                (
                    "inferpath_server_spans_dropped",
                    "Spans acknowledged with 200 and lost afterwards (logged spans the "
                    "store refused for their data); 0 by design.",
                    rt.spans_dropped_total,
                ),
                (
                    "inferpath_server_data_points_received",
                    "Metric data points accepted.",
                    rt.data_points_received_total,
                ),
                (
                    "inferpath_server_data_points_rejected",
                    "Invalid or unsupported data points rejected.",
                    rt.data_points_rejected_total,
                ),
                (
                    "inferpath_server_data_points_refused",
                    "Valid data points not accepted: answered 503 (the client "
                    "retries) or 400 (the store refused their data).",
                    rt.data_points_refused_total,
                ),
                (
                    "inferpath_server_otlp_bad_requests",
                    "Malformed, oversized or unsupported OTLP requests.",
                    rt.bad_requests_total,
                ),
                ("inferpath_assembler_rows", "Request rows derived by the assembler.", assembler.rows_written_total),
                ("inferpath_assembler_errors", "Failed request-assembly passes.", assembler.errors_total),
                (
                    "inferpath_assembler_ttft_conflicts",
                    "Spans whose TTFT sources disagreed by more than 1 ms (the "
                    "first source in precedence was kept, see docs/interop.md; counted at each derivation).",
                    assembler.derivation_counts.ttft_conflicts_total,
                ),
                (
                    "inferpath_assembler_ignored_timings",
                    "Chunk events or first-token times ignored as malformed "
                    "(before the span's start, after its end, unparsable; counted at each derivation).",
                    assembler.derivation_counts.ignored_timings_total,
                ),
                (
                    "inferpath_assembler_rows_from_memory",
                    "Traces assembled from the spans held since their insert (one may yield no request row).",
                    assembler.assembled_from_memory_total,
                ),
                (
                    "inferpath_assembler_rows_from_store",
                    "Traces assembled from spans read back from the store (one may yield no request row).",
                    assembler.assembled_from_store_total,
                ),
                (
                    "inferpath_scrape_samples",
                    "Samples scraped from engine and GPU exporters.",
                    rt.scrape_loop.samples_total,
                ),
                (
                    "inferpath_rollup_passes",
                    "Passes of the per-minute request rollup refresher.",
                    rt.rollups.passes_total,
                ),
                ("inferpath_rollup_errors", "Failed rollup refresh passes.", rt.rollups.failures_total),
            )
        )
        scrape_errors = CounterMetricFamily("inferpath_scrape_errors", "Failed scrapes per target.", labels=["target"])
        for target, count in sorted(rt.scrape_loop.scrape_errors_by_target.items()):
            scrape_errors.add_metric([target], count)
        yield scrape_errors
        yield from _gauges(
            (
                (
                    "inferpath_assembler_pending_traces",
                    "Traces noted, not yet assembled.",
                    assembler.pending_traces,
                ),
                ("inferpath_assembler_held_spans", "Committed spans held for assembly.", assembler.held_spans),
                ("inferpath_rollup_last_pass_seconds", "Duration of the last rollup pass.", rt.rollups.last_seconds),
            )
        )
        per_table = (
            (CounterMetricFamily, "inferpath_writer_rows_inserted", "Rows inserted.", "rows_inserted_total"),
            (
                CounterMetricFamily,
                "inferpath_writer_rows_dropped",
                "Rows dropped (queue full, insert failed, or rejected).",
                "rows_dropped_total",
            ),
            (
                CounterMetricFamily,
                "inferpath_writer_rows_rejected",
                "Rows dropped because the store cannot hold a value of theirs (logged with the reason).",
                "rows_rejected_total",
            ),
            (CounterMetricFamily, "inferpath_writer_insert_errors", "Failed insert calls.", "insert_errors_total"),
            (GaugeMetricFamily, "inferpath_writer_queue_rows", "Rows waiting to be inserted.", "queue_rows"),
        )
        for family_type, name, doc, attribute in per_table:
            family = family_type(name, doc, labels=["table"])
            for table, writer in rt.writers.items():
                family.add_metric([table], getattr(writer, attribute))
            yield family
        yield from _ingest_metrics(rt.ingest)
        if isinstance(rt.span_sink, LoggedSpanIngest):
            yield from _span_log_metrics(rt.span_sink)
        for service in rt.services.values():  # the alert evaluator's inferpath_alerts_*, when it runs
            yield from service.metric_families()


def _ingest_metrics(ingest) -> Iterator[Metric]:
    yield from _counters(
        (
            ("inferpath_ingest_commits", "OTLP exports committed to the store (answered 200).", ingest.commits_total),
            (
                "inferpath_ingest_store_errors",
                "Inserts that failed because of the store (answered 503).",
                ingest.store_errors_total,
            ),
            (
                "inferpath_ingest_data_errors",
                "Inserts the store refused for their data (answered 400).",
                ingest.data_errors_total,
            ),
            (
                "inferpath_ingest_refused_busy",
                "Exports refused with 503: in-flight limits reached.",
                ingest.overloaded_total,
            ),
            (
                "inferpath_ingest_refused_store_unavailable",
                "Exports refused with 503 while the store backs off.",
                ingest.unavailable_total,
            ),
        )
    )
    yield from _gauges(
        (
            ("inferpath_ingest_inflight_requests", "Exports being decoded or committed.", ingest.inflight_requests),
            ("inferpath_ingest_inflight_bytes", "Body bytes of exports in flight.", ingest.inflight_bytes),
            (
                "inferpath_ingest_store_available",
                "1 when inserts are attempted, 0 while backing off after a store error.",
                1 if ingest.store_available else 0,
            ),
        )
    )
    buckets = [(str(bound), count) for bound, count in zip(INSERT_SECONDS_BUCKETS, ingest.insert_seconds_buckets)]
    buckets.append(("+Inf", ingest.insert_seconds_count))
    yield HistogramMetricFamily(
        "inferpath_ingest_insert_seconds",
        "Latency of committed OTLP inserts (one per table and export), seconds.",
        buckets=buckets,
        sum_value=ingest.insert_seconds_sum,
    )


def _span_log_metrics(log_ingest: LoggedSpanIngest) -> Iterator[Metric]:
    log = log_ingest.log
    yield from _counters(
        (
            (
                "inferpath_span_log_exports",
                "Span exports appended to the write-ahead log (answered 200).",
                log_ingest.appended_total,
            ),
            (
                "inferpath_span_log_duplicate_exports",
                "Retries of logged exports answered 200 without a record.",
                log_ingest.duplicate_exports_total,
            ),
            (
                "inferpath_span_log_refused_backlog_full",
                "Exports refused with 503: the backlog bound was reached (before decoding, or after it).",
                log_ingest.backlog_full_total,
            ),
            ("inferpath_span_log_append_errors", "Appends that failed (answered 503).", log_ingest.log_errors_total),
            ("inferpath_span_log_inserts", "Inserts made by the log's drainer.", log_ingest.inserts_total),
            (
                "inferpath_span_log_inserted_spans",
                "Spans inserted by the log's drainer.",
                log_ingest.inserted_spans_total,
            ),
            (
                "inferpath_span_log_refused_spans",
                "Logged spans the store refused for their data (dropped).",
                log_ingest.refused_spans_total,
            ),
            (
                "inferpath_span_log_recovered_spans",
                "Spans queued again from the log at start-up.",
                log_ingest.recovered_spans_total,
            ),
            (
                "inferpath_span_log_corrupt_records",
                "Logged exports whose body failed its checksum at start-up (skipped, logged at ERROR).",
                log.corrupt_records_total,
            ),
            (
                "inferpath_span_log_unreadable_logs",
                "Span logs SQLite could not read at start-up (moved aside, logged at ERROR).",
                log.unreadable_logs_total,
            ),
        )
    )
    # The ingest queue depth: what was acknowledged and is not yet in otel_traces.
    yield from _gauges(
        (
            ("inferpath_span_log_backlog_bytes", "Log bytes not yet inserted.", log_ingest.backlog_bytes),
            ("inferpath_span_log_backlog_spans", "Spans logged, not yet inserted.", log_ingest.backlog_spans),
        )
    )


def make_registry(runtime: ServerRuntime) -> CollectorRegistry:
    """A private registry holding only the runtime's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RuntimeCollector(runtime))
    return registry
