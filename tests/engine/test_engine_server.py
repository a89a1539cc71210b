"""The emulated engine served by uvicorn on 127.0.0.1: OpenAI API, /metrics, /gpu/metrics, spans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from inferpath.demo.engine import EngineConfig
from inferpath.demo.engine.server import create_app
from inferpath.demo.processes import free_port as _free_port

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def engine_app():
    exporter = InMemorySpanExporter()
    app = create_app(
        EngineConfig(time_scale=0.05), service_name="demo-engine-test", span_exporter=exporter, hostname="gpu-node-1"
    )
    return app, exporter


def _sse_payloads(text: str) -> list[str]:
    assert text.endswith("\n\n")
    events = [block for block in text.split("\n\n") if block]
    assert all(block.startswith("data: ") for block in events)
    return [block[len("data: ") :] for block in events]


def _wait_for_spans(app, exporter, count: int = 1):
    deadline = time.monotonic() + 5
    while len(exporter.get_finished_spans()) < count and time.monotonic() < deadline:
        app.state.tracer_provider.force_flush()
        time.sleep(0.05)
    return exporter.get_finished_spans()


def test_streamed_completion_with_traceparent_yields_a_vllm_llm_request_span(engine_app, serve_app):
    app, exporter = engine_app
    with serve_app(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        response = client.post(
            "/v1/completions",
            headers={"traceparent": TRACEPARENT},
            json={
                "model": "llama2-70b",
                "prompt": list(range(1, 301)),
                "max_tokens": 12,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = _sse_payloads(response.text)
        spans = _wait_for_spans(app, exporter)

    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    token_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert len(token_chunks) == 12
    assert all(c["object"] == "text_completion" and c["model"] == "llama2-70b" for c in chunks)
    assert all(len(c["choices"][0]["text"].split()) == 1 for c in token_chunks)
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None] * 11 + ["length"]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 300, "completion_tokens": 12, "total_tokens": 312}

    [span] = spans
    assert span.name == "llm_request" and span.kind == SpanKind.SERVER
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == PARENT_SPAN_ID
    assert span.resource.attributes["service.name"] == "demo-engine-test"
    attrs = span.attributes
    assert attrs["gen_ai.request.id"] == chunks[0]["id"]
    assert attrs["gen_ai.usage.prompt_tokens"] == 300
    assert attrs["gen_ai.usage.completion_tokens"] == 12
    assert attrs["gen_ai.request.max_tokens"] == 12
    assert attrs["gen_ai.response.model"] == "llama2-70b"
    for key in (
        "time_to_first_token",
        "e2e",
        "time_in_queue",
        "time_in_model_prefill",
        "time_in_model_decode",
        "time_in_model_inference",
    ):
        assert isinstance(attrs[f"gen_ai.latency.{key}"], float)
    assert attrs["gen_ai.latency.e2e"] >= attrs["gen_ai.latency.time_to_first_token"] > 0
    assert attrs["gen_ai.latency.time_in_model_decode"] > 0
    duration_s = (span.end_time - span.start_time) / 1e9
    assert duration_s == pytest.approx(attrs["gen_ai.latency.e2e"], abs=1e-6)


def test_metrics_parse_and_carry_vllm_names_and_labels(engine_app, serve_app):
    app, _ = engine_app
    with serve_app(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        for _ in range(2):
            assert (
                client.post("/v1/completions", json={"prompt": "tell me about queues", "max_tokens": 3}).status_code
                == 200
            )
        text = client.get("/metrics").text

    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert families[name].type == "gauge"
        [sample] = families[name].samples
        assert sample.labels == {"model_name": "llama2-70b", "engine": "0"}
        assert sample.value == 0.0
    preemptions = families["vllm:num_preemptions"]
    assert preemptions.type == "counter"
    assert any(s.name == "vllm:num_preemptions_total" and s.labels["engine"] == "0" for s in preemptions.samples)
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
    ):
        assert families[name].type == "histogram"
        count = next(s for s in families[name].samples if s.name == f"{name}_count")
        assert count.value == 2 and count.labels == {"model_name": "llama2-70b", "engine": "0"}
    ttft_buckets = [
        s.labels["le"] for s in families["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_bucket")
    ]
    assert ttft_buckets[:3] == ["0.001", "0.005", "0.01"] and ttft_buckets[-1] == "+Inf"


def test_metric_names_match_a_real_vllm_scrape(engine_app, serve_app, shared_data):
    real = (shared_data / "vllm_live_capture" / "metrics_1796037503909019406.prom").read_text()
    real_types = {f.name: f.type for f in text_string_to_metric_families(real)}
    app, _ = engine_app
    with serve_app(app) as url:
        ours = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(ours):
        if family.name.startswith("vllm:"):
            assert real_types.get(family.name) == family.type, family.name


def test_gpu_metrics_look_like_dcgm_exporter(engine_app, serve_app, shared_data):
    real = (shared_data / "dcgm_exporter_metrics" / "cncf_ai_conformance_upcloud_L40S.prom").read_text()
    real_labels = {s.name: set(s.labels) for f in text_string_to_metric_families(real) for s in f.samples}
    app, _ = engine_app
    with serve_app(app) as url:
        text = httpx.get(f"{url}/gpu/metrics", timeout=10).text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert {s.name for s in samples} == {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_POWER_USAGE",
    }
    for s in samples:
        assert set(s.labels) == real_labels[s.name] - {"DCGM_FI_DRIVER_VERSION"}
        assert s.labels["Hostname"] == "gpu-node-1" and s.labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert {s.labels["gpu"] for s in samples} == {"0", "1", "2", "3"}  # tensor_parallel = 4
    used = next(s.value for s in samples if s.name == "DCGM_FI_DEV_FB_USED")
    free = next(s.value for s in samples if s.name == "DCGM_FI_DEV_FB_FREE")
    assert used + free == 81_559
    assert used == 68_976_648_192 * 2 // 4 // 2**20


def test_non_streamed_and_chat_completions(engine_app, serve_app):
    app, exporter = engine_app
    with serve_app(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        plain = client.post("/v1/completions", json={"prompt": "x" * 400, "max_tokens": 4}).json()
        chat = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hello"}], "max_completion_tokens": 3, "stream": True},
        )
        models = client.get("/v1/models").json()
        health = client.get("/health")
    assert plain["object"] == "text_completion"
    assert len(plain["choices"][0]["text"].split()) == 4
    assert plain["usage"] == {"prompt_tokens": 100, "completion_tokens": 4, "total_tokens": 104}
    payloads = _sse_payloads(chat.text)
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [len(c["choices"][0]["delta"]["content"].split()) for c in chunks[1:]] == [1, 1, 1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"].startswith("chatcmpl-") for c in chunks)
    assert models["data"][0]["id"] == "llama2-70b"
    assert health.status_code == 200
    assert len(_wait_for_spans(app, exporter, 2)) == 2


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ({"max_tokens": 5}, 400, "prompt"),
        ({"prompt": "", "max_tokens": 5}, 400, "prompt"),
        ({"prompt": "hi", "n": 2}, 400, "n"),
        ({"prompt": [1, 2], "max_tokens": 1_000_000}, 400, "max_tokens"),
        ({"prompt": "hi", "model": "other-model"}, 404, "model"),
    ],
)
def test_bad_requests_get_openai_errors_naming_the_field(engine_app, serve_app, body, status, param):
    app, _ = engine_app
    with serve_app(app) as url:
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=10)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == status and error["param"] == param and param in error["message"]


class _OtlpSink(BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        length = int(self.headers.get("content-length", 0))
        type(self).bodies.append(self.rfile.read(length))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.mark.e2e
def test_module_entry_point_flushes_spans_on_sigterm():
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _OtlpSink)
    _OtlpSink.bodies = []
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inferpath.demo.engine",
            "--port",
            str(port),
            "--time-scale",
            "0.05",
            "--kv-blocks",
            "512",
            "--otlp-endpoint",
            f"http://127.0.0.1:{sink.server_address[1]}",
            "--service-name",
            "engine-under-test",
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "engine did not start"
            time.sleep(0.1)
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            headers={"traceparent": TRACEPARENT},
            json={"prompt": [7] * 50, "max_tokens": 3},
            timeout=10,
        )
        assert response.status_code == 200
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal so the exit status says SIGTERM.
        assert proc.wait(timeout=10) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        sink.shutdown()

    spans = []
    for body in _OtlpSink.bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
            for scope_spans in resource_spans.scope_spans:
                spans.extend((service, span) for span in scope_spans.spans)
    [(service, span)] = spans
    assert service == "engine-under-test"
    assert span.name == "llm_request" and span.trace_id.hex() == TRACE_ID
    assert span.parent_span_id.hex() == PARENT_SPAN_ID
