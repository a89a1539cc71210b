"""Where a span's measures come from: inferpath's own attributes and those of the other
instrumentations teams already run (OpenLLMetry, OpenTelemetry's GenAI instrumentations,
OpenInference, Langfuse, vLLM). The names, the readers and the precedence; the mapping
table for users is ``docs/interop.md``. Engines' own request spans (vLLM, SGLang, TGI),
whose measures can span several spans of the trace, are read by
:mod:`inferpath.server.engine_sources`.

TTFT sources, in precedence order (:data:`TTFT_SOURCES`; the first one a span carries wins):

==================================  ===========  =============================================
source (``ttft_source``)            measures     read from
==================================  ===========  =============================================
``inferpath``                       first token  ``gen_ai.response.time_to_first_chunk`` on a
                                                 span with ``inferpath.stream.*`` (AIPerf: the
                                                 first visible token)
``engine``                          first token  ``gen_ai.latency.time_to_first_token`` (vLLM's
                                                 ``llm_request``, the demo's engine)
``openllmetry.chunk_events``        first token  OpenLLMetry's per-chunk events
                                                 (``gen_ai.content.completion.chunk``, before
                                                 0.4x ``llm.content.completion.chunk``): the
                                                 second one, because OpenAI-compatible chat
                                                 streams (OpenAI, vLLM, SGLang) open with a
                                                 role-only chunk, which AIPerf does not count
``langfuse.completion_start_time``  first chunk  ``langfuse.observation.completion_start_time``
                                                 (ISO 8601 text, JSON-quoted as Langfuse sends it)
``genai.time_to_first_chunk``       first chunk  ``gen_ai.response.time_to_first_chunk`` without
                                                 ``inferpath.stream.*`` (the GenAI semantic
                                                 conventions: the first chunk of any kind)
``openinference.first_token_event`` first chunk  OpenInference's ``First Token Stream Event``
                                                 (added on the first chunk of any kind)
==================================  ===========  =============================================

Exact first-token sources come before first-chunk ones: a first-chunk time counts a
role-only chunk, so it equals TTFT only when the server sends that chunk with the first
token (vLLM and OpenAI do; a server that sends it at once does not). Two readings on one
span more than :data:`CONFLICT_TOLERANCE_NS` apart are a conflict: the first one is kept
and the conflict counted (:class:`DerivationCounts`). An event or time before the span's
start, after its end, or unparsable is ignored and counted; the others are still read.

Clocks: span starts, ends and event times are the emitter's wall clock (µs in storage);
attribute TTFTs are what the emitter measured (inferpath: monotonic clock, in seconds).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from inferpath.storage.rows import SpanRow, unix_ns_from_datetime
from inferpath.vocabulary import (
    GEN_AI_LATENCY_TTFT,
    GEN_AI_TIME_TO_FIRST_CHUNK,
    STREAM_CHUNKS,
    STREAM_INCOMPLETE_REASON,
    STREAM_STATUS,
)

__all__ = [
    "TTFT_SOURCES",
    "TTFTSource",
    "TTFTReading",
    "DerivationCounts",
    "CONFLICT_TOLERANCE_NS",
    "seconds_to_ns",
    "span_ttft",
    "is_llm_call",
    "langfuse_usage_tokens",
    "missing_measures",
    "describe_instrumentation",
]

# --------------------------------------------------------------------------- names
INFERPATH_STREAM_MARKS = (STREAM_STATUS, STREAM_CHUNKS)
# OpenLLMetry: one event per streamed chunk, no attributes (traceloop-sdk 0.62: the first;
# releases before the GenAI rename: the second).
CHUNK_EVENTS = frozenset({"gen_ai.content.completion.chunk", "llm.content.completion.chunk"})
OPENLLMETRY_STREAMING = ("gen_ai.is_streaming", "llm.is_streaming")
GENAI_REQUEST_STREAM = "gen_ai.request.stream"
# OpenInference: one event on the first chunk; LLM spans are INTERNAL, marked by their kind.
FIRST_TOKEN_EVENT = "First Token Stream Event"
_FIRST_TOKEN_EVENTS = frozenset({FIRST_TOKEN_EVENT})
OPENINFERENCE_KIND = "openinference.span.kind"
OPENINFERENCE_LLM = "LLM"
OPENINFERENCE_MODEL = "llm.model_name"
OPENINFERENCE_INPUT_TOKENS = "llm.token_count.prompt"
OPENINFERENCE_OUTPUT_TOKENS = "llm.token_count.completion"
# Langfuse (OTel export of SDK v3+): generations are INTERNAL spans with these attributes.
LANGFUSE_TYPE = "langfuse.observation.type"
LANGFUSE_GENERATION = "generation"
LANGFUSE_COMPLETION_START = "langfuse.observation.completion_start_time"
LANGFUSE_MODEL = "langfuse.observation.model.name"
LANGFUSE_USAGE = "langfuse.observation.usage_details"
_LANGFUSE_INPUT_KEYS = ("input", "prompt_tokens", "input_tokens")
_LANGFUSE_OUTPUT_KEYS = ("output", "completion_tokens", "output_tokens")

#: Readings of one span further apart than this are a conflict (counted; the first source kept).
CONFLICT_TOLERANCE_NS = 1_000_000

# Instrumentation scopes → the package a user installed, for the reason a TTFT is missing.
_SCOPE_PACKAGES = {
    "opentelemetry.util.genai.handler": "opentelemetry-instrumentation-openai-v2 (util-genai)",
    "opentelemetry.instrumentation.openai_v2": "opentelemetry-instrumentation-openai-v2",
    "opentelemetry.instrumentation.openai.v1": "OpenLLMetry (traceloop-sdk)",
    "openinference.instrumentation.openai": "openinference-instrumentation-openai",
    "langfuse-sdk": "Langfuse",
    "inferpath": "inferpath",
}


@dataclass(slots=True)
class DerivationCounts:
    """What derivations met and counted (the assembler's self-metrics): readings of one span
    that disagreed (``ttft_conflicts_total``) and events or times ignored as malformed
    (``ignored_timings_total``: before the span's start, after its end, unparsable)."""

    ttft_conflicts_total: int = 0
    ignored_timings_total: int = 0


@dataclass(frozen=True, slots=True)
class TTFTReading:
    """A span's TTFT in ns and the :class:`TTFTSource` name it came from."""

    ttft_ns: int
    source: str


@dataclass(frozen=True)
class TTFTSource:
    """One TTFT source: ``name`` (stored in ``ttft_source``), what it ``measures``
    (``"first token"`` or ``"first chunk"``) and ``read(span, counts)`` → ns after the
    span's start, or ``None``; malformed inputs are added to ``counts``."""

    name: str
    measures: str
    read: Callable[[SpanRow, DerivationCounts], int | None]


def seconds_to_ns(seconds: str | float | int | None) -> int | None:
    """Seconds (a float or its text, as OTel attributes carry it) → integer nanoseconds,
    rounded to nearest. ``None``, unparsable, negative, NaN or infinite input gives ``None``
    ("not measured"), never a made-up zero."""
    if seconds is None or seconds == "":
        return None
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return round(value * 1_000_000_000)


def _seconds_attribute(span: SpanRow, name: str, counts: DerivationCounts) -> int | None:
    text = span.span_attributes.get(name)
    if not text:
        return None
    ns = seconds_to_ns(text)
    if ns is None:
        counts.ignored_timings_total += 1
    return ns


def _is_inferpath_stream(span: SpanRow) -> bool:
    attributes = span.span_attributes
    return INFERPATH_STREAM_MARKS[0] in attributes or INFERPATH_STREAM_MARKS[1] in attributes


def _read_inferpath(span: SpanRow, counts: DerivationCounts) -> int | None:
    return _seconds_attribute(span, GEN_AI_TIME_TO_FIRST_CHUNK, counts) if _is_inferpath_stream(span) else None


def _read_engine(span: SpanRow, counts: DerivationCounts) -> int | None:
    return _seconds_attribute(span, GEN_AI_LATENCY_TTFT, counts)


def _event_offsets(span: SpanRow, names: frozenset[str], counts: DerivationCounts) -> list[int]:
    """Offsets (ns after the span's start) of the span's events named ``names``, in time
    order; events without a datetime, before the start or after the end are counted and
    left out."""
    offsets = []
    start_ns, end_ns = span.start_ns, span.end_ns
    for event in span.events:
        if event[1] in names:
            at = event[0]
            at_ns = unix_ns_from_datetime(at) if isinstance(at, datetime) and at.tzinfo else None
            if at_ns is None or not start_ns <= at_ns <= end_ns:
                counts.ignored_timings_total += 1
                continue
            offsets.append(at_ns - start_ns)
    offsets.sort()
    return offsets


def _read_openllmetry_chunks(span: SpanRow, counts: DerivationCounts) -> int | None:
    offsets = _event_offsets(span, CHUNK_EVENTS, counts)
    # The first chunk of an OpenAI-compatible chat stream is the role-only one.
    return offsets[1] if len(offsets) >= 2 else None


def _read_langfuse(span: SpanRow, counts: DerivationCounts) -> int | None:
    text = span.span_attributes.get(LANGFUSE_COMPLETION_START)
    if not text:
        return None
    try:
        value = json.loads(text) if text.startswith('"') else text
        at = datetime.fromisoformat(value)
        at_ns = unix_ns_from_datetime(at) if at.tzinfo is not None else None
    except (TypeError, ValueError):
        at_ns = None
    if at_ns is None or not span.start_ns <= at_ns <= span.end_ns:
        counts.ignored_timings_total += 1
        return None
    return at_ns - span.start_ns


def _read_genai_first_chunk(span: SpanRow, counts: DerivationCounts) -> int | None:
    return None if _is_inferpath_stream(span) else _seconds_attribute(span, GEN_AI_TIME_TO_FIRST_CHUNK, counts)


def _read_openinference(span: SpanRow, counts: DerivationCounts) -> int | None:
    offsets = _event_offsets(span, _FIRST_TOKEN_EVENTS, counts)
    return offsets[0] if offsets else None


#: The TTFT sources in precedence order (see the module docstring). Adding a source means
#: adding one entry here, its names above, a row in docs/interop.md and a test.
TTFT_SOURCES: tuple[TTFTSource, ...] = (
    TTFTSource("inferpath", "first token", _read_inferpath),
    TTFTSource("engine", "first token", _read_engine),
    TTFTSource("openllmetry.chunk_events", "first token", _read_openllmetry_chunks),
    TTFTSource("langfuse.completion_start_time", "first chunk", _read_langfuse),
    TTFTSource("genai.time_to_first_chunk", "first chunk", _read_genai_first_chunk),
    TTFTSource("openinference.first_token_event", "first chunk", _read_openinference),
)

_NO_COUNTS = DerivationCounts()  # a sink for callers that do not count


def span_ttft(span: SpanRow | None, counts: DerivationCounts | None = None) -> TTFTReading | None:
    """The TTFT ``span`` carries, from the first source of :data:`TTFT_SOURCES` that gives
    one, or ``None``. Every source is read: a reading more than
    :data:`CONFLICT_TOLERANCE_NS` from the chosen one adds one conflict to ``counts``
    (once per span), malformed inputs add to its ignored timings."""
    if span is None:
        return None
    sink = counts if counts is not None else _NO_COUNTS
    chosen: TTFTReading | None = None
    conflict = False
    for source in TTFT_SOURCES:
        ns = source.read(span, sink)
        if ns is None:
            continue
        if chosen is None:
            chosen = TTFTReading(ns, source.name)
        elif abs(ns - chosen.ttft_ns) > CONFLICT_TOLERANCE_NS:
            conflict = True
    if conflict:
        sink.ttft_conflicts_total += 1
    return chosen


def is_llm_call(span: SpanRow) -> bool:
    """True for a model call that another instrumentation marks without the GenAI client
    shape: an OpenInference ``LLM`` span or a Langfuse ``generation`` (both INTERNAL)."""
    attributes = span.span_attributes
    return (
        attributes.get(OPENINFERENCE_KIND) == OPENINFERENCE_LLM or attributes.get(LANGFUSE_TYPE) == LANGFUSE_GENERATION
    )


def langfuse_usage_tokens(span: SpanRow | None) -> tuple[int | None, int | None]:
    """``(input, output)`` tokens of a Langfuse generation's ``usage_details`` JSON (keys
    ``input``/``output`` or the OpenAI usage names), ``None`` for what it lacks."""
    text = span.span_attributes.get(LANGFUSE_USAGE) if span is not None else None
    if not text:
        return None, None
    try:
        usage = json.loads(text)
    except ValueError:
        return None, None
    if not isinstance(usage, dict):
        return None, None

    def first(keys: Iterable[str]) -> int | None:
        for key in keys:
            value = usage.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
                return int(value)
        return None

    return first(_LANGFUSE_INPUT_KEYS), first(_LANGFUSE_OUTPUT_KEYS)


def describe_instrumentation(span: SpanRow) -> str:
    """The package behind ``span`` in a user's words (from its instrumentation scope)."""
    scope = span.scope_name
    if scope in _SCOPE_PACKAGES:
        return _SCOPE_PACKAGES[scope]
    return f"instrumentation scope '{scope}'" if scope else f"span '{span.span_name}'"


def _not_streamed(span: SpanRow) -> bool:
    return any(span.span_attributes.get(name) == "false" for name in (*OPENLLMETRY_STREAMING, GENAI_REQUEST_STREAM))


def missing_measures(
    *,
    client: SpanRow | None,
    gateway: SpanRow | None,
    engine: SpanRow | None,
    ttft_ns: int | None,
    e2e_ns: int | None,
    output_tokens: int | None,
    itl_ns: int | None,
    engine_ttft_reason: str | None = None,
) -> str:
    """Why a request row lacks TTFT, E2E, output tokens or ITL: ``"measure: reason"`` entries
    joined by ``"; "``, empty when nothing is missing. ``ttft_ns`` / ``e2e_ns``: the row's
    best (client, else server) values; ``client``/``gateway``/``engine``: the spans that
    played those roles; ``engine_ttft_reason``: the engine reader's own words for a TTFT its
    span cannot give (:func:`~inferpath.server.engine_sources.missing_ttft_reason`)."""
    reasons = []
    if ttft_ns is None:
        reasons.append("ttft: " + _ttft_reason(client, gateway, engine, engine_ttft_reason))
    if e2e_ns is None:
        reasons.append("e2e: no client, gateway or engine span gives the request's duration")
    if output_tokens is None:
        reasons.append("output_tokens: no span reports usage (a stream reports it with stream_options.include_usage)")
    if itl_ns is None:
        if output_tokens is not None and output_tokens < 2:
            reasons.append("itl: fewer than 2 output tokens")
        elif ttft_ns is None:
            reasons.append("itl: needs TTFT")
        elif output_tokens is None:
            reasons.append("itl: needs output tokens")
        else:
            reasons.append("itl: needs E2E")
    return "; ".join(reasons)


def _ttft_reason(
    client: SpanRow | None, gateway: SpanRow | None, engine: SpanRow | None, engine_reason: str | None
) -> str:
    for span in (gateway, client):
        if span is not None and span.span_attributes.get(STREAM_STATUS) == "incomplete":
            reason = span.span_attributes.get(STREAM_INCOMPLETE_REASON) or "incomplete"
            return f"the stream ended without a visible token ({reason})"
    if client is not None:
        who = describe_instrumentation(client)
        if _not_streamed(client):
            return f"not a streamed call ({who})"
        if any(event[1] in CHUNK_EVENTS for event in client.events):
            return (
                f"{who} recorded fewer than 2 usable chunk events (the first one is the role "
                "chunk; events before the span's start or after its end are ignored)"
            )
        return (
            f"{who} records no per-chunk timing; add inferpath.instrument() (its openai/httpx "
            "integration) or enable chunk events (OpenLLMetry)"
        )
    if gateway is not None:
        if gateway.status_code == "Error":
            attributes = gateway.span_attributes
            status = attributes.get("http.response.status_code") or attributes.get("http.status_code")
            why = f"HTTP {status}" if status else (gateway.status_message or "an error status")
            return f"the request failed at the gateway ({why}) before a first token"
        return "the gateway's response was not an OpenAI-style stream"
    if engine is not None:
        return engine_reason or f"the engine span carries no {GEN_AI_LATENCY_TTFT}"
    return "no span of this trace measures a first token"
