"""``prepare_import`` reads and checks a whole recording before anything is posted: a bad
option or file raises, and what it returns is every body to post."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from inferpath.collectors.recording import RecordingError, open_recording, prepare_import


def test_an_unknown_source_is_refused_and_a_known_one_encodes_every_body(tmp_path: Path) -> None:
    (tmp_path / "otlp").mkdir()
    (tmp_path / "otlp" / "body.json").write_text('{"resourceSpans": []}')
    (tmp_path / "metrics_1700000000000000000.prom").write_text("vllm:num_requests_running 1\n")
    recording = open_recording(tmp_path)
    with pytest.raises(RecordingError, match="source: unknown 'nope', expected one of vllm, sglang"):
        prepare_import(recording, source="nope")
    prepared = prepare_import(recording, source="vllm")
    assert len(prepared.trace_bodies) == 1 and ExportTraceServiceRequest.FromString(prepared.trace_bodies[0])
    assert len(prepared.metric_bodies) == 1 and prepared.scrapes == 1 and prepared.unrecognised_scrapes == []
    metrics = ExportMetricsServiceRequest.FromString(prepared.metric_bodies[0])
    names = {m.name for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert names, "the scrape became no metric"
