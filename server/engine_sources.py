"""Engine request spans → the engine's measures of one request: vLLM's ``llm_request``,
SGLang's request span (``--enable-trace``) and Hugging Face TGI's router handler span.
The names, the readers and the registry; the mapping table for users is ``docs/interop.md``.

Each engine traces a request its own way; one :class:`EngineSource` per engine says which
span is the engine's request span (:meth:`EngineSource.claims`) and reads the request's
measures from it and its descendants (:meth:`EngineSource.read`), as an
:class:`EngineReading` in inferpath's units (ns, integer tokens).

- **vLLM** (``ttft_source = engine``, also the demo's engine and any span with
  ``gen_ai.latency.*`` attributes): one ``llm_request`` span whose attributes carry every
  measure, in seconds (``gen_ai.latency.time_to_first_token``, ``…e2e``, ``…time_in_queue``,
  ``…time_in_model_prefill``, ``…time_in_model_decode``).
- **SGLang** (``sglang.time_to_first_token``; read in SGLang 0.5.23,
  ``sglang/srt/observability/trace.py`` and ``req_time_stats.py``): the request's root span
  (tracer ``sglang server``, name ``"{role} Req {rid[:8]}"``, attribute ``module =
  sglang::request``) gets vLLM's latency names at the end, but SGLang's
  ``time_in_model_prefill`` runs from the dispatch to the scheduler to the first token, so it
  includes the scheduler's queue; and SGLang sets no ``time_in_queue``. Queue and prefill
  come from its stage spans instead (children of a per-thread span under the root):
  ``prefill_waiting`` (the waiting queue, until the first forward) and ``prefill_forward``
  (that forward until the prefill finished); tokenization from ``tokenize``.
- **TGI** (``tgi.send_generation``; read in text-generation-inference v3.3.7, router
  ``server.rs``, ``infer/mod.rs``, ``backends/v3/src/{backend,queue}.rs``, exported by
  ``tracing-opentelemetry`` 0.21): the router's handler span (``chat_completions``,
  ``completions``, ``generate_stream``, ``generate``) records ``total_time``,
  ``validation_time``, ``queue_time``, ``inference_time`` and ``time_per_token`` as Rust
  ``Duration`` ``Debug`` text (``"40.123456ms"``); no TTFT and no token counts. Under it
  (through ``async_stream``, ``generate_stream`` and the backend's ``schedule``) each request
  has a ``queued`` span while it waits, one ``infer`` span per forward step and, under the
  step's span, one ``send_generation`` span per step that hands tokens to the handler. TTFT is
  the first ``send_generation``'s start after the handler span's start (both stamped by
  ``tracing-opentelemetry`` with the router's wall clock); decode runs from the first to the
  last ``send_generation``; prefill from the first ``infer`` (the batch that took the
  request) to the first ``send_generation``; output tokens are ``inference_time`` ÷
  ``time_per_token`` (TGI computes the latter as the former divided by the generated tokens
  in whole ns, so the quotient floors back to the count), else the ``send_generation`` count.
  TGI's ``prefill`` / ``decode`` / ``batch`` spans are per batch, each a trace of its own:
  they are not a request's.

Adding an engine means one :class:`EngineSource` in :data:`ENGINE_SOURCES`, a row in
docs/interop.md and a test (``tests/server/test_derive_engines.py``,
``tests/interop/test_engine_spans.py``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from inferpath.server.sources import DerivationCounts, TTFTReading, seconds_to_ns
from inferpath.storage.rows import SpanRow
from inferpath.vocabulary import GEN_AI_LATENCY_TTFT

__all__ = [
    "missing_ttft_reason",
    "EngineReading",
    "EngineSource",
    "ENGINE_SOURCES",
    "SGLANG",
    "TGI",
    "VLLM",
    "engine_source",
    "read_engine",
    "rust_duration_to_ns",
    "union_ns",
]

#: ``ttft_source`` of each engine's TTFT (vLLM's keeps the name rows had before SGLang and TGI).
VLLM_SOURCE, SGLANG_SOURCE, TGI_SOURCE = "engine", "sglang.time_to_first_token", "tgi.send_generation"

# --------------------------------------------------------------------------- vLLM
VLLM_SPAN_NAME = "llm_request"
GENAI_LATENCY_PREFIX = "gen_ai.latency."
ENGINE_E2E = "gen_ai.latency.e2e"
ENGINE_QUEUE = "gen_ai.latency.time_in_queue"
ENGINE_PREFILL = "gen_ai.latency.time_in_model_prefill"
ENGINE_DECODE = "gen_ai.latency.time_in_model_decode"
ENGINE_OUTPUT_TOKENS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")

# --------------------------------------------------------------------------- SGLang
SGLANG_SCOPE = "sglang server"
SGLANG_MODULE = "module"
SGLANG_MODULE_PREFIX = "sglang::"
SGLANG_QUEUE_SPAN = "prefill_waiting"
SGLANG_PREFILL_SPAN = "prefill_forward"
SGLANG_TOKENIZE_SPAN = "tokenize"

# --------------------------------------------------------------------------- TGI
TGI_HANDLER_SPANS = frozenset({"chat_completions", "completions", "generate_stream", "generate"})
TGI_TOTAL_TIME = "total_time"
TGI_VALIDATION_TIME = "validation_time"
TGI_QUEUE_TIME = "queue_time"
TGI_INFERENCE_TIME = "inference_time"
TGI_TIME_PER_TOKEN = "time_per_token"
TGI_QUEUED_SPAN = "queued"
TGI_STEP_SPAN = "infer"
TGI_SEND_SPAN = "send_generation"


@dataclass(frozen=True, slots=True)
class EngineReading:
    """What an engine's request span says about one request, in ns and tokens; ``None`` for
    what it does not report. ``ttft``: the TTFT and the source it came from (its name is the
    row's ``ttft_source`` when no client or gateway measured one)."""

    ttft: TTFTReading | None = None
    e2e_ns: int | None = None
    queue_ns: int | None = None
    prefill_ns: int | None = None
    decode_ns: int | None = None
    tokenize_ns: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True)
