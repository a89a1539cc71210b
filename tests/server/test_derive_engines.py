"""Engine request spans (``server/engine_sources.py``) on rows in memory: SGLang's and TGI's
traces give their measures, and what a trace lacks stays ``None`` with its reason. The end-to-end tests over OTLP/HTTP are
``tests/interop/test_engine_spans.py``."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

from inferpath.server.derive import DerivationCounts, assemble_request
from inferpath.server.engine_sources import SGLANG, TGI, VLLM, engine_source
from inferpath.storage.rows import SpanRow, datetime_from_unix_ns

MS = 1_000_000
T0_NS = 1_780_000_000_000_000_000
TRACE = "0000000000000000" + "5e" * 8
UPDATED = datetime(2026, 6, 1, tzinfo=timezone.utc)


def span(
    span_id: str,
    parent: str,
    name: str,
    start_ms: float,
    duration_ms: float,
    *,
    scope: str = "",
    service: str = "engine",
    **attributes: object,
) -> SpanRow:
    return SpanRow(
        timestamp=datetime_from_unix_ns(T0_NS + round(start_ms * MS)),
        trace_id=TRACE,
        span_id=span_id.ljust(16, "0"),
        parent_span_id=parent.ljust(16, "0") if parent else "",
        span_name=name,
        span_kind="Internal",
        service_name=service,
        resource_attributes={"service.name": service},
        scope_name=scope,
        span_attributes={k.replace("__", "."): str(v) for k, v in attributes.items()},
        duration_ns=round(duration_ms * MS),
        status_code="Unset",
    )


def sglang_trace(*, with_stages: bool = True) -> list[SpanRow]:
    scope = "sglang server"
    root = span(
        "a1",
        "",
        " Req 8c7d2f0e",
        0,
        91.5,
        scope=scope,
        service="sglang",
        rid="8c7d2f0e",
        module="sglang::request",
        **{
            "gen_ai.latency.time_to_first_token": 0.051,
            "gen_ai.latency.e2e": 0.0915,
            "gen_ai.latency.time_in_model_decode": 0.0405,
            "gen_ai.latency.time_in_model_prefill": 0.0492,
            "gen_ai.usage.prompt_tokens": 12,
            "gen_ai.usage.completion_tokens": 5,
            "gen_ai.response.model": "Qwen/Qwen2.5-0.5B-Instruct",
        },
    )
    if not with_stages:
        return [root]
    return [
        root,
        span("b1", "a1", "Tokenizer(host:5f3a9c1e | pid:4242)", 0, 1.8, scope=scope, thread_label="Tokenizer"),
        span("b2", "b1", "tokenize", 0, 1.5, scope=scope),
        span("c1", "a1", "Scheduler [TP 0] (host:5f3a9c1e | pid:4343)", 2, 88.6, scope=scope, tp_rank=0),
        span("c2", "c1", "request_process", 2, 0.2, scope=scope),
        span("c3", "c1", "prefill_waiting", 2.2, 30, scope=scope),
        span("c4", "c1", "prefill_forward", 32.2, 18, scope=scope),
        span("c5", "c4", "chunked_prefill", 32.2, 9, scope=scope),
        span("c6", "c1", "decode_forward", 50.4, 40.2, scope=scope),
    ]


def tgi_trace(**timings: str) -> list[SpanRow]:
    timings = timings or {
        "total_time": "92ms",
        "validation_time": "2.3ms",
        "queue_time": "30.05ms",
        "inference_time": "59.65ms",
        "time_per_token": "11.93ms",
    }
    spans = [
        span(
            "a1",
            "",
            "chat_completions",
            0,
            93,
            scope="opentelemetry-otlp",
            **timings,
            parameters="GenerateParameters { max_new_tokens: Some(64) }",
            seed="Some(42)",
        ),
        span("a2", "a1", "async_stream", 0.6, 2.4),
        span("a3", "a2", "generate_stream", 0.6, 2.4),
        span("a4", "a3", "schedule", 2.9, 89.8),
        span("a5", "a4", "queued", 2.92, 30.03),
    ]
    for n, send_ms in enumerate((52.5, 62.5, 72.5, 82.5, 92.5)):
        step_ms = 32.95 if n == 0 else send_ms - 9.9
        spans.append(span(f"d{n}", "a4", "infer", step_ms, send_ms + 0.1 - step_ms))
        spans.append(span(f"e{n}", f"d{n}", "send_generation", send_ms, 0.04, generation="Generation { .. }"))
    return spans


def test_each_engine_claims_its_own_request_span() -> None:
    assert engine_source(sglang_trace()[0]) is SGLANG
    assert engine_source(tgi_trace()[0]) is TGI
    assert engine_source(span("f1", "", "llm_request", 0, 1)) is VLLM
    # SGLang's stage spans, TGI's inner spans and a TGI-named span without TGI's timings are no engine's.
    inner = sglang_trace()[1:] + tgi_trace()[1:]
    assert len(inner) == 22 and all(engine_source(s) is None for s in inner)
    assert engine_source(span("f2", "", "generate", 0, 1, parameters="{}")) is None


def test_an_sglang_trace_takes_queue_and_prefill_from_its_stage_spans() -> None:
    row = assemble_request(sglang_trace(), updated_at=UPDATED)
    assert row.ttft_source == "sglang.time_to_first_token"
    assert (row.ttft_ns, row.e2e_ns, row.decode_ns, row.itl_ns) == (51 * MS, 91_500_000, 40_500_000, 10_125_000)
    assert (row.queue_ns, row.prefill_ns, row.tokenize_ns) == (30 * MS, 18 * MS, 1_500_000)
    assert (row.input_tokens, row.output_tokens, row.model) == (12, 5, "Qwen/Qwen2.5-0.5B-Instruct")
    # Without its stage spans (--trace-modules left the scheduler out) the row has no queue and no
    # prefill rather than SGLang's time_in_model_prefill, which counts the queue as prefill.
    bare = assemble_request(sglang_trace(with_stages=False), updated_at=UPDATED)
    assert (bare.ttft_ns, bare.queue_ns, bare.prefill_ns, bare.tokenize_ns) == (51 * MS, None, None, None)


def test_a_tgi_trace_takes_ttft_from_its_first_send_generation() -> None:
    row = assemble_request(tgi_trace(), updated_at=UPDATED)
    assert row.ttft_source == "tgi.send_generation"
    assert (row.ttft_ns, row.e2e_ns, row.queue_ns, row.tokenize_ns) == (52_500_000, 92 * MS, 30_050_000, 2_300_000)
    assert (row.prefill_ns, row.decode_ns, row.output_tokens, row.itl_ns) == (19_550_000, 40 * MS, 5, 10 * MS)
    assert (row.model, row.input_tokens, row.missing_measures) == ("unknown", None, "")


def test_a_tgi_trace_without_its_timings_or_tokens_says_what_is_missing() -> None:
    # Timings that are no Rust Duration text are ignored and counted; E2E falls back to the
    # last send_generation, output tokens to their count.
    counts = DerivationCounts()
    spans = tgi_trace(total_time="92 ms", inference_time="59.65ms", time_per_token="soon")
    row = assemble_request(spans, updated_at=UPDATED, counts=counts)
    assert counts.ignored_timings_total == 2
    assert (row.ttft_ns, row.e2e_ns, row.output_tokens) == (52_500_000, 92_500_000, 5)
    # A handler span whose request never got a token back.
    no_tokens = [s for s in tgi_trace() if s.span_name != "send_generation"]
    row = assemble_request(no_tokens, updated_at=UPDATED)
    assert row.ttft_ns is None and row.decode_ns is None and row.ttft_source == ""
    assert row.missing_measures.startswith(
        "ttft: TGI's request span 'chat_completions' has no send_generation span under it"
    ), row.missing_measures


def test_an_engine_span_under_a_client_span_is_the_callee_of_a_hop() -> None:
    """A gateway's model client calls TGI (traceparent): TGI's INTERNAL handler span is the
    callee's side of the hop, so the row gets the network time, and the hop's part of TTFT is
    the client's TTFT − TGI's (from its first send_generation)."""
    stage = "inferpath.stage"
    gateway = span(
        "f0",
        "",
        "POST /v1/chat/completions",
        0,
        100,
        service="gateway",
        **{
            stage: "gateway",
            "gen_ai.response.time_to_first_chunk": 0.056,
            "http.response.status_code": 200,
            "inferpath.stream.status": "complete",
        },
    )
    gateway = replace(gateway, span_kind="Server")
    model = replace(
        span(
            "f1",
            "f0",
            "chat emulated-7b",
            1,
            97,
            service="gateway",
            **{
                stage: "model",
                "gen_ai.response.time_to_first_chunk": 0.0545,
                "inferpath.stream.status": "complete",
                "gen_ai.request.model": "emulated-7b",
            },
        ),
        span_kind="Client",
    )
    handler, *inner = tgi_trace()
    handler = replace(handler, parent_span_id=model.span_id, timestamp=datetime_from_unix_ns(T0_NS + 2 * MS))
    row = assemble_request([gateway, model, handler, *inner], updated_at=UPDATED)
    assert row.network_ns == model.duration_ns - handler.duration_ns == 4 * MS
    # TGI's TTFT from its (moved) start: the first send_generation at 52.5 ms, the handler at 2 ms.
    assert row.network_ttft_ns == 54_500_000 - 50_500_000
    assert (row.ttft_source, row.ttft_ns, row.queue_ns, row.model) == ("inferpath", 56 * MS, 30_050_000, "emulated-7b")
