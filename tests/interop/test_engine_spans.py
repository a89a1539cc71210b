"""SGLang's and TGI's own request spans, exported with the real OpenTelemetry SDK over OTLP/HTTP
to a real inferpath server (embedded chDB) on 127.0.0.1; the stored row is checked measure by
measure (docs/interop.md, ``server/engine_sources.py``).

Neither engine installs here (SGLang's tracing module imports torch and triton; TGI's router is
Rust), so each test builds the spans the way the engine's code builds them, read in its source:

- **SGLang 0.5.23** (``sglang/srt/observability/trace.py``, ``req_time_stats.py``,
  ``managers/tokenizer_manager.py``): tracer ``sglang server``, resource ``service.name =
  sglang``, 64-bit random trace ids (its ``TraceCustomIdGenerator``); per process a thread
  span (``"Tokenizer(host:… | pid:…)"``, ``"Scheduler [TP 0] (host:… | pid:…)"``, with
  ``host_id``, ``pid``, ``thread_label``, ``tp_rank``) under the request's root span
  ``" Req {rid[:8]}"`` (``rid``, ``module = sglang::request``); stage spans under the thread
  spans, each linked to the one before, with the wall-clock times SGLang passes explicitly;
  at the end the root gets the token counts, the served model and the latencies in seconds.
- **TGI v3.3.7** (router ``server.rs``, ``infer/mod.rs``, ``backends/v3/src/backend.rs`` and
  ``queue.rs``; ``tracing-opentelemetry`` 0.21 ``layer.rs``; ``opentelemetry-otlp`` 0.13):
  tracer ``opentelemetry-otlp`` 0.13.0, resource ``service.name =
  text-generation-inference.router`` (the launcher's default); INTERNAL spans named after the
  instrumented functions, each with the layer's ``code.*``, ``thread.*``, ``busy_ns`` and
  ``idle_ns``; the handler's timings as Rust ``Duration`` ``Debug`` text (checked against
  rustc's own output, ``data/rust_duration_debug.tsv``); one ``infer`` span per forward step
  and a ``send_generation`` under it; the batch's ``batch`` / ``prefill`` / ``decode`` spans
  in a trace of their own, linked to the request's ``infer`` spans.

TGI and SGLang export OTLP over gRPC by default (SGLang: ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=
http/protobuf`` switches it to HTTP; TGI: gRPC only, through an OpenTelemetry Collector,
``deploy/otelcol.yaml``); here the spans go over OTLP/HTTP, which the receiver takes.
"""

from __future__ import annotations

import random
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Link

from inferpath.config import Settings
from inferpath.server.engine_sources import rust_duration_to_ns
from inferpath.server.runtime import serve_in_thread

MS = 1_000_000
US = 1_000
RUST_DURATIONS = Path(__file__).resolve().parent / "data" / "rust_duration_debug.tsv"


def rust_debug(ns: int) -> str:
    """``format!("{:?}", Duration::from_nanos(ns))``: the unit is the largest that is ≤ the
    value, then every non-zero fractional digit (checked against rustc's output below)."""
    for unit, unit_ns, width in (("s", 1_000_000_000, 9), ("ms", 1_000_000, 6), ("\u00b5s", 1_000, 3)):
        if ns >= unit_ns:
            fraction = f"{ns % unit_ns:0{width}d}".rstrip("0")
            return f"{ns // unit_ns}.{fraction}{unit}" if fraction else f"{ns // unit_ns}{unit}"
    return f"{ns}ns"


def test_rust_duration_debug_text_reads_back_to_the_exact_nanosecond() -> None:
    """Both directions against rustc 1.95's own ``Debug`` output (``data/rust_duration_debug.rs``)."""
    pairs = [
        line.split("\t")
        for line in RUST_DURATIONS.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    ]
    assert len(pairs) == 21
    for ns, text in pairs:
        assert rust_duration_to_ns(text) == int(ns), text
        assert rust_debug(int(ns)) == text
    assert [rust_duration_to_ns(text) for text in ("", "12", "1.5 ms", "-1ms", "1.5h", "Some(3)")] == [None] * 6


