"""TTFT, ITL and tokens from the spans of other instrumentations (server/sources.py,
docs/interop.md): each source on hand-built spans shaped as the real packages send them
(attribute names and events as recorded from traceloop-sdk 0.62, openinference 0.1.66,
langfuse 5.2, opentelemetry-instrumentation-openai-v2 2.4b0), the precedence and its
conflicts, malformed events, and the reasons a measure is missing."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

from inferpath.server.derive import assemble_request
from inferpath.server.sources import TTFT_SOURCES, DerivationCounts, span_ttft
from inferpath.storage.rows import SpanRow, datetime_from_unix_ns

TRACE = "6bf92f3577b34da6a3ce929d0e0e4736"
T0_NS = 1_796_037_400_000_000_000
MS = 1_000_000
UPDATED = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
CHUNK = "gen_ai.content.completion.chunk"


def sid(label: str) -> str:
    return label.encode().hex().ljust(16, "0")


def at(offset_ms: float) -> datetime:
    return datetime_from_unix_ns(T0_NS + round(offset_ms * MS))


def span(
    span_id: str,
    kind: str,
    name: str,
    duration_ms: float,
    *,
    parent: str = "",
    scope: str = "",
    events: list[tuple[datetime, str]] = (),
    start_ms: float = 0,
    **attributes: object,
) -> SpanRow:
    return SpanRow(
        timestamp=at(start_ms),
        trace_id=TRACE,
        span_id=sid(span_id),
        parent_span_id=sid(parent) if parent else "",
        span_name=name,
        span_kind=kind,
        service_name="app",
        resource_attributes={"service.name": "app"},
        scope_name=scope,
        span_attributes={k: str(v) for k, v in attributes.items()},
        events=[(t, n, {}) for t, n in events],
        duration_ns=round(duration_ms * MS),
    )


def openllmetry(chunk_ms=(16, 59, 69, 79, 80), duration_ms=82.0, **extra) -> SpanRow:
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "m",
        "gen_ai.is_streaming": "true",
        "gen_ai.response.model": "emulated-7b",
        "gen_ai.usage.input_tokens": 7,
        "gen_ai.usage.output_tokens": 2,
        **extra,
    }
    return span(
        "ol",
        "Client",
        "openai.chat",
        duration_ms,
        scope="opentelemetry.instrumentation.openai.v1",
        events=[(at(ms), CHUNK) for ms in chunk_ms],
        **attributes,
    )


def openinference(first_ms=15.0) -> SpanRow:
    return span(
        "oi",
        "Internal",
        "ChatCompletion",
        83.0,
        scope="openinference.instrumentation.openai",
        events=[(at(first_ms), "First Token Stream Event")],
        **{
            "openinference.span.kind": "LLM",
            "llm.system": "openai",
            "llm.model_name": "emulated-7b",
            "llm.token_count.prompt": 7,
            "llm.token_count.completion": 2,
            "llm.token_count.total": 9,
        },
    )


def langfuse(completion_start: str | None = None) -> SpanRow:
    stamp = (
        completion_start
        if completion_start is not None
        else ('"' + (at(57.5)).isoformat().replace("+00:00", "Z") + '"')
    )
    return span(
        "lf",
        "Internal",
        "OpenAI-generation",
        80.0,
        scope="langfuse-sdk",
        **{
            "langfuse.observation.type": "generation",
            "langfuse.observation.model.name": "emulated-7b",
            "langfuse.observation.completion_start_time": stamp,
            "langfuse.observation.usage_details": '{"completion_tokens": 2, "prompt_tokens": 7, '
            '"total_tokens": 9, "completion_tokens_details": null}',
        },
    )


def openai_v2() -> SpanRow:
    return span(
        "o2",
        "Client",
        "chat m",
        81.0,
        scope="opentelemetry.util.genai.handler",
        **{
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "m",
            "gen_ai.provider.name": "openai",
            "gen_ai.response.model": "emulated-7b",
            "gen_ai.usage.input_tokens": 7,
            "gen_ai.usage.output_tokens": 2,
        },
    )


def test_openllmetry_chunk_events_give_ttft_at_the_first_content_chunk() -> None:
    row = assemble_request([openllmetry()], updated_at=UPDATED)
    assert row is not None
    assert (row.client_ttft_ns, row.client_e2e_ns, row.ttft_source) == (59 * MS, 82 * MS, "openllmetry.chunk_events")
    assert (row.input_tokens, row.output_tokens, row.model, row.model_version) == (7, 2, "m", "emulated-7b")
    assert row.itl_ns == 23 * MS  # (E2E − TTFT) / (2 − 1), AIPerf
    assert row.missing_measures == "" and row.ttft_ns is None and row.status == "ok"


def test_openinference_and_langfuse_spans_are_model_calls_with_first_chunk_times() -> None:
    row = assemble_request([openinference()], updated_at=UPDATED)
    assert (row.client_ttft_ns, row.client_e2e_ns, row.ttft_source) == (
        15 * MS,
        83 * MS,
        "openinference.first_token_event",
    )
    assert (row.input_tokens, row.output_tokens, row.model) == (7, 2, "emulated-7b")
    row = assemble_request([langfuse()], updated_at=UPDATED)
    assert (row.client_ttft_ns, row.client_e2e_ns, row.ttft_source) == (
        57_500_000,
        80 * MS,
        "langfuse.completion_start_time",
    )
    assert (row.input_tokens, row.output_tokens, row.model, row.missing_measures) == (7, 2, "emulated-7b", "")


def test_an_openinference_call_inside_the_apps_own_span_is_found() -> None:
    app = span("ap", "Server", "POST /ask", 100.0)
    call = replace(openinference(), parent_span_id=sid("ap"))
    row = assemble_request([app, call], updated_at=UPDATED)
    assert (row.client_ttft_ns, row.client_e2e_ns, row.span_count) == (15 * MS, 83 * MS, 2)


def test_a_source_without_per_chunk_timing_says_why_ttft_is_missing() -> None:
    row = assemble_request([openai_v2()], updated_at=UPDATED)
    assert (row.client_ttft_ns, row.ttft_ns, row.client_e2e_ns, row.output_tokens) == (None, None, 81 * MS, 2)
    assert row.ttft_source == ""
    assert row.missing_measures == (
        "ttft: opentelemetry-instrumentation-openai-v2 (util-genai) records no per-chunk timing; add "
        "inferpath.instrument() (its openai/httpx integration) or enable chunk events (OpenLLMetry); itl: needs TTFT"
    )
    unstreamed = openllmetry(chunk_ms=(), **{"gen_ai.is_streaming": "false"})
    assert assemble_request([unstreamed], updated_at=UPDATED).missing_measures.startswith(
        "ttft: not a streamed call (OpenLLMetry (traceloop-sdk))"
    )
    no_usage = span("x", "Client", "chat m", 50.0, **{"gen_ai.request.model": "m"})
    assert "output_tokens: no span reports usage" in assemble_request([no_usage], updated_at=UPDATED).missing_measures


def test_semconv_time_to_first_chunk_is_a_first_chunk_source_and_inferpaths_own_comes_first() -> None:
    semconv = replace(
        openai_v2(), span_attributes={**openai_v2().span_attributes, "gen_ai.response.time_to_first_chunk": "0.04"}
    )
    assert span_ttft(semconv).source == "genai.time_to_first_chunk"
    ours = replace(semconv, span_attributes={**semconv.span_attributes, "inferpath.stream.status": "complete"})
    assert (span_ttft(ours).source, span_ttft(ours).ttft_ns) == ("inferpath", 40 * MS)
    assert [s.name for s in TTFT_SOURCES][:3] == ["inferpath", "engine", "openllmetry.chunk_events"]


def test_conflicting_sources_on_one_span_keep_the_first_and_are_counted() -> None:
    both = openllmetry(**{"gen_ai.response.time_to_first_chunk": "0.0161"})  # ≠ 59 ms of the events
    counts = DerivationCounts()
    row = assemble_request([both], updated_at=UPDATED, counts=counts)
    assert (row.client_ttft_ns, row.ttft_source, counts.ttft_conflicts_total) == (
        59 * MS,
        "openllmetry.chunk_events",
        1,
    )
    agreeing = openllmetry(**{"gen_ai.response.time_to_first_chunk": "0.0595"})  # within 1 ms
    assemble_request([agreeing], updated_at=UPDATED, counts=counts)
    assert counts.ttft_conflicts_total == 1


def test_malformed_events_are_ignored_and_counted_and_the_valid_ones_kept() -> None:
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)  # an OTLP event without a time
    chunks = [(epoch, CHUNK), (at(-5), CHUNK), (at(16), CHUNK), (at(59), CHUNK), (at(500), CHUNK), (at(79), CHUNK)]
    bad = replace(openllmetry(), events=[(t, n, {}) for t, n in chunks])
    counts = DerivationCounts()
    row = assemble_request([bad], updated_at=UPDATED, counts=counts)
    assert (row.client_ttft_ns, counts.ignored_timings_total) == (59 * MS, 3)
    counts = DerivationCounts()
    row = assemble_request([langfuse(completion_start='"not a time"')], updated_at=UPDATED, counts=counts)
    assert (row.client_ttft_ns, row.client_e2e_ns, row.output_tokens, counts.ignored_timings_total) == (
        None,
        80 * MS,
        2,
        1,
    )
    assert row.missing_measures.startswith("ttft: Langfuse records no per-chunk timing")
    early = langfuse(completion_start=(at(-1)).isoformat())
    assert assemble_request([early], counts=counts).client_ttft_ns is None and counts.ignored_timings_total == 2
    nonsense = replace(
        openai_v2(), span_attributes={**openai_v2().span_attributes, "gen_ai.response.time_to_first_chunk": "soon"}
    )
    assert span_ttft(nonsense, counts) is None and counts.ignored_timings_total == 3


def test_only_the_role_chunk_is_not_a_first_token() -> None:
    row = assemble_request([openllmetry(chunk_ms=(16,), **{"gen_ai.usage.output_tokens": 0})], updated_at=UPDATED)
    assert row.client_ttft_ns is None
    assert row.missing_measures.startswith("ttft: OpenLLMetry (traceloop-sdk) recorded fewer than 2 usable chunk")
    assert "itl: fewer than 2 output tokens" in row.missing_measures


def test_engine_and_inferpath_rows_name_their_source() -> None:
    engine = span(
        "e1",
        "Server",
        "llm_request",
        880.0,
        **{
            "gen_ai.latency.time_to_first_token": 0.06,
            "gen_ai.latency.e2e": 0.88,
            "gen_ai.latency.time_in_model_decode": 0.8,
            "gen_ai.usage.completion_tokens": 11,
        },
    )
    row = assemble_request([engine], updated_at=UPDATED)
    assert (row.ttft_ns, row.ttft_source, row.missing_measures) == (60 * MS, "engine", "")
    client = span(
        "c1",
        "Client",
        "chat m",
        1000.0,
        **{
            "gen_ai.request.model": "m",
            "gen_ai.response.time_to_first_chunk": 0.2,
            "inferpath.itl_seconds": 0.07,
            "inferpath.stream.status": "complete",
            "gen_ai.usage.output_tokens": 11,
        },
    )
    row = assemble_request([client, replace(engine, parent_span_id=client.span_id)], updated_at=UPDATED)
    assert (row.client_ttft_ns, row.ttft_ns, row.ttft_source, row.itl_ns) == (200 * MS, 60 * MS, "inferpath", 80 * MS)
    incomplete = replace(
        client,
        span_attributes={
            "gen_ai.request.model": "m",
            "inferpath.stream.status": "incomplete",
            "inferpath.stream.incomplete_reason": "no_visible_token",
        },
    )
    assert assemble_request([incomplete], updated_at=UPDATED).missing_measures.startswith(
        "ttft: the stream ended without a visible token (no_visible_token)"
    )


def test_a_client_only_row_carries_client_measures_for_the_diagnosis() -> None:
    """Rows of another instrumentation alone (no gateway or engine span) keep the client's
    TTFT, E2E, ITL and tokens: what a diagnosis of client-only windows reads."""
    row = assemble_request([openllmetry()], updated_at=UPDATED)
    assert None not in (row.client_ttft_ns, row.client_e2e_ns, row.itl_ns, row.input_tokens, row.output_tokens)
    assert (row.ttft_ns, row.e2e_ns, row.queue_ns) == (None, None, None)
    assert row.timestamp == at(0) and row.trace_id == TRACE


def test_an_otlp_json_event_time_that_is_no_number_costs_only_that_time() -> None:
    """The receiver keeps the span (and the export's other spans) of an OTLP/JSON event
    whose time is not a whole number, with a warning; derivation then ignores that event."""
    import json

    from inferpath.server.otlp import decode_trace_request

    def export(event_time: object) -> bytes:
        start = T0_NS
        return json.dumps(
            {
                "resourceSpans": [
                    {
                        "resource": {"attributes": []},
                        "scopeSpans": [
                            {
                                "spans": [
                                    {
                                        "traceId": TRACE,
                                        "spanId": "00f067aa0ba902b7",
                                        "name": "openai.chat",
                                        "kind": 3,
                                        "startTimeUnixNano": str(start),
                                        "endTimeUnixNano": str(start + 80 * MS),
                                        "attributes": [{"key": "gen_ai.request.model", "value": {"stringValue": "m"}}],
                                        "events": [
                                            {"timeUnixNano": event_time, "name": CHUNK},
                                            {"timeUnixNano": str(start + 16 * MS), "name": CHUNK},
                                            {"timeUnixNano": str(start + 59 * MS), "name": CHUNK},
                                        ],
                                    }
                                ]
                            }
                        ],
                    }
                ]
            }
        ).encode()

    for bad in ("abc", "", 1.5, True):
        decoded = decode_trace_request(export(bad), content_type="application/json", content_encoding=None)
        assert (len(decoded.spans), decoded.rejected_spans, decoded.warned_spans) == (1, 0, 1)
        assert "events[0].timeUnixNano" in decoded.error_message
        counts = DerivationCounts()
        row = assemble_request(decoded.spans, updated_at=UPDATED, counts=counts)
        assert (row.client_ttft_ns, counts.ignored_timings_total) == (59 * MS, 1)
    fine = decode_trace_request(export(str(T0_NS + 5 * MS)), content_type="application/json", content_encoding=None)
    assert (fine.warned_spans, assemble_request(fine.spans).client_ttft_ns) == (0, 16 * MS)


def test_a_genai_client_span_inside_the_apps_own_span_is_the_model_call() -> None:
    app = span("ap", "Internal", "handle_question", 100.0)
    call = replace(openllmetry(), parent_span_id=sid("ap"))
    row = assemble_request([app, call], updated_at=UPDATED)
    assert (row.client_ttft_ns, row.client_e2e_ns, row.ttft_source) == (59 * MS, 82 * MS, "openllmetry.chunk_events")
    # Behind an inferpath gateway the end user's call is unknown: the model call is not it.
    gateway = span("gw", "Server", "POST /ask", 100.0, **{"inferpath.stage": "gateway"})
    inner = replace(openinference(), parent_span_id=sid("gw"))
    assert assemble_request([gateway, inner], updated_at=UPDATED).client_ttft_ns is None


def test_a_request_that_failed_at_the_gateway_says_so_where_ttft_is_missing() -> None:
    ok = span("gw", "Server", "POST /v1/chat/completions", 12.0, **{"inferpath.stage": "gateway"})
    failed = replace(
        ok, status_code="Error", span_attributes={**ok.span_attributes, "http.response.status_code": "503"}
    )
    assert assemble_request([ok]).missing_measures.startswith("ttft: the gateway's response was not an OpenAI-style")
    assert assemble_request([failed]).missing_measures.startswith(
        "ttft: the request failed at the gateway (HTTP 503) before a first token"
    )
