"""The server's own Prometheus metrics, read from the runtime's counters at scrape time.

A custom collector on a private registry (prometheus_client's process-collector habit):
nothing is updated on the ingest path beyond plain integer counters, and two servers in
one process (tests) never collide in the global registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:  # pragma: no cover
    from inferpath.server.runtime import ServerRuntime

__all__ = ["RuntimeCollector", "make_registry"]


class RuntimeCollector:
    """Exposes a :class:`ServerRuntime`'s counters as ``inferpath_server_*`` metrics."""

    def __init__(self, runtime: "ServerRuntime") -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        rt = self.runtime
        for name, doc, value in (
            ("inferpath_server_spans_received", "Spans accepted from OTLP exports.", rt.spans_received_total),
            ("inferpath_server_spans_rejected", "Invalid spans rejected (OTLP partial success).",
             rt.spans_rejected_total),
            ("inferpath_server_spans_dropped", "Valid spans refused because the queue was full.",
             rt.spans_dropped_total),
            ("inferpath_server_data_points_received", "Metric data points accepted.",
             rt.data_points_received_total),
            ("inferpath_server_data_points_rejected", "Invalid or unsupported data points rejected.",
             rt.data_points_rejected_total),
            ("inferpath_server_data_points_dropped", "Valid data points refused because a queue was full.",
             rt.data_points_dropped_total),
            ("inferpath_server_otlp_bad_requests", "Malformed, oversized or unsupported OTLP requests.",
             rt.bad_requests_total),
            ("inferpath_assembler_rows", "Request rows derived by the assembler.",
             rt.assembler.rows_written_total),
            ("inferpath_assembler_errors", "Failed request-assembly passes.", rt.assembler.errors_total),
            ("inferpath_scrape_samples", "Samples scraped from engine and GPU exporters.",
             rt.scrape_loop.samples_total),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        scrape_errors = CounterMetricFamily("inferpath_scrape_errors", "Failed scrapes per target.",
                                            labels=["target"])
        for target, count in sorted(rt.scrape_loop.scrape_errors_by_target.items()):
            scrape_errors.add_metric([target], count)
        yield scrape_errors
        pending = GaugeMetricFamily("inferpath_assembler_pending_traces", "Traces noted, not yet assembled.",
                                    value=rt.assembler.pending_traces)
        yield pending
        families = {
            "inserted": CounterMetricFamily("inferpath_writer_rows_inserted", "Rows inserted.", labels=["table"]),
            "dropped": CounterMetricFamily("inferpath_writer_rows_dropped",
                                           "Rows dropped (queue full or insert failed).", labels=["table"]),
            "errors": CounterMetricFamily("inferpath_writer_insert_errors", "Failed insert calls.",
                                          labels=["table"]),
            "queue": GaugeMetricFamily("inferpath_writer_queue_rows", "Rows waiting to be inserted.",
                                       labels=["table"]),
        }
        for table, writer in rt.writers.items():
            families["inserted"].add_metric([table], writer.rows_inserted_total)
            families["dropped"].add_metric([table], writer.rows_dropped_total)
            families["errors"].add_metric([table], writer.insert_errors_total)
            families["queue"].add_metric([table], writer.queue_rows)
        yield from families.values()


def make_registry(runtime: "ServerRuntime") -> CollectorRegistry:
    """A private registry holding only the runtime's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RuntimeCollector(runtime))
    return registry
