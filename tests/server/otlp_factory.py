"""OTLP trace bodies built from the protobuf classes, for the receiver tests and benchmarks.

Each trace looks like vLLM's: one ``llm_request`` SERVER span with vLLM's ``gen_ai.latency.*``
attributes (so the assembler derives a request row), plus child INTERNAL spans.
"""

from __future__ import annotations

import os
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

ENGINE_ATTRIBUTES = {
    "gen_ai.latency.time_in_queue": 0.015,
    "gen_ai.latency.time_in_model_prefill": 0.04,
    "gen_ai.latency.time_in_model_decode": 0.5,
    "gen_ai.latency.time_to_first_token": 0.06,
    "gen_ai.latency.e2e": 0.56,
    "gen_ai.usage.prompt_tokens": 120,
    "gen_ai.usage.completion_tokens": 40,
}


def _kv(key: str, value) -> KeyValue:
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def trace_body(
    spans_per_trace: int = 10, traces: int = 1, *, start_ns: int | None = None, service_name: str = "bench-engine"
) -> tuple[bytes, dict[str, list[str]]]:
    """One ``ExportTraceServiceRequest`` holding ``traces`` traces of ``spans_per_trace`` spans.

    Returns ``(protobuf bytes, {trace id hex: [span id hex, ...]})``. Ids are random;
    ``start_ns`` defaults to now (wall clock).
    """
    start = time.time_ns() if start_ns is None else start_ns
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.append(_kv("service.name", service_name))
    scope = resource_spans.scope_spans.add()
    scope.scope.name = "inferpath.tests"
    ids: dict[str, list[str]] = {}
    for _ in range(traces):
        trace_id = os.urandom(16)
        root_id = os.urandom(8)
        span_ids = []
        for index in range(spans_per_trace):
            span = scope.spans.add()
            span.trace_id = trace_id
            span.span_id = root_id if index == 0 else os.urandom(8)
            if index == 0:
                span.name, span.kind = "llm_request", 2
                span.attributes.extend(_kv(k, v) for k, v in ENGINE_ATTRIBUTES.items())
                span.start_time_unix_nano, span.end_time_unix_nano = start, start + 560_000_000
            else:
                span.parent_span_id = root_id
                span.name, span.kind = f"step {index}", 1
                span.start_time_unix_nano = start + index * 1_000_000
                span.end_time_unix_nano = span.start_time_unix_nano + 500_000
                span.attributes.append(_kv("step.index", index))
            span_ids.append(span.span_id.hex())
        ids[trace_id.hex()] = span_ids
    return request.SerializeToString(), ids
