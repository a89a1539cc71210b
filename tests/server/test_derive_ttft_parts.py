"""The TTFT-phase parts of the request row (``gateway_ttft_ns``, ``network_ttft_ns``): on
hand-built spans with known answers, on the recorded vLLM traces, and on the spans of a real
instrumented gateway that relays a real token stream (uvicorn on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from datetime import datetime, timezone

import httpx
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import inferpath
from inferpath.analysis.breakdown import request_breakdown
from inferpath.instrumentation import provider
from inferpath.instrumentation.clients import stream_chat_completion
from inferpath.server.derive import assemble_request
from inferpath.server.otlp import decode_trace_request
from inferpath.storage.rows import RequestRow, SpanRow, datetime_from_unix_ns

TRACE = "5bf92f3577b34da6a3ce929d0e0e4736"
T0_NS = 1_796_037_400_000_000_000
MS = 1_000_000
STAGE = "inferpath.stage"
TTFT = "gen_ai.response.time_to_first_chunk"
PHASES = ("gateway_ttft_ns", "network_ttft_ns")


def sid(label: str) -> str:
    return label.encode().hex().ljust(16, "0")


def span(span_id: str, parent: str, kind: str, start_ms: float, duration_ms: float, **attributes: object) -> SpanRow:
    return SpanRow(
        timestamp=datetime_from_unix_ns(T0_NS + round(start_ms * MS)),
        trace_id=TRACE,
        span_id=sid(span_id),
        parent_span_id=sid(parent) if parent else "",
        span_kind=kind,
        span_name=span_id,
        service_name="svc",
        span_attributes={k.replace("__", "."): str(v) for k, v in attributes.items()},
        duration_ns=round(duration_ms * MS),
    )


def without_phases(row: RequestRow) -> dict:
    """The row as it was stored before the TTFT-phase columns existed."""
    return {k: v for k, v in vars(row).items() if k not in PHASES}


def relaying_gateway_trace(engine_ttft: float | None = 0.25) -> list[SpanRow]:
    """A streamed call: the gateway's TTFT is 325 ms, then it relays tokens until 1 900 ms and
    keeps working after the model call ended (1 500 → 1 900 ms)."""
    spans = [
        span("c1", "", "Client", 0, 1950, **{TTFT: 0.34, "gen_ai.operation.name": "chat"}),
        span("g1", "c1", "Server", 10, 1900, **{STAGE: "gateway", TTFT: 0.325}),
        span("t1", "g1", "Internal", 15, 10, **{STAGE: "tokenize"}),
        span("m1", "g1", "Client", 30, 1480, **{STAGE: "model", TTFT: 0.29}),
    ]
    if engine_ttft is not None:
        spans.append(
            span(
                "e1",
                "m1",
                "Server",
                45,
                1450,
                **{
                    "gen_ai.latency.time_to_first_token": engine_ttft,
                    "gen_ai.latency.time_in_queue": 0.02,
                    "gen_ai.latency.time_in_model_prefill": 0.2,
                    "gen_ai.latency.time_in_model_decode": 1.2,
                },
            )
        )
    return spans


def test_streamed_gateway_parts_stop_at_the_first_token() -> None:
    row = assemble_request(relaying_gateway_trace())
    assert row.ttft_ns == 325 * MS
    assert row.client_ttft_ns == 340 * MS
    # The judged TTFT is the end user's: window 0..340 ms. The gateway (10..) is covered by
    # tokenize 15..25 and the model call 30.. in all but 10 ms.
    assert row.gateway_ttft_ns == 10 * MS
    # Whole call: 1 900 − (10 + 1 480) ms.
    assert row.gateway_ns == 410 * MS
    # First-token phases of the two hops: the end user's, client 340 ms − gateway 325 ms; the
    # model call's, client 290 ms − engine 250 ms.
    assert row.network_ttft_ns == (15 + 40) * MS
    assert row.network_ns == (1950 - 1900 + 1480 - 1450) * MS
    ttft = request_breakdown(vars(row), "ttft")
    assert ttft.total_ns == 340 * MS
    assert ttft.stage_ns["gateway"] == 10 * MS and ttft.stage_ns["network"] == 55 * MS
    assert ttft.stage_ns["rest"] == (340 - 10 - 10 - 20 - 200 - 55) * MS >= 0
    assert request_breakdown(without_phases(row), "ttft").stage_ns["rest"] < 0  # the reported defect
    assert request_breakdown(vars(row), "e2e") == request_breakdown(without_phases(row), "e2e")


def test_without_an_engine_span_the_gateway_part_is_clipped_to_the_ttft() -> None:
    # The tester's case: no engine span, so the model call is the gateway's last child and
    # everything the gateway did after it landed in its self time.
    trace = relaying_gateway_trace(engine_ttft=None)
    trace[3] = span("m1", "g1", "Client", 30, 200, **{STAGE: "model", TTFT: 0.15})
    row = assemble_request(trace)
    assert row.gateway_ns == (1900 - 10 - 200) * MS > row.ttft_ns
    # Clipped to the end user's TTFT window 0..340 ms: the gateway's 10..340 less tokenize and the model call.
    assert row.gateway_ttft_ns == (340 - 10 - 10 - 200) * MS
    # The only hop is the end user's: 340 ms − the gateway's 325 to the first token.
    assert (row.network_ttft_ns, row.network_ns) == (15 * MS, 50 * MS)
    assert request_breakdown(vars(row), "ttft").stage_ns["rest"] >= 0


def test_without_a_client_ttft_the_end_users_hop_lies_outside_the_window() -> None:
    trace = relaying_gateway_trace()
    del trace[0].span_attributes[TTFT]
    row = assemble_request(trace)
    assert row.client_ttft_ns is None and row.ttft_ns == 325 * MS
    # Window 10..335 ms, the gateway's: the end user's hop encloses it and adds nothing.
    assert row.gateway_ttft_ns == 10 * MS
    assert row.network_ttft_ns == 40 * MS
    assert request_breakdown(vars(row), "ttft").stage_ns["rest"] == (325 - 10 - 10 - 20 - 200 - 40) * MS


def test_hop_without_ttft_on_both_sides_is_clipped_by_interval() -> None:
    trace = relaying_gateway_trace()
    trace[4].span_attributes.pop("gen_ai.latency.time_to_first_token")
    trace[4].span_attributes["gen_ai.latency.e2e"] = "1.45"
    row = assemble_request(trace)
    # Window 0..340 (the end user's): its hop 340 − 325 ms, and by interval the model
    # client 30..340 (310 ms) − engine 45..340 (295 ms).
    assert row.network_ttft_ns == (15 + 15) * MS


def test_no_ttft_means_no_phase_parts() -> None:
    trace = relaying_gateway_trace()
    del trace[0].span_attributes[TTFT]
    del trace[1].span_attributes[TTFT]
    row = assemble_request(trace)
    assert row.ttft_ns is None and row.gateway_ttft_ns is None and row.network_ttft_ns is None
    assert row.gateway_ns is not None and row.network_ns is not None


def test_the_hop_into_the_engine_keeps_its_trip_out() -> None:
    # The model call starts at 30 ms, the engine's span at 45 ms: 15 ms before the engine saw it.
    assert assemble_request(relaying_gateway_trace()).engine_send_ns == 15 * MS
    # A failed attempt at 35 ms, retried at 60 ms: the trip out is to the first attempt (the
    # retry is no stage), as the hop's own time is.
    trace = relaying_gateway_trace()
    engine_attributes = dict(trace[4].span_attributes)
    trace[4] = span("e1", "m1", "Server", 60, 1435, **{k.replace(".", "__"): v for k, v in engine_attributes.items()})
    trace.append(span("e0", "m1", "Server", 35, 5, http__response__status_code=503))
    trace[-1].status_code = "Error"
    assert assemble_request(trace).engine_send_ns == 5 * MS
    # Without an engine span, or with an engine span no CLIENT span called: no such hop.
    assert assemble_request(relaying_gateway_trace(engine_ttft=None)).engine_send_ns is None
    alone = relaying_gateway_trace()[4]
    alone.parent_span_id = ""
    assert assemble_request([alone]).engine_send_ns is None


def test_recorded_vllm_traces_keep_parts_within_ttft(vllm_spans_by_trace: dict[str, list[SpanRow]]) -> None:
    by_trace = vllm_spans_by_trace
    rows = [r for r in (assemble_request(spans) for spans in by_trace.values()) if r is not None]
    assert len(rows) >= 100
    for row in rows:
        # Engine-only traces: no gateway span and no hop inside the trace.
        assert row.ttft_ns is not None and row.gateway_ttft_ns is None and row.network_ttft_ns is None
        ttft = request_breakdown(vars(row), "ttft")
        assert ttft.stage_ns["rest"] >= 0  # queue + prefill fit inside vLLM's own TTFT


def _sse(data: dict | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def _chunk(content: str) -> dict:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }


def model_server() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(body: dict) -> StreamingResponse:
        async def events():
            yield _sse({**_chunk(""), "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
            await asyncio.sleep(0.08)  # prefill
            for i in range(8):
                yield _sse(_chunk(f"t{i}"))
                await asyncio.sleep(0.03)
            yield _sse("[DONE]")

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def relaying_gateway(model_url: str) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(body: dict) -> StreamingResponse:
        async def events():
            async with httpx.AsyncClient(timeout=10) as client:
                async for chunk in stream_chat_completion(
                    client, f"{model_url}/v1/chat/completions", {**body, "stream": True}, stage="model"
                ):
                    yield _sse(chunk)
            await asyncio.sleep(0.8)  # work after the model call (e.g. a moderation pass)
            yield _sse("[DONE]")

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def test_real_relaying_gateway_spans_give_parts_within_ttft(serve_app) -> None:
    exporter = InMemorySpanExporter()
    provider.configure("ttft-parts-test", span_exporter=exporter, schedule_delay_seconds=0.05)
    engine, gateway = model_server(), None
    try:
        # Instrumented too, so its SERVER span is the callee side of the model hop.
        inferpath.instrument(engine, service_name="ttft-parts-test", span_exporter=exporter)
        with serve_app(engine) as model_url:
            gateway = relaying_gateway(model_url)
            inferpath.instrument(gateway, service_name="ttft-parts-test", span_exporter=exporter)
            with serve_app(gateway) as gateway_url:
                for _ in range(2):
                    with httpx.stream(
                        "POST",
                        f"{gateway_url}/v1/chat/completions",
                        timeout=10,
                        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
                    ) as response:
                        body = b"".join(response.iter_bytes())
                    assert response.status_code == 200 and body.count(b"t7") == 1
                finished = []
                for _ in range(100):  # spans end on the servers' threads after the body
                    provider.force_flush(2.0)
                    finished = list(exporter.get_finished_spans())
                    if len(finished) >= 6:
                        break
                    asyncio.run(asyncio.sleep(0.05))
    finally:
        inferpath.uninstrument(engine)
        if gateway is not None:
            inferpath.uninstrument(gateway)
        provider.shutdown(2.0)
    request = encode_spans(finished).SerializeToString()
    spans = decode_trace_request(request, content_type="application/x-protobuf", content_encoding=None).spans
    by_trace: dict[str, list[SpanRow]] = defaultdict(list)
    for s in spans:
        by_trace[s.trace_id].append(s)
    assert len(by_trace) == 2
    for trace in by_trace.values():
        row = assemble_request(trace, updated_at=datetime.now(timezone.utc))
        assert row is not None and row.ttft_ns is not None, [(s.span_kind, s.span_attributes) for s in trace]
        assert 0 <= row.gateway_ttft_ns <= row.gateway_ns and row.gateway_ttft_ns <= row.ttft_ns
        # Not bounded by network_ns: the callee's span of a stream may end after the caller's,
        # which hides the hop from the whole-call difference but not from the first-token one.
        assert 0 < row.network_ttft_ns <= row.ttft_ns
        # The 800 ms after the model call are the gateway's, and after the first token.
        assert row.gateway_ns >= 750 * MS and row.gateway_ns > row.ttft_ns
        ttft = request_breakdown(vars(row), "ttft")
        assert ttft.stage_ns["rest"] >= 0
        assert request_breakdown(without_phases(row), "ttft").stage_ns["rest"] < 0
        assert request_breakdown(vars(row), "e2e") == request_breakdown(without_phases(row), "e2e")
