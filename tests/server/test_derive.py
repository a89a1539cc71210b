"""The request-row derivations of docs/telemetry-contract.md on hand-built and recorded spans."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from inferpath.server.assembler import assemble_request, seconds_to_ns, union_ns
from inferpath.storage.rows import SpanRow, datetime_from_unix_ns

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
T0_NS = 1_796_037_400_000_000_000
MS = 1_000_000
UPDATED = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def sid(label: str) -> str:
    """A readable label ("g1") as a valid 16-hex span id."""
    return label.encode().hex().ljust(16, "0")


def span(
    span_id: str,
    parent: str,
    kind: str,
    name: str,
    start_ms: float,
    duration_ms: float,
    service: str = "demo-gateway",
    resource: dict | None = None,
    status: str = "Unset",
    **attributes: object,
) -> SpanRow:
    return SpanRow(
        timestamp=datetime_from_unix_ns(T0_NS + round(start_ms * MS)),
        trace_id=TRACE,
        span_id=sid(span_id),
        parent_span_id=sid(parent) if parent else "",
        span_name=name,
        span_kind=kind,
        service_name=service,
        resource_attributes={"service.name": service, **(resource or {})},
        span_attributes={k.replace("__", "."): str(v) for k, v in attributes.items()},
        duration_ns=round(duration_ms * MS),
        status_code=status,
    )


def full_trace() -> list[SpanRow]:
    """client → gateway (tokenize, 2 overlapping retrievals, model client → engine, postprocess)."""
    stage = "inferpath.stage"
    return [
        span(
            "c1",
            "",
            "Client",
            "chat tiny",
            0,
            1000,
            service="demo-client",
            **{
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "tiny",
                "gen_ai.response.time_to_first_chunk": 0.2,
                "gen_ai.usage.output_tokens": 11,
            },
        ),
        span(
            "g1",
            "c1",
            "Server",
            "POST /v1/chat/completions",
            10,
            970,
            resource={"inferpath.endpoint_class": "interactive"},
            **{
                stage: "gateway",
                "gen_ai.response.time_to_first_chunk": 0.18,
                "inferpath.itl_seconds": 0.05,
                "http.response.status_code": 200,
                "inferpath.endpoint": "/v1/chat/completions",
                "inferpath.stream.status": "complete",
            },
        ),
        span("t1", "g1", "Internal", "tokenize", 20, 5, **{stage: "tokenize", "gen_ai.usage.input_tokens": 42}),
        span("r1", "g1", "Internal", "retrieval", 25, 30, **{stage: "retrieval"}),
        span("r2", "g1", "Internal", "retrieval", 40, 30, **{stage: "retrieval"}),
        span("m1", "g1", "Client", "chat tiny", 60, 900, **{stage: "model", "gen_ai.request.model": "tiny"}),
        span(
            "e1",
            "m1",
            "Server",
            "llm_request",
            70,
            880,
            service="demo-engine",
            resource={"service.instance.id": "engine-1"},
            **{
                "gen_ai.latency.time_in_queue": 0.01,
                "gen_ai.latency.time_in_model_prefill": 0.05,
                "gen_ai.latency.time_in_model_decode": 0.8,
                "gen_ai.latency.time_to_first_token": 0.06,
                "gen_ai.latency.e2e": 0.88,
                "gen_ai.usage.prompt_tokens": 42,
                "gen_ai.usage.completion_tokens": 11,
                "gen_ai.response.model": "tiny-v2",
            },
        ),
        span("p1", "g1", "Internal", "postprocess", 960, 10, **{stage: "postprocess"}),
    ]


def test_full_path_gives_every_measure() -> None:
    row = assemble_request(full_trace(), updated_at=UPDATED)
    assert row is not None
    assert row.trace_id == TRACE and row.timestamp == datetime_from_unix_ns(T0_NS)
    assert (row.client_ttft_ns, row.client_e2e_ns) == (200 * MS, 1000 * MS)
    assert (row.ttft_ns, row.e2e_ns, row.itl_ns) == (180 * MS, 970 * MS, 50 * MS)
    assert (row.tokenize_ns, row.retrieval_ns, row.postprocess_ns) == (5 * MS, 45 * MS, 10 * MS)
    assert (row.queue_ns, row.prefill_ns, row.decode_ns) == (10 * MS, 50 * MS, 800 * MS)
    assert row.model_ns == 900 * MS
    # hops: client 1000 − gateway 970, model client 900 − engine 880
    assert row.network_ns == 50 * MS
    # gateway 10..980 minus the union of its descendants 20..970
    assert row.gateway_ns == 20 * MS
    assert (row.status, row.http_status_code) == ("ok", 200)
    assert (row.endpoint, row.endpoint_class, row.service_name) == (
        "/v1/chat/completions",
        "interactive",
        "demo-gateway",
    )
    assert (row.model, row.model_version, row.replica) == ("tiny", "tiny-v2", "engine-1")
    assert (row.input_tokens, row.output_tokens, row.span_count) == (42, 11, 8)
    assert row.updated_at == UPDATED


def test_order_and_duplicates_do_not_change_the_row() -> None:
    spans = full_trace()
    shuffled = spans + [replace(s) for s in spans[:4]]
    random.Random(7).shuffle(shuffled)
    assert assemble_request(shuffled, updated_at=UPDATED) == assemble_request(spans, updated_at=UPDATED)


def test_engine_span_alone_gives_a_row_from_its_own_latencies() -> None:
    engine = full_trace()[6]
    row = assemble_request([replace(engine, parent_span_id="")], updated_at=UPDATED)
    assert row is not None
    assert (row.ttft_ns, row.e2e_ns) == (60 * MS, 880 * MS)
    assert (row.queue_ns, row.prefill_ns, row.decode_ns) == (10 * MS, 50 * MS, 800 * MS)
    assert row.itl_ns == 80 * MS  # decode / (completion tokens − 1) = 0.8 s / 10
    assert row.client_ttft_ns is None and row.gateway_ns is None and row.network_ns is None
    assert (row.input_tokens, row.output_tokens, row.service_name) == (42, 11, "demo-engine")
    # The model asked for: the engine's own gen_ai.request.model when no client span names
    # it, else the model it answered with.
    assert (row.model, row.model_version) == ("tiny-v2", "tiny-v2")
    asked = replace(
        engine, parent_span_id="", span_attributes={**engine.span_attributes, "gen_ai.request.model": "tiny"}
    )
    row = assemble_request([asked], updated_at=UPDATED)
    assert row is not None and (row.model, row.model_version) == ("tiny", "tiny-v2")


def test_stage_spans_stand_in_for_a_missing_engine_span() -> None:
    spans = [s for s in full_trace() if s.span_name != "llm_request"] + [
        span("q1", "m1", "Internal", "queue", 70, 10, **{"inferpath.stage": "queue"}),
        span("f1", "m1", "Internal", "prefill", 80, 50, **{"inferpath.stage": "prefill"}),
        span("d1", "m1", "Internal", "decode", 130, 400, **{"inferpath.stage": "decode"}),
        span("d2", "m1", "Internal", "decode", 530, 400, **{"inferpath.stage": "decode"}),
    ]
    row = assemble_request(spans, updated_at=UPDATED)
    assert (row.queue_ns, row.prefill_ns, row.decode_ns) == (10 * MS, 50 * MS, 800 * MS)
    assert row.network_ns == 30 * MS  # only the client → gateway hop is left
    assert row.replica == "" and row.model_version == ""


@pytest.mark.parametrize(
    ("index", "change", "status"),
    [
        (1, {"http.response.status_code": "503"}, "error"),
        (1, {"inferpath.stream.status": "incomplete"}, "incomplete"),
        (0, {"inferpath.stream.status": "incomplete"}, "incomplete"),
    ],
)
def test_status_follows_http_code_and_stream_state(index: int, change: dict, status: str) -> None:
    spans = full_trace()
    spans[index] = replace(spans[index], span_attributes={**spans[index].span_attributes, **change})
    assert assemble_request(spans).status == status


def test_error_status_of_the_engine_span_marks_the_request() -> None:
    spans = full_trace()
    spans[6] = replace(spans[6], status_code="Error")
    row = assemble_request(spans)
    assert row.status == "error" and row.http_status_code == 200


def test_without_gateway_ttft_comes_from_the_engine_and_the_client_root_is_kept() -> None:
    spans = [s for s in full_trace() if s.span_id in (sid("c1"), sid("e1"))]
    spans[1] = replace(spans[1], parent_span_id=spans[0].span_id)
    row = assemble_request(spans)
    assert (row.client_ttft_ns, row.ttft_ns) == (200 * MS, 60 * MS)
    assert row.network_ns == 120 * MS  # client 1000 ms − engine 880 ms
    assert row.service_name == "demo-client"


def test_traces_without_request_spans_give_no_row() -> None:
    startup = [
        span("s1", "", "Internal", "Overall Loading", 0, 5000, service="vllm"),
        span("s2", "s1", "Internal", "Load weights", 10, 100, service="vllm"),
    ]
    assert assemble_request(startup) is None
    assert assemble_request([]) is None


def test_spans_of_two_traces_are_refused() -> None:
    spans = full_trace()
    spans[0] = replace(spans[0], trace_id="1" * 32)
    with pytest.raises(ValueError, match="one trace"):
        assemble_request(spans)


@pytest.mark.parametrize(
    ("seconds", "ns"),
    [
        ("0.0000000015", 2),
        (0.0080730915069580078, 8_073_092),
        ("1", 1_000_000_000),
        (0, 0),
        ("abc", None),
        (-1.0, None),
        ("nan", None),
        ("inf", None),
        (None, None),
        ("", None),
    ],
)
def test_seconds_to_ns_rounds_to_nearest_and_refuses_nonsense(seconds, ns) -> None:
    assert seconds_to_ns(seconds) == ns


def test_union_counts_overlaps_once() -> None:
    assert union_ns([(0, 10), (5, 15), (20, 25), (30, 30)]) == 20
    assert union_ns([]) == 0


def test_recorded_vllm_traces_give_rows_with_engine_latencies(vllm_spans_by_trace: dict[str, list[SpanRow]]) -> None:
    by_trace = vllm_spans_by_trace
    with_engine = {t for t, spans in by_trace.items() if any(s.span_name == "llm_request" for s in spans)}
    assert len(with_engine) >= 100
    for trace_id, spans in by_trace.items():
        row = assemble_request(spans)
        if trace_id not in with_engine:
            assert row is None  # start-up spans only
            continue
        engine = min((s for s in spans if s.span_name == "llm_request"), key=lambda s: s.start_ns)
        attrs = engine.span_attributes
        assert row.queue_ns == seconds_to_ns(attrs["gen_ai.latency.time_in_queue"])
        assert row.prefill_ns == seconds_to_ns(attrs["gen_ai.latency.time_in_model_prefill"])
        assert row.decode_ns == seconds_to_ns(attrs["gen_ai.latency.time_in_model_decode"])
        assert row.ttft_ns == seconds_to_ns(attrs["gen_ai.latency.time_to_first_token"])
        assert row.input_tokens == int(attrs["gen_ai.usage.prompt_tokens"])
        # vLLM's own intervals fit inside its span
        assert row.queue_ns + row.prefill_ns + row.decode_ns <= engine.duration_ns
        assert row.status == "ok" and row.replica


def test_a_genai_call_or_engine_known_only_by_names_it_takes_no_value_of_gives_a_row() -> None:
    # A GenAI client call known by its prompt and system alone, and an engine span known by a
    # latency name of another engine: each is a request.
    prompt = {"gen_ai.prompt.0.content": "x" * 100, "gen_ai.system": "openai"}
    bare_client = span("c9", "", "Client", "chat", 0, 500, service="app", **prompt)
    other_engine = span(
        "e9",
        "c9",
        "Server",
        "generate",
        10,
        480,
        service="tgi",
        **{"gen_ai.latency.time_per_output_token": 0.02, "gen_ai.completion.0.content": "y" * 100},
    )
    for spans in ([bare_client], [other_engine], [bare_client, other_engine]):
        assert assemble_request(spans, updated_at=UPDATED) is not None


def test_a_request_whose_spans_name_no_model_is_labelled_unknown() -> None:
    """A gateway and an engine span without gen_ai.request/response.model (an app that does
    not say which model it called): the row's model is the documented ``unknown``, not ''."""
    stage = "inferpath.stage"
    spans = [
        span(
            "g1",
            "",
            "Server",
            "POST /v1/chat/completions",
            0,
            500,
            resource={"inferpath.endpoint_class": "interactive"},
            **{stage: "gateway", "gen_ai.response.time_to_first_chunk": 0.1, "http.response.status_code": 200},
        ),
        span(
            "e1",
            "g1",
            "Server",
            "llm_request",
            10,
            480,
            service="engine",
            **{"gen_ai.latency.time_to_first_token": 0.08, "gen_ai.latency.e2e": 0.48},
        ),
    ]
    row = assemble_request(spans, updated_at=UPDATED)
    assert row.model == "unknown"
    named = [replace(spans[0], span_attributes={**spans[0].span_attributes, "gen_ai.request.model": "tiny"}), spans[1]]
    assert assemble_request(named, updated_at=UPDATED).model == "tiny"