class EngineSource:
    """One engine: ``name`` (the ``ttft_source`` of its TTFT), ``claims(span)`` — is this
    the engine's request span? (called for every span, so cheap) — and
    ``read(span, descendants, counts)`` → :class:`EngineReading`, where ``descendants`` is a
    callable giving the span's descendants in the trace (computed once, on demand)."""

    name: str
    claims: Callable[[SpanRow], bool]
    read: Callable[[SpanRow, Callable[[], Sequence[SpanRow]], DerivationCounts], EngineReading]


def union_ns(intervals: Iterable[tuple[int, int]]) -> int:
    """Total length in ns covered by ``(start_ns, end_ns)`` intervals, overlaps counted once."""
    total = 0
    current_start = 0  # read only while current_end is set
    current_end: int | None = None
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def _seconds(span: SpanRow, name: str, counts: DerivationCounts) -> int | None:
    text = span.span_attributes.get(name)
    if not text:
        return None
    ns = seconds_to_ns(text)
    if ns is None:
        counts.ignored_timings_total += 1
    return ns


def _tokens(span: SpanRow, names: Sequence[str]) -> int | None:
    for name in names:
        text = span.span_attributes.get(name)
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            return int(value)
    return None


def _named_union(spans: Sequence[SpanRow], name: str) -> int | None:
    named = [(s.start_ns, s.end_ns) for s in spans if s.span_name == name]
    return union_ns(named) if named else None


# --------------------------------------------------------------------------- vLLM


def _claims_vllm(span: SpanRow) -> bool:
    if span.span_name == VLLM_SPAN_NAME:
        return True
    for key in span.span_attributes:  # a loop, not any(generator): this runs for every span
        if key.startswith(GENAI_LATENCY_PREFIX):
            return True
    return False