@pytest.fixture()
def inferpath_server(store_url: str):
    with serve_in_thread(Settings(store_url=store_url, assembly_settle_seconds=0.2), port=0) as running:
        yield running


def _provider(server_url: str, service_name: str, id_generator: IdGenerator | None = None) -> TracerProvider:
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}),
        **({"id_generator": id_generator} if id_generator else {}),
    )
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{server_url}/v1/traces"), schedule_delay_millis=100)
    )
    return provider


def _stored_rows(server_url: str, since: datetime, expected: int = 1) -> list[dict]:
    """The request rows stored since ``since``, once ``expected`` are there (the receiver
    commits an export's spans in the background: a flush right after the export may come
    first), or what is there after 30 s."""
    deadline = time.monotonic() + 30
    with httpx.Client(base_url=server_url, timeout=30) as http:
        while True:
            assert http.post("/api/v1/flush", timeout=120).json()["ok"]
            rows = http.get(
                "/api/v1/requests",
                params={
                    "start": since.isoformat(),
                    "end": (datetime.now(timezone.utc) + timedelta(minutes=1)).isoformat(),
                    "limit": 100,
                },
            ).json()["requests"]
            if len(rows) >= expected or time.monotonic() > deadline:
                return rows
            time.sleep(0.2)


def _base_ns() -> int:
    """Ten seconds ago on a whole second: span starts are stored to the µs, so offsets of whole
    µs from it stay exact."""
    return (time.time_ns() // 1_000_000_000 - 10) * 1_000_000_000


# --------------------------------------------------------------------------- SGLang


class SGLangIds(IdGenerator):
    """As SGLang's ``TraceCustomIdGenerator``: 64-bit random trace and span ids."""

    def __init__(self) -> None:
        self.random = random.Random()  # SGLang seeds each process's own from the time

    def generate_trace_id(self) -> int:
        return self.random.getrandbits(64)

    def generate_span_id(self) -> int:
        return self.random.getrandbits(64)


def _sglang_thread_span(tracer, label: str, pid: int, at_ns: int, root_context, tp_rank: int | None = None):
    name = label + (f" [TP {tp_rank}] " if tp_rank is not None else "") + f"(host:5f3a9c1e | pid:{pid})"
    span = tracer.start_span(name, start_time=at_ns, context=root_context)
    if tp_rank is not None:
        span.set_attributes({"tp_rank": tp_rank})
    span.set_attributes({"host_id": "5f3a9c1e0b7d4e2f8a6c3b1d9e0f7a2c", "pid": pid, "thread_label": label})
    return span


def _sglang_slice(tracer, parent, name: str, start_ns: int, end_ns: int, previous=None, attributes=None):
    span = tracer.start_span(
        name,
        start_time=start_ns,
        context=trace.set_span_in_context(parent),
        links=[Link(previous.get_span_context())] if previous is not None else None,
    )
    if attributes:
        span.set_attributes(attributes)
    span.end(end_time=end_ns)
    return span


def test_an_sglang_request_span_fills_the_row(inferpath_server) -> None:
    """One chat request through SGLang's tokenizer and scheduler processes (two tracer
    providers, one trace): the row takes TTFT, E2E and decode from the root's latencies, queue
    and prefill from ``prefill_waiting`` and ``prefill_forward`` (not the root's
    ``time_in_model_prefill``, which includes the queue), tokenization from ``tokenize``."""
    since = datetime.now(timezone.utc) - timedelta(minutes=1)
    tokenizer_process = _provider(inferpath_server.url, "sglang", SGLangIds())
    scheduler_process = _provider(inferpath_server.url, "sglang", SGLangIds())
    tokenizer = tokenizer_process.get_tracer("sglang server")
    scheduler = scheduler_process.get_tracer("sglang server")
    t0 = _base_ns()

    def at(ms: float) -> int:
        return t0 + round(ms * MS)

    rid = "8c7d2f0e4b5a49e1a3c6d9f2b1e07a55"
    root = tokenizer.start_span(
        f" Req {rid[:8]}", start_time=at(0), context=Context(), attributes={"rid": rid, "module": "sglang::request"}
    )
    root_context = trace.set_span_in_context(root)
    # Tokenizer process: tokenize, then the dispatch to the scheduler (level 2), which ends the thread.
    thread = _sglang_thread_span(tokenizer, "Tokenizer", 4242, at(0), root_context)
    tokenize = _sglang_slice(tokenizer, thread, "tokenize", at(0), at(1.5))
    dispatch = _sglang_slice(tokenizer, thread, "api_server_dispatch", at(1.5), at(1.8), previous=tokenize)
    thread.end(end_time=at(1.8))
    # Scheduler process: the context arrives pickled (propagated root, last span as the link).
    remote_root = trace.set_span_in_context(trace.NonRecordingSpan(root.get_span_context()))
    worker = _sglang_thread_span(scheduler, "Scheduler", 4343, at(2.0), remote_root, tp_rank=0)
    process = _sglang_slice(scheduler, worker, "request_process", at(2.0), at(2.2), previous=dispatch)
    waiting = _sglang_slice(scheduler, worker, "prefill_waiting", at(2.2), at(32.2), previous=process)
    prefill = scheduler.start_span(
        "prefill_forward",
        start_time=at(32.2),
        context=trace.set_span_in_context(worker),
        links=[Link(waiting.get_span_context())],
    )
    prefill.add_event("schedule", timestamp=at(32.2))
    prefill.end(end_time=at(50.2))
    decode_waiting = _sglang_slice(scheduler, worker, "decode_waiting", at(50.2), at(50.4), previous=prefill)
    decode = scheduler.start_span(
        "decode_forward",
        start_time=at(50.4),
        context=trace.set_span_in_context(worker),
        links=[Link(decode_waiting.get_span_context())],
    )
    for step in range(4):
        _sglang_slice(
            scheduler, decode, "decode_loop", at(50.4 + 10 * step), at(60.4 + 10 * step), attributes={"decode_ct": step}
        )
    decode.end(end_time=at(90.6))
    worker.end(end_time=at(90.6))
    # Tokenizer: finished; the root gets the usage, the model and the latencies (seconds).
    root.set_attributes(
        {
            "gen_ai.usage.completion_tokens": 5,
            "gen_ai.usage.prompt_tokens": 12,
            "gen_ai.usage.cached_tokens": 0,
            "gen_ai.request.id": rid,
            "gen_ai.request.max_tokens": 64,
            "gen_ai.request.temperature": 0.7,
            "gen_ai.response.model": "Qwen/Qwen2.5-0.5B-Instruct",
            "gen_ai.response.finish_reasons": '["stop"]',
            "gen_ai.latency.time_to_first_token": 0.051,
            "gen_ai.latency.e2e": 0.0915,
            "gen_ai.latency.time_in_model_decode": 0.0405,
            "gen_ai.latency.time_in_model_inference": 0.0897,
            "gen_ai.latency.time_in_model_prefill": 0.0492,
        }
    )
    root.end(end_time=at(91.5))
    tokenizer_process.shutdown()
    scheduler_process.shutdown()

    rows = _stored_rows(inferpath_server.url, since)
    assert len(rows) == 1, rows
    row = rows[0]
    assert row["trace_id"].startswith("0" * 16)  # SGLang's 64-bit trace id, stored as 128 bits
    assert row["ttft_source"] == "sglang.time_to_first_token"
    assert (row["ttft_ns"], row["e2e_ns"], row["decode_ns"]) == (51 * MS, 91_500_000, 40_500_000)
    assert (row["queue_ns"], row["prefill_ns"], row["tokenize_ns"]) == (30 * MS, 18 * MS, 1_500_000)
    assert (row["input_tokens"], row["output_tokens"], row["itl_ns"]) == (12, 5, 40_500_000 // 4)
    assert (row["model"], row["model_version"]) == ("Qwen/Qwen2.5-0.5B-Instruct",) * 2
    assert row["client_ttft_ns"] is None and row["missing_measures"] == "" and row["status"] == "ok"


# --------------------------------------------------------------------------- TGI


class TracingOpenTelemetry:
    """Spans as ``tracing-opentelemetry`` 0.21 exports a ``tracing`` span: named after the
    function (``#[instrument]``) or the ``info_span!`` name, INTERNAL, the fields recorded as
    attributes (``Debug`` text for ``?`` fields and the router's ``format!("{:?}")`` values),
    plus ``code.filepath``, ``code.namespace``, ``code.lineno``, ``thread.id``,
    ``thread.name``, and ``busy_ns`` / ``idle_ns`` at close."""

    def __init__(self, tracer) -> None:
        self.tracer = tracer

    def span(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        parent=None,
        *,
        module: str,
        line: int,
        fields: dict | None = None,
        links=None,
    ):
        span = self.tracer.start_span(
            name,
            start_time=start_ns,
            links=links,
            context=trace.set_span_in_context(parent) if parent is not None else Context(),
        )
        span.set_attributes(
            {
                "code.filepath": module.replace("::", "/").replace("text_generation_router_v3", "backends/v3/src")
                + ".rs",
                "code.namespace": module,
                "code.lineno": line,
                "thread.id": 7,
                "thread.name": "tokio-runtime-worker",
                **(fields or {}),
            }
        )
        span.set_attributes({"busy_ns": (end_ns - start_ns) // 10, "idle_ns": (end_ns - start_ns) * 9 // 10})
        span.end(end_time=end_ns)
        return span


_GENERATION = (
    "Generation {{ request_id: 0, prefill_tokens: None, tokens: Some(Tokens {{ ids: [{id}], logprobs: "
    '[-0.25], texts: ["{text}"], is_special: [false] }}), generated_text: {generated}, top_tokens: [] }}'
)


def test_a_tgi_chat_completion_fills_the_row(inferpath_server) -> None:
    """A streamed ``/v1/chat/completions`` through TGI's router and v3 backend: TTFT is the
    first ``send_generation`` after the handler span's start; E2E, queue and validation the
    handler's ``total_time``, ``queue_time`` and ``validation_time``; prefill the first
    ``infer`` step up to the first token; decode the first to the last ``send_generation``;
    output tokens ``inference_time`` ÷ ``time_per_token``. The batch's own trace adds no row."""
    since = datetime.now(timezone.utc) - timedelta(minutes=1)
    router_process = _provider(inferpath_server.url, "text-generation-inference.router")
    otel = TracingOpenTelemetry(router_process.get_tracer("opentelemetry-otlp", "0.13.0"))
    t0 = _base_ns()

    def at(ms: float) -> int:
        return t0 + round(ms * MS)

    server, backend, queue_module = (
        "text_generation_router::server",
        "text_generation_router_v3::backend",
        "text_generation_router_v3::queue",
    )
    # Instants the router takes (start_time in generate_stream_internal, Entry.queue_time at
    # schedule, batch_time when the batch takes the entry, the End token's arrival).
    start_time, queued, batch_time, end_received = at(0.6), at(2.9), at(32.95), at(92.6)
    sends = [at(52.5), at(62.5), at(72.5), at(82.5), at(92.5)]
    inference_ns = end_received - batch_time
    handler = otel.tracer.start_span("chat_completions", start_time=at(0), context=Context())
    handler_context = trace.set_span_in_context(handler)
    async_stream = otel.tracer.start_span("async_stream", start_time=at(0.6), context=handler_context)
    infer = otel.span(
        "generate_stream", at(0.6), at(3.0), async_stream, module="text_generation_router::infer", line=99
    )
    # generate_stream's children end before it (validation, then the backend's schedule).
    validate = otel.tracer.start_span("validate", start_time=at(0.7), context=trace.set_span_in_context(infer))
    otel.span(
        "tokenize",
        at(0.75),
        at(2.7),
        validate,
        module="text_generation_router::validation",
        line=104,
        fields={"add_special_tokens": "true", "truncate": "None"},
    )
    validate.end(end_time=at(2.8))
    schedule = otel.tracer.start_span("schedule", start_time=at(2.9), context=trace.set_span_in_context(infer))
    otel.span("append", at(2.9), at(2.92), schedule, module=queue_module, line=75)
    otel.span("queued", at(2.92), batch_time, schedule, module=queue_module, line=228)
    steps = []
    for n, send_ns in enumerate(sends):
        step = otel.tracer.start_span(
            "infer",
            start_time=batch_time if n == 0 else sends[n - 1] + 100 * US,
            context=trace.set_span_in_context(schedule),
        )
        last = n == len(sends) - 1
        otel.span(
            "send_generation",
            send_ns,
            send_ns + 40 * US,
            step,
            module=backend,
            line=433,
            fields={
                "generation": _GENERATION.format(
                    id=9707 + n,
                    text="Hello"[n],
                    generated=(
                        'Some(GeneratedText { text: "Hello", generated_tokens: 5, finish_reason: EosToken, seed: Some(42) })'
                        if last
                        else "None"
                    ),
                )
            },
        )
        step.end(end_time=send_ns + 100 * US)
        steps.append(step)
    schedule.end(end_time=at(92.7))
    async_stream.end(end_time=at(3.0))
    handler.set_attributes(
        {
            "parameters": "GenerateParameters { best_of: None, temperature: Some(0.7), repetition_penalty: None, "
            "max_new_tokens: Some(64), stop: [], details: true, seed: None, top_n_tokens: None }",
            "total_time": rust_debug(end_received - start_time),
            "validation_time": rust_debug(queued - start_time),
            "queue_time": rust_debug(batch_time - queued),
            "inference_time": rust_debug(inference_ns),
            "time_per_token": rust_debug(inference_ns // 5),
            "seed": "Some(42)",
            "code.filepath": "router/src/server.rs",
            "code.namespace": server,
            "code.lineno": 1156,
            "thread.id": 7,
            "thread.name": "tokio-runtime-worker",
            "busy_ns": 2_100_000,
            "idle_ns": 91_000_000,
        }
    )
    handler.end(end_time=at(93.0))
    # The batch: a trace of its own (parent: None), following from the entries' infer spans.
    batch = otel.tracer.start_span(
        "batch", start_time=batch_time, context=Context(), links=[Link(steps[0].get_span_context())]
    )
    batch.set_attributes({"batch_size": 1})
    otel.span("prefill", batch_time, at(52.4), batch, module=backend, line=296)
    batch.end(end_time=at(52.6))
    router_process.shutdown()

    rows = _stored_rows(inferpath_server.url, since)
    assert len(rows) == 1, rows
    row = rows[0]
    assert row["ttft_source"] == "tgi.send_generation"
    assert row["ttft_ns"] == 52_500_000
    assert row["e2e_ns"] == end_received - start_time == 92 * MS
    assert (
        (row["queue_ns"], row["tokenize_ns"]) == (batch_time - queued, queued - start_time) == (30_050_000, 2_300_000)
    )
    assert row["prefill_ns"] == sends[0] - batch_time == 19_550_000
    assert row["decode_ns"] == sends[-1] - sends[0] == 40 * MS
    assert (row["output_tokens"], row["itl_ns"]) == (5, 10 * MS)
    # TGI's spans name neither the model nor the prompt's length.
    assert (row["model"], row["input_tokens"], row["status"]) == ("unknown", None, "ok")
    assert row["missing_measures"] == "" and row["client_ttft_ns"] is None
