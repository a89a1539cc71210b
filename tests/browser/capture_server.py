"""A real inferpath server on embedded chDB, fed with a real vLLM capture over OTLP/HTTP.

Helpers of the ``fed_server`` fixture (``conftest.py``) and of the tests that use it.

Traces: the raw OTLP protobuf bodies vLLM posted (``vllm_live_capture/otlp/*.pb``).
Engine gauges: the same run's ``/metrics`` scrapes, parsed by the collectors' signal
catalog and posted as OTLP gauges stamped with the scrape time from the file name, so the
queue depth lines up with the requests as it did in the real run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from inferpath.demo.processes import free_port

__all__ = ["CAPTURE", "PROTOBUF", "FedServer", "capture_time", "free_port", "metrics_body"]
"""``free_port`` is shared with the browser tests from here."""

CAPTURE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "vllm_live_capture"
PROTOBUF = {"Content-Type": "application/x-protobuf"}


@dataclass(frozen=True)
class FedServer:
    """A running server holding the capture: ``url``, and a window ``[start, end)`` covering it."""

    url: str
    start: datetime
    end: datetime
    requests_total: int


def capture_time(path: Path) -> datetime:
    # File names carry the scrape's wall-clock time in unix nanoseconds.
    unix_ns = int(path.stem.split("_")[-1])
    return datetime.fromtimestamp(unix_ns / 1e9, tz=timezone.utc)


def metrics_body(samples: list) -> bytes:
    """An OTLP ``ExportMetricsServiceRequest`` with one gauge data point per gauge sample.

    ``samples``: collector ``Sample`` objects; metric name = canonical signal, unit as in
    the catalog, ``service.name`` = ``vllm``. Counters (``kind="sum"``) are left out.
    """
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    request = ExportMetricsServiceRequest()
    resource_metrics = request.resource_metrics.add()
    resource_metrics.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="vllm")))
    scope = resource_metrics.scope_metrics.add()
    scope.scope.name = "inferpath.collectors"
    for sample in samples:
        if sample.kind != "gauge":
            continue
        metric = scope.metrics.add()
        metric.name, metric.unit = sample.signal, sample.unit
        point = metric.gauge.data_points.add()
        point.time_unix_nano = int(sample.timestamp.timestamp() * 1e9)
        point.as_double = sample.value
        for key, value in sorted(sample.attributes.items()):
            point.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    return request.SerializeToString()