def _read_vllm(span: SpanRow, descendants: Callable[[], Sequence[SpanRow]], counts: DerivationCounts) -> EngineReading:
    ttft_ns = _seconds(span, GEN_AI_LATENCY_TTFT, counts)
    return EngineReading(
        ttft=TTFTReading(ttft_ns, VLLM_SOURCE) if ttft_ns is not None else None,
        e2e_ns=seconds_to_ns(span.span_attributes.get(ENGINE_E2E)),
        queue_ns=seconds_to_ns(span.span_attributes.get(ENGINE_QUEUE)),
        prefill_ns=seconds_to_ns(span.span_attributes.get(ENGINE_PREFILL)),
        decode_ns=seconds_to_ns(span.span_attributes.get(ENGINE_DECODE)),
        output_tokens=_tokens(span, ENGINE_OUTPUT_TOKENS),
    )


# --------------------------------------------------------------------------- SGLang


def _claims_sglang(span: SpanRow) -> bool:
    if span.scope_name != SGLANG_SCOPE and not span.span_attributes.get(SGLANG_MODULE, "").startswith(
        SGLANG_MODULE_PREFIX
    ):
        return False
    for key in span.span_attributes:
        if key.startswith(GENAI_LATENCY_PREFIX):
            return True
    return False


def _read_sglang(
    span: SpanRow, descendants: Callable[[], Sequence[SpanRow]], counts: DerivationCounts
) -> EngineReading:
    ttft_ns = _seconds(span, GEN_AI_LATENCY_TTFT, counts)
    below = descendants()
    return EngineReading(
        ttft=TTFTReading(ttft_ns, SGLANG_SOURCE) if ttft_ns is not None else None,
        e2e_ns=seconds_to_ns(span.span_attributes.get(ENGINE_E2E)),
        # Not time_in_model_prefill: SGLang's runs from the dispatch to the first token, queue included.
        queue_ns=_named_union(below, SGLANG_QUEUE_SPAN),
        prefill_ns=_named_union(below, SGLANG_PREFILL_SPAN),
        decode_ns=seconds_to_ns(span.span_attributes.get(ENGINE_DECODE)),
        tokenize_ns=_named_union(below, SGLANG_TOKENIZE_SPAN),
        output_tokens=_tokens(span, ENGINE_OUTPUT_TOKENS),
    )


# --------------------------------------------------------------------------- TGI

# Rust's ``impl Debug for Duration``: whole units, then up to 9 (s), 6 (ms), 3 (µs) or no
# fractional digits, trailing zeros dropped; µ is U+00B5.
_RUST_DURATION = re.compile(r"(\d+)(?:\.(\d{1,9}))?(s|ms|\u00b5s|\u03bcs|us|ns)")
_UNIT_NS = {"s": 1_000_000_000, "ms": 1_000_000, "\u00b5s": 1_000, "\u03bcs": 1_000, "us": 1_000, "ns": 1}


def rust_duration_to_ns(text: str | None) -> int | None:
    """A Rust ``Duration`` as its ``Debug`` text prints it (``"1.234567ms"``, ``"61.000000001s"``,
    ``"80µs"``, ``"0ns"``) → integer ns, exactly (the text is lossless: Rust prints every
    non-zero digit down to the ns). ``None`` for anything else."""
    if not text:
        return None
    match = _RUST_DURATION.fullmatch(text.strip())
    if match is None:
        return None
    whole, fraction, unit = match.groups()
    unit_ns = _UNIT_NS[unit]
    ns = int(whole) * unit_ns
    if fraction:
        ns += round(int(fraction) * unit_ns / 10 ** len(fraction))
    return ns


def _claims_tgi(span: SpanRow) -> bool:
    if span.span_name not in TGI_HANDLER_SPANS:
        return False
    attributes = span.span_attributes
    return TGI_TOTAL_TIME in attributes or TGI_QUEUE_TIME in attributes or TGI_INFERENCE_TIME in attributes


def _tgi_duration(span: SpanRow, name: str, counts: DerivationCounts) -> int | None:
    text = span.span_attributes.get(name)
    if not text:
        return None
    ns = rust_duration_to_ns(text)
    if ns is None:
        counts.ignored_timings_total += 1
    return ns


