"""Collector samples -> an OTLP ``ExportMetricsServiceRequest`` (opentelemetry-proto classes).

One ``ResourceMetrics`` per source (``service.name`` = ``nvml``, ``dcgm``, ``vllm``, …, plus
``host.name`` of the agent), one ``Metric`` per canonical signal and unit, one data point
per sample. Gauges stay gauges; counters become monotonic cumulative sums; histograms
become cumulative explicit-bucket histograms (per-bucket counts, finite bounds). Each
point carries the sample's attributes and ``inferpath.source_metric``, so rows written by
the server's OTLP receiver equal those of its own scrape loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from inferpath.vocabulary import SOURCE_METRIC_ATTRIBUTE

SCOPE_NAME = "inferpath.collectors"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _key_values(attributes: Mapping[str, str]) -> list[KeyValue]:
    return [KeyValue(key=str(k), value=AnyValue(string_value=str(v))) for k, v in sorted(attributes.items())]


def build_request(
    batches: Iterable[tuple[str, Sequence]], *, resource_attributes: Mapping[str, str] | None = None
) -> ExportMetricsServiceRequest:
    """Build one export request from ``(source, samples)`` batches.

    ``samples``: collector :class:`~inferpath.collectors.prometheus.Sample` or
    :class:`~inferpath.collectors.prometheus.HistogramSample` objects (aware timestamps).
    ``resource_attributes`` are added to every resource (``service.name`` is the source).
    """
    request = ExportMetricsServiceRequest()
    by_source: dict[str, list] = {}
    for source, samples in batches:
        by_source.setdefault(source, []).extend(samples)
    for source, samples in by_source.items():
        if not samples:
            continue
        resource_metrics = request.resource_metrics.add()
        resource = {**(resource_attributes or {}), "service.name": source}
        resource_metrics.resource.attributes.extend(_key_values(resource))
        scope = resource_metrics.scope_metrics.add()
        scope.scope.name = SCOPE_NAME
        metrics: dict[tuple[str, str, str], object] = {}
        for sample in samples:
            key = (sample.signal, sample.unit, sample.kind)
            metric = metrics.get(key)
            if metric is None:
                metric = metrics[key] = scope.metrics.add()
                metric.name, metric.unit = sample.signal, sample.unit
                if sample.kind == "sum":
                    metric.sum.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
                    metric.sum.is_monotonic = True
                elif sample.kind == "histogram":
                    metric.histogram.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
            _add_point(metric, sample)
    return request


def _add_point(metric, sample) -> None:
    attributes = {**sample.attributes, SOURCE_METRIC_ATTRIBUTE: sample.source_metric}
    time_unix_nano = _unix_ns(sample.timestamp)
    if sample.kind == "histogram":
        point = metric.histogram.data_points.add()
        point.count = int(round(sample.count))
        point.sum = float(sample.sum)
        point.bucket_counts.extend(sample.bucket_counts())
        point.explicit_bounds.extend(float(b) for b in sample.bounds)
    else:
        point = (metric.sum if sample.kind == "sum" else metric.gauge).data_points.add()
        point.as_double = float(sample.value)
    point.time_unix_nano = time_unix_nano
    point.attributes.extend(_key_values(attributes))


def _unix_ns(timestamp: datetime) -> int:
    # Integer arithmetic: a float of seconds would lose the last digits of the nanoseconds.
    delta = timestamp - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000
