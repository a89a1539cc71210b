"""Provider setup: validation, resource, bounded queue with counted drops, OTLP export."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferpath.instrumentation import provider


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("export_timeout_seconds", {"export_timeout_seconds": 2000}),
        ("schedule_delay_seconds", {"schedule_delay_seconds": 500}),
        ("endpoint_class", {"endpoint_class": "batch"}),
        ("max_queue_size", {"max_queue_size": 0}),
        ("otlp_endpoint", {"otlp_endpoint": "127.0.0.1:4318"}),
    ],
)
def test_bad_settings_raise_naming_the_field(field: str, kwargs: dict) -> None:
    with pytest.raises(ValueError, match=field) as caught:
        provider.configure("svc", **kwargs)
    if "timeout" in field or "delay" in field:
        assert "milliseconds" in str(caught.value)


def test_resource_carries_service_instance_and_endpoint_class() -> None:
    exporter = InMemorySpanExporter()
    provider.configure(
        "svc-a", endpoint_class="bulk", span_exporter=exporter, resource_attributes={"deployment.environment": "test"}
    )
    try:
        with provider.get_tracer().start_as_current_span("x"):
            pass
        provider.force_flush()
        [span] = exporter.get_finished_spans()
        resource = dict(span.resource.attributes)
        assert resource["service.name"] == "svc-a"
        assert resource["inferpath.endpoint_class"] == "bulk"
        assert resource["deployment.environment"] == "test"
        assert len(resource["service.instance.id"]) == 36
        # Same settings: same provider; different settings: a new one with a new id.
        same = provider.configure(
            "svc-a",
            endpoint_class="bulk",
            span_exporter=exporter,
            resource_attributes={"deployment.environment": "test"},
        )
        assert same is provider.current_provider()
        other = provider.configure("svc-b", span_exporter=exporter)
        assert other is not same
        assert other.resource.attributes["service.instance.id"] != resource["service.instance.id"]
    finally:
        provider.shutdown()


class _BlockingExporter(SpanExporter):
    """Holds the export worker until released, so the bounded queue fills up."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(5)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


def test_full_queue_drops_and_counts_without_blocking_the_caller() -> None:
    exporter = _BlockingExporter()
    before = provider.dropped_spans_total()
    provider.configure("svc-drop", span_exporter=exporter, max_queue_size=4, schedule_delay_seconds=0.01)
    try:
        tracer = provider.get_tracer()
        started = time.perf_counter()
        for index in range(50):
            tracer.start_span(f"s{index}").end()
            time.sleep(0.001)
        assert time.perf_counter() - started < 2.0
        assert provider.dropped_spans_total() - before >= 40
    finally:
        exporter.release.set()
        provider.shutdown()
    assert exporter.exported <= 10


def test_spans_reach_an_otlp_http_receiver_as_protobuf() -> None:
    bodies: list[tuple[str, str, bytes]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server API
            length = int(self.headers["Content-Length"])
            bodies.append((self.path, self.headers["Content-Type"], self.rfile.read(length)))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        provider.configure(
            "svc-otlp", otlp_endpoint=f"http://127.0.0.1:{server.server_port}/", schedule_delay_seconds=0.05
        )
        with provider.get_tracer().start_as_current_span("exported"):
            pass
        provider.shutdown(5.0)
    finally:
        server.shutdown()
    assert bodies, "no OTLP request arrived"
    path, content_type, body = bodies[0]
    assert path == "/v1/traces"
    assert content_type == "application/x-protobuf"
    request = ExportTraceServiceRequest.FromString(body)
    [resource_spans] = request.resource_spans
    names = [s.name for ss in resource_spans.scope_spans for s in ss.spans]
    assert names == ["exported"]
    service = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
    assert service["service.name"] == "svc-otlp"


def test_shutdown_timeout_in_milliseconds_is_rejected() -> None:
    with pytest.raises(ValueError, match="timeout_seconds"):
        provider.shutdown(2000)