def _read_tgi(span: SpanRow, descendants: Callable[[], Sequence[SpanRow]], counts: DerivationCounts) -> EngineReading:
    below = descendants()
    sends = sorted(s.start_ns for s in below if s.span_name == TGI_SEND_SPAN)
    steps = [s.start_ns for s in below if s.span_name == TGI_STEP_SPAN]
    first_send = sends[0] if sends and sends[0] >= span.start_ns else None
    if sends and first_send is None:
        counts.ignored_timings_total += 1
    ttft_ns = first_send - span.start_ns if first_send is not None else None
    inference_ns = _tgi_duration(span, TGI_INFERENCE_TIME, counts)
    per_token_ns = _tgi_duration(span, TGI_TIME_PER_TOKEN, counts)
    output_tokens = inference_ns // per_token_ns if inference_ns is not None and per_token_ns else None
    if output_tokens is None and sends:
        output_tokens = len(sends)
    e2e_ns = _tgi_duration(span, TGI_TOTAL_TIME, counts)
    if e2e_ns is None and first_send is not None:
        e2e_ns = sends[-1] - span.start_ns
    queue_ns = _tgi_duration(span, TGI_QUEUE_TIME, counts)
    if queue_ns is None:
        queue_ns = _named_union(below, TGI_QUEUED_SPAN)
    first_step = min(steps) if steps else None
    return EngineReading(
        ttft=TTFTReading(ttft_ns, TGI_SOURCE) if ttft_ns is not None else None,
        e2e_ns=e2e_ns,
        queue_ns=queue_ns,
        prefill_ns=first_send - first_step
        if first_send is not None and first_step is not None and first_step <= first_send
        else None,
        decode_ns=sends[-1] - first_send if first_send is not None else None,
        tokenize_ns=_tgi_duration(span, TGI_VALIDATION_TIME, counts),
        output_tokens=output_tokens,
    )


SGLANG = EngineSource(SGLANG_SOURCE, _claims_sglang, _read_sglang)
TGI = EngineSource(TGI_SOURCE, _claims_tgi, _read_tgi)
VLLM = EngineSource(VLLM_SOURCE, _claims_vllm, _read_vllm)
#: The engines, most specific first: SGLang's request span also carries vLLM's names.
ENGINE_SOURCES: tuple[EngineSource, ...] = (SGLANG, TGI, VLLM)


#: Every claimed span is named one of these or carries a ``gen_ai.latency.*`` attribute (a
#: pre-check for the spans no engine claims, most of a trace's).
_CLAIMED_NAMES = frozenset({VLLM_SPAN_NAME, *TGI_HANDLER_SPANS})


def engine_source(span: SpanRow) -> EngineSource | None:
    """The :class:`EngineSource` whose request span ``span`` is, or ``None``."""
    if span.span_name not in _CLAIMED_NAMES:
        for key in span.span_attributes:  # a loop, not any(generator): this runs for every span
            if key.startswith(GENAI_LATENCY_PREFIX):
                break
        else:
            return None
    for source in ENGINE_SOURCES:
        if source.claims(span):
            return source
    return None


def missing_ttft_reason(span: SpanRow) -> str | None:
    """Why the engine request span ``span`` gives no TTFT, in its engine's terms, or ``None``
    when nothing more specific than "no TTFT attribute" can be said."""
    if engine_source(span) is TGI:
        return (
            f"TGI's request span '{span.span_name}' has no {TGI_SEND_SPAN} span under it "
            "(the router hands no token back)"
        )
    return None


def read_engine(span: SpanRow, descendants: Callable[[], Sequence[SpanRow]], counts: DerivationCounts) -> EngineReading:
    """The measures of engine request span ``span`` (see :func:`engine_source`); an empty
    reading for a span no engine claims."""
    source = engine_source(span)
    return source.read(span, descendants, counts) if source is not None else EngineReading()