def test_a_call_retried_under_one_client_span_is_judged_by_its_last_attempt() -> None:
    """A caller that retried (a model server still loading: two attempts answered 503) under
    one CLIENT span: the request succeeded, its gateway is the attempt that answered, and the
    4 s from the first attempt to the last are neither the gateway's nor the wire's."""
    spans = full_trace()
    client = replace(
        spans[0],
        duration_ns=5000 * MS,
        span_attributes={**spans[0].span_attributes, "gen_ai.response.time_to_first_chunk": "4.2"},
    )
    later = [replace(s, timestamp=datetime_from_unix_ns(s.start_ns + 4000 * MS)) for s in spans[1:]]
    failed = [
        span(
            label,
            "c1",
            "Server",
            "POST /v1/chat/completions",
            start_ms,
            20,
            status="Error",
            **{"inferpath.stage": "gateway", "http.response.status_code": 503},
        )
        for label, start_ms in (("ga", 10), ("gb", 2000))
    ]
    row = assemble_request([client, *failed, *later], updated_at=UPDATED)
    assert row is not None
    assert (row.status, row.http_status_code) == ("ok", 200)
    assert (row.client_ttft_ns, row.ttft_ns, row.e2e_ns) == (4200 * MS, 180 * MS, 970 * MS)
    assert row.gateway_ns == 20 * MS
    # hops: client 5000 − last gateway 970 − retrying 4000 (10 → 4010 ms), model 900 − engine 880
    assert row.network_ns == 30 * MS + 20 * MS
    # Before the first token (0 → 4200 ms): the hop to the gateway 4200 − 180 − 4000 retrying;
    # the model hop (no TTFT on the model client: whole intervals, clipped) 140 − 130.
    assert row.network_ttft_ns == 20 * MS + 10 * MS
    # The same client span with only the last attempt: the same row but for the retrying.
    alone = assemble_request([client, *later], updated_at=UPDATED)
    assert alone is not None and alone.network_ns == 4030 * MS + 20 * MS
    # When the last attempt failed too, the request failed.
    last = replace(failed[1], timestamp=datetime_from_unix_ns(T0_NS + 4500 * MS))
    failed_row = assemble_request([client, *failed, last], updated_at=UPDATED)
    assert failed_row is not None and (failed_row.status, failed_row.http_status_code) == ("error", 503)
