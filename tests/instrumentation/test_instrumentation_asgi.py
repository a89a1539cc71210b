"""The ASGI middleware on real FastAPI apps served by uvicorn on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from opentelemetry.trace import SpanKind, StatusCode

import inferpath
from inferpath.instrumentation.asgi import InferpathASGIMiddleware
from inferpath.instrumentation.stages import stage

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def build_app() -> FastAPI:
    app = FastAPI()

    @app.get("/events")
    async def events() -> StreamingResponse:
        async def body():
            for index in range(5):
                await asyncio.sleep(0.1)
                yield f"data: event {index}\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: dict) -> StreamingResponse:
        count = int(request.get("chunks", 300))

        async def body():
            yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + "\n\n"
            await asyncio.sleep(0.05)
            for index in range(count):
                payload = {
                    "object": "chat.completion.chunk",
                    "model": "emulated",
                    "choices": [{"index": 0, "delta": {"content": f"t{index}"}}],
                }
                yield f"data: {json.dumps(payload)}\n\n"
                if index % 50 == 0:
                    await asyncio.sleep(0.002)
            yield (
                "data: "
                + json.dumps({"choices": [], "usage": {"completion_tokens": count, "prompt_tokens": 12}})
                + "\n\n"
            )
            yield "data: [DONE]\n\n"

        with stage("retrieval"):
            pass
        return StreamingResponse(body(), media_type="text/event-stream")

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict:
        async with stage("retrieval"):
            await asyncio.sleep(0.005)
        return {"id": item_id}

    @app.get("/boom")
    async def boom() -> dict:
        raise RuntimeError("handler failed")

    @app.get("/slow-events")
    async def slow_events() -> StreamingResponse:
        async def body():
            for index in range(100):
                yield f"data: {index}\n\n"
                await asyncio.sleep(0.05)

        return StreamingResponse(body(), media_type="text/event-stream")

    return app


@pytest.fixture()
def served(spans, serve_app):
    app = build_app()
    inferpath.instrument(app, service_name="gateway-test", span_exporter=spans.exporter)
    with serve_app(app) as base_url:
        yield base_url, spans
    inferpath.uninstrument(app)


def server_spans(spans, **kwargs):
    return [s for s in spans.finished(**kwargs) if s.kind is SpanKind.SERVER]


def test_sse_stream_is_one_server_span_covering_the_whole_stream(served) -> None:
    base_url, spans = served
    started = time.perf_counter()
    with httpx.stream("GET", f"{base_url}/events", timeout=10) as response:
        body = b"".join(response.iter_bytes())
    client_elapsed_s = time.perf_counter() - started
    assert body.count(b"data:") == 5
    [span] = server_spans(spans, wait_for=1)
    duration_s = (span.end_time - span.start_time) / 1e9
    assert 0.5 <= duration_s <= client_elapsed_s
    assert span.name == "GET /events"
    attributes = span.attributes
    assert attributes["inferpath.stage"] == "gateway"
    assert attributes["http.request.method"] == "GET"
    assert attributes["http.route"] == "/events"
    assert attributes["inferpath.endpoint"] == "/events"
    assert attributes["inferpath.endpoint_class"] == "interactive"
    assert attributes["http.response.status_code"] == 200
    assert attributes["inferpath.stream.status"] == "complete"
    assert attributes["inferpath.stream.chunks"] == 5
    # Not an LLM stream: no token measures invented.
    assert "gen_ai.usage.output_tokens" not in attributes
    assert "gen_ai.response.time_to_first_chunk" not in attributes


def test_300_chunk_chat_stream_makes_no_per_chunk_spans_and_measures_ttft(served) -> None:
    base_url, spans = served
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    with httpx.stream(
        "POST", f"{base_url}/v1/chat/completions", json={"chunks": 300}, headers=headers, timeout=10
    ) as response:
        body = b"".join(response.iter_bytes())
    assert body.count(b"data:") == 303
    finished = spans.finished(wait_for=2)
    assert sorted(s.name for s in finished) == ["POST /v1/chat/completions", "retrieval"]
    server = next(s for s in finished if s.kind is SpanKind.SERVER)
    retrieval = next(s for s in finished if s.name == "retrieval")
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert format(server.parent.span_id, "016x") == PARENT_ID and server.parent.is_remote
    assert retrieval.parent.span_id == server.context.span_id
    attributes = server.attributes
    assert attributes["inferpath.stream.chunks"] == 302
    assert attributes["gen_ai.usage.output_tokens"] == 300
    assert attributes["gen_ai.usage.input_tokens"] == 12
    assert attributes["inferpath.stream.status"] == "complete"
    ttft_s = attributes["gen_ai.response.time_to_first_chunk"]
    duration_s = (server.end_time - server.start_time) / 1e9
    assert 0.05 <= ttft_s < duration_s
    assert 0 < attributes["inferpath.itl_seconds"] < 0.01


def test_route_template_names_the_span_and_stage_spans_are_children(served) -> None:
    base_url, spans = served
    assert httpx.get(f"{base_url}/items/42", timeout=10).json() == {"id": 42}
    finished = spans.finished(wait_for=2)
    server = next(s for s in finished if s.kind is SpanKind.SERVER)
    assert server.name == "GET /items/{item_id}"
    assert server.attributes["http.route"] == "/items/{item_id}"
    assert "inferpath.stream.status" not in server.attributes
    [retrieval] = [s for s in finished if s.name == "retrieval"]
    assert retrieval.parent.span_id == server.context.span_id


def test_handler_exception_marks_span_error_and_app_still_answers_500(served) -> None:
    base_url, spans = served
    assert httpx.get(f"{base_url}/boom", timeout=10).status_code == 500
    [server] = server_spans(spans, wait_for=1)
    assert server.status.status_code is StatusCode.ERROR
    assert server.attributes["http.response.status_code"] == 500
    assert server.attributes["error.type"] == "RuntimeError"


def test_client_disconnect_mid_stream_ends_span_incomplete(served) -> None:
    base_url, spans = served
    with httpx.stream("GET", f"{base_url}/slow-events", timeout=10) as response:
        received = 0
        for _ in response.iter_bytes():
            received += 1
            if received >= 3:
                break
    [server] = server_spans(spans, wait_for=1)
    assert server.attributes["inferpath.stream.status"] == "incomplete"
    assert server.attributes["inferpath.stream.incomplete_reason"] == "client_disconnect"
    assert server.attributes["inferpath.stream.chunks"] < 100
    assert server.status.status_code is not StatusCode.ERROR


def test_instrument_twice_adds_one_middleware_and_uninstrument_removes_it(spans, serve_app) -> None:
    app = build_app()
    inferpath.instrument(app, service_name="gateway-test", span_exporter=spans.exporter)
    inferpath.instrument(app, service_name="gateway-test", span_exporter=spans.exporter)
    assert [m.cls for m in app.user_middleware].count(InferpathASGIMiddleware) == 1
    with serve_app(app) as base_url:
        httpx.get(f"{base_url}/items/1", timeout=10)
        assert len(server_spans(spans, wait_for=2)) == 1  # the retrieval span + ours
        inferpath.uninstrument(app)
        assert InferpathASGIMiddleware not in [m.cls for m in app.user_middleware]
        spans.exporter.clear()
        assert httpx.get(f"{base_url}/items/2", timeout=10).json() == {"id": 2}
        time.sleep(0.1)
        assert [s for s in spans.finished() if s.attributes.get("inferpath.stage") == "gateway"] == []


def test_health_probes_are_not_traced() -> None:
    """A readiness probe is not a request of the service: no span, so no request row."""
    import asyncio

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from inferpath.instrumentation.asgi import InferpathASGIMiddleware
    from inferpath.instrumentation.provider import configure

    exporter = InMemorySpanExporter()
    configure("probe-test", span_exporter=exporter)
    sent: list[dict] = []

    async def app(scope, receive, send):  # a bare ASGI app answering 200
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    middleware = InferpathASGIMiddleware(app)
    for path in ("/health", "/v1/chat/completions"):
        asyncio.run(middleware({"type": "http", "method": "GET", "path": path, "headers": []}, receive, send))
    from inferpath.instrumentation.provider import force_flush

    force_flush()
    names = [span.name for span in exporter.get_finished_spans()]
    assert len(sent) == 4
    assert len(names) == 1 and "health" not in names[0]


def test_routes_in_otels_excluded_urls_are_not_traced(monkeypatch) -> None:
    """OTEL_PYTHON_FASTAPI_EXCLUDED_URLS (else OTEL_PYTHON_EXCLUDED_URLS), as OpenTelemetry's
    own instrumentations read it: regular expressions searched in the request path."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from inferpath.instrumentation.provider import configure, force_flush

    exporter = InMemorySpanExporter()
    configure("excluded-test", span_exporter=exporter)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        pass

    def traced(paths) -> list[str]:
        exporter.clear()
        middleware = InferpathASGIMiddleware(app)  # reads the variables when built
        for path in paths:
            asyncio.run(middleware({"type": "http", "method": "POST", "path": path, "headers": []}, receive, send))
        force_flush()
        return [span.attributes.get("http.target") or span.name for span in exporter.get_finished_spans()]

    paths = ("/admin/faults", "/v1/chat/completions", "/internal/cache/flush")
    monkeypatch.setenv("OTEL_PYTHON_EXCLUDED_URLS", "cache/flush")
    monkeypatch.setenv("OTEL_PYTHON_FASTAPI_EXCLUDED_URLS", "^/admin/,cache/flush")
    assert len(traced(paths)) == 1
    monkeypatch.delenv("OTEL_PYTHON_FASTAPI_EXCLUDED_URLS")
    assert len(traced(paths)) == 2  # the generic variable only
    monkeypatch.delenv("OTEL_PYTHON_EXCLUDED_URLS")
    assert len(traced(paths)) == 3
