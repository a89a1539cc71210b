"""Replay the recorded vLLM capture into a real server, shifted to the present.

The store drops rows older than its TTL on insert, so every time in the capture is moved by
one offset (now − the capture's first scrape), keeping spans and scrapes aligned. Spans go
in as the raw OTLP/HTTP protobuf bodies vLLM posted (times rewritten); each ``/metrics``
scrape is turned into canonical signals by the collectors' own parser and catalog, stamped
with its recorded (shifted) scrape time, and posted as OTLP metrics — what a collector
process next to vLLM sends.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import httpx
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE

from inferpath.collectors.prometheus import scrape_samples

PROTOBUF = {"content-type": "application/x-protobuf"}


def capture_dir(shared_data: Path) -> Path:
    return shared_data / "vllm_live_capture"


def scrape_files(shared_data: Path) -> list[tuple[int, Path]]:
    """(recorded unix ns, path) of every ``metrics_<unix_ns>.prom``, oldest first."""
    files = [(int(p.stem.split("_", 1)[1]), p) for p in capture_dir(shared_data).glob("metrics_*.prom")]
    return sorted(files)


def shifted_trace_body(path: Path, offset_ns: int) -> bytes:
    request = ExportTraceServiceRequest()
    request.ParseFromString(path.read_bytes())
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                span.start_time_unix_nano += offset_ns
                span.end_time_unix_nano += offset_ns
    return request.SerializeToString()


def scrape_as_otlp(text: str, at_ns: int) -> bytes:
    """One scrape as an OTLP metrics body: canonical gauges and cumulative sums at ``at_ns``."""
    timestamp = datetime.fromtimestamp(at_ns / 1e9, tz=timezone.utc)
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add()
    resource.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="vllm")))
    scope = resource.scope_metrics.add()
    scope.scope.name = "inferpath.collectors"
    for sample in scrape_samples(text, "vllm", timestamp=timestamp):
        metric = scope.metrics.add()
        metric.name, metric.unit = sample.signal, sample.unit
        if sample.kind == "gauge":
            point = metric.gauge.data_points.add()
        else:
            metric.sum.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
            metric.sum.is_monotonic = True
            point = metric.sum.data_points.add()
        point.time_unix_nano = at_ns
        point.as_double = sample.value
        for key, value in sample.attributes.items():
            point.attributes.append(KeyValue(key=key, value=AnyValue(string_value=str(value))))
    return request.SerializeToString()


def ingest_capture(client: httpx.Client, shared_data: Path) -> int:
    """Post the whole capture to the server behind ``client``; returns the offset (ns) applied."""
    scrapes = scrape_files(shared_data)
    offset_ns = datetime.now(timezone.utc).timestamp().__int__() * 1_000_000_000 - scrapes[0][0] - 120 * 10**9
    for path in sorted((capture_dir(shared_data) / "otlp").glob("*.pb")):
        response = client.post("/v1/traces", content=shifted_trace_body(path, offset_ns), headers=PROTOBUF)
        assert response.status_code == 200, response.text
    for at_ns, path in scrapes:
        response = client.post(
            "/v1/metrics", content=scrape_as_otlp(path.read_text(), at_ns + offset_ns), headers=PROTOBUF
        )
        assert response.status_code == 200, response.text
    flushed = client.post("/api/v1/flush", timeout=120).json()
    assert flushed["ok"] is True
    return offset_ns
