"""Spans of one trace → one request row: the derivations of ``docs/telemetry-contract.md``.

A pure function, :func:`assemble_request`, with no storage and no clock; the background
part that feeds it lives in :mod:`inferpath.server.assembler`.

Roles a span can play in a trace (spans are the exporter-shaped
:class:`~inferpath.storage.rows.SpanRow`, so kinds are ``"Server"``/``"Client"``/… and every
attribute value is a string):

- root client: a ``Client`` span with no parent inside the trace (the end user's call);
- gateway: a ``Server`` span with ``inferpath.stage=gateway`` (the outermost one; of
  several at that depth, the first that did not fail: failed ones before it were attempts a
  caller retried, status ERROR or HTTP 429 / ≥ 500);
- engine: an engine's request span (:mod:`inferpath.server.engine_sources`: vLLM's
  ``llm_request`` or any span with ``gen_ai.latency.*`` attributes, SGLang's request span,
  TGI's router handler span; the earliest one when a trace holds several, after any failed
  attempts), whose measures
  the engine's reader gives;
- stage spans: ``inferpath.stage`` in tokenize / retrieval / queue / prefill / decode /
  model / postprocess;
- network hops: a ``Server`` span whose parent is a ``Client`` span of the trace (failed
  callees before a caller's first that did not fail were retried attempts: no hops of their
  own, and the time from the first attempt's start to that callee's is retrying, not the wire).

TTFT-phase parts (``gateway_ttft_ns``, ``network_ttft_ns``) are the gateway's self time and
the hops' overhead clipped to the TTFT window ``[start, start + ttft_ns]`` of the span that
measured ``ttft_ns``: a streamed response's gateway relays every later token, and that time
is not part of TTFT. ``engine_send_ns`` is the trip out of the hop into the engine: its
caller's start to the engine span's start, before any token.

Durations: attributes carry seconds (float text); every measure is converted once, by
:func:`seconds_to_ns`, to integer nanoseconds rounded to nearest. Span intervals use the
stored start (wall clock, µs resolution) and ``duration_ns`` (the emitter's clock).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone

from inferpath.server import engine_sources, sources
from inferpath.server.engine_sources import union_ns
from inferpath.server.sources import DerivationCounts, TTFTReading, seconds_to_ns, span_ttft
from inferpath.storage.rows import RequestRow, SpanRow
from inferpath.vocabulary import (
    ENDPOINT,
    ENDPOINT_CLASS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    HTTP_RESPONSE_STATUS_CODE,
    HTTP_ROUTE,
    ITL_SECONDS,
    STAGE,
    STREAM_STATUS,
)

__all__ = [
    "assemble_request",
    "DerivationCounts",
    "seconds_to_ns",
    "union_ns",
]

INPUT_TOKENS = (GEN_AI_USAGE_INPUT_TOKENS, "gen_ai.usage.prompt_tokens", sources.OPENINFERENCE_INPUT_TOKENS)
OUTPUT_TOKENS = (GEN_AI_USAGE_OUTPUT_TOKENS, "gen_ai.usage.completion_tokens", sources.OPENINFERENCE_OUTPUT_TOKENS)
HTTP_STATUS = (HTTP_RESPONSE_STATUS_CODE, "http.status_code")
UNKNOWN_MODEL = "unknown"
"""``model`` of a request whose spans name none (docs/telemetry-contract.md): an explicit
label that groups, filters and reads as what it is, where ``''`` looked like a missing column."""
REPLICA = ("inferpath.replica", "service.instance.id", "host.name")

_GENAI_PREFIX = "gen_ai."


def _int_attr(span: SpanRow | None, names: Iterable[str]) -> int | None:
    if span is None:
        return None
    for name in names:
        text = span.span_attributes.get(name)
        if text in (None, ""):
            continue
        try:
            value = float(text)
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            return int(value)
    return None


def _depth(span: SpanRow, by_id: dict[str, SpanRow]) -> int:
    depth, seen, parent = 0, {span.span_id}, span.parent_span_id
    while parent in by_id and parent not in seen:  # ``seen`` guards against parent cycles
        seen.add(parent)
        depth += 1
        parent = by_id[parent].parent_span_id
    return depth


def _descendants(root: SpanRow, spans: Sequence[SpanRow]) -> list[SpanRow]:
    children: dict[str, list[SpanRow]] = {}
    for span in spans:
        children.setdefault(span.parent_span_id, []).append(span)
    out, stack, seen = [], [root.span_id], {root.span_id}
    while stack:
        for child in children.get(stack.pop(), []):
            if child.span_id not in seen:
                seen.add(child.span_id)
                out.append(child)
                stack.append(child.span_id)
    return out


def _has_genai_attributes(span: SpanRow) -> bool:
    return any(k.startswith(_GENAI_PREFIX) for k in span.span_attributes)


def _stage_union(spans: Sequence[SpanRow] | None) -> int | None:
    """Union of the intervals of one stage's spans (ns); ``None`` when the trace has none."""
    return union_ns([(s.start_ns, s.end_ns) for s in spans]) if spans else None


def _start_key(span: SpanRow) -> tuple[int, str]:
    return span.start_ns, span.span_id


def _overlap_ns(start_ns: int, end_ns: int, lo_ns: int, hi_ns: int) -> int:
    return max(0, min(end_ns, hi_ns) - max(start_ns, lo_ns))


def _self_ns(span: SpanRow, descendants: Sequence[SpanRow], lo_ns: int, hi_ns: int) -> int:
    """``span``'s self time inside ``[lo_ns, hi_ns]``: its interval minus the union of its
    descendants' intervals, everything clipped to that window (ns, ≥ 0)."""
    lo_ns, hi_ns = max(lo_ns, span.start_ns), min(hi_ns, span.end_ns)
    if hi_ns <= lo_ns:
        return 0
    inside = [(max(lo_ns, d.start_ns), min(hi_ns, d.end_ns)) for d in descendants]
    return max(0, (hi_ns - lo_ns) - union_ns(inside))


def _hop_ttft_part_ns(
    client: SpanRow, server: SpanRow, lo_ns: int, hi_ns: int, server_reading: TTFTReading | None = None
) -> int:
    """The part of one hop's overhead inside the TTFT window ``[lo_ns, hi_ns]`` (ns, ≥ 0).

    When both spans carry a TTFT (a streamed model call), each side's first-token phase is
    ``[start, start + its TTFT]``: the hop's part is client TTFT − server TTFT, i.e. the
    request's trip out plus the first token's trip back. Otherwise each side is its whole
    interval. Both sides are clipped to the window first, so a hop that encloses the span
    measuring TTFT adds nothing: its wire time lies outside that TTFT (the end user's call
    to the gateway when only the gateway measured a TTFT). ``server_reading``: the server
    side's TTFT when an engine's reader measured it (TGI's is not an attribute of its span)."""
    client_reading, server_reading = span_ttft(client), server_reading or span_ttft(server)
    if client_reading is not None and server_reading is not None:
        client_end_ns = client.start_ns + client_reading.ttft_ns
        server_end_ns = server.start_ns + server_reading.ttft_ns
    else:
        client_end_ns, server_end_ns = client.end_ns, server.end_ns
    return max(
        0,
        _overlap_ns(client.start_ns, client_end_ns, lo_ns, hi_ns)
        - _overlap_ns(server.start_ns, server_end_ns, lo_ns, hi_ns),
    )


def _first_of(values: Iterable):
    """The first value that is neither ``None`` nor ``""`` (``None`` if none); stops there."""
    for value in values:
        if value is not None and value != "":
            return value
    return None


def _http_status(span: SpanRow | None) -> int | None:
    return _int_attr(span, HTTP_STATUS)


def _failed(span: SpanRow) -> bool:
    """The span's call failed in a way a caller retries: status ERROR, HTTP 429 or ≥ 500."""
    code = _http_status(span) or 0
    return span.status_code == "Error" or code == 429 or code >= 500


def _retried(calls: Sequence[SpanRow]) -> int:
    """How many of ``calls`` (one caller's calls in start order) were attempts it retried:
    the failed ones before the first that did not fail (all but the last when all failed)."""
    k = 0
    while k < len(calls) - 1 and _failed(calls[k]):
        k += 1
    return k


_NO_ATTRIBUTES: dict[str, str] = {}
_NO_ENGINE_READING = engine_sources.EngineReading()


def _first_value(spans: Iterable[SpanRow | None], key: str) -> str | None:
    """The first non-empty value of attribute ``key`` among ``spans`` in order (``None``
    entries skipped), or ``None``. Loops, not ``_first_of(generator)``: this runs for every
    trace, and a generator costs more than the lookups."""
    for span in spans:
        if span is not None:
            value = span.span_attributes.get(key)
            if value:  # attribute values are strings: skips None and ""
                return value
    return None


def _first_resource_value(spans: Iterable[SpanRow], key: str) -> str | None:
    """The first non-empty value of resource attribute ``key`` among ``spans`` in order, or
    ``None``; a resource's map shared by consecutive spans is looked at once."""
    seen = None
    for span in spans:
        attributes = span.resource_attributes
        if attributes is not seen:
            seen = attributes
            value = attributes.get(key)
            if value:
                return value
    return None


def _first_int(spans: Iterable[SpanRow | None], names: Sequence[str]) -> int | None:
    """The first :func:`_int_attr` of ``names`` that is not ``None`` among ``spans`` in order."""
    for span in spans:
        value = _int_attr(span, names)
        if value is not None:
            return value
    return None


def assemble_request(
    spans: Sequence[SpanRow], *, updated_at: datetime | None = None, counts: DerivationCounts | None = None
) -> RequestRow | None:
    """Derive the ``inferpath_requests`` row of one trace from its spans.

    ``spans``: the spans of ONE trace, in any order, possibly with duplicates (deduplicated
    by span id). Returns ``None`` when no span plays a request role (no client GenAI call,
    gateway, engine or ``inferpath.stage`` span), e.g. a trace of engine start-up spans.
    ``updated_at``: the row version (default: now, UTC). Every derivation is the one in
    ``docs/telemetry-contract.md``; measures a trace does not carry stay ``None``. TTFT and
    ITL follow AIPerf's definitions (ITL = (E2E − TTFT) / (output tokens − 1), ≥ 2 tokens).
    TTFTs come from the sources of :mod:`inferpath.server.sources` in their precedence;
    ``ttft_source`` names the one of the TTFT readers show (client's, else server's) and
    ``missing_measures`` says why a measure is missing. ``counts`` (optional) adds up TTFT
    conflicts and ignored malformed timings met on the way.
    Raises ``ValueError`` if the spans belong to more than one trace.
    """
    by_id: dict[str, SpanRow] = {}
    for span in spans:  # the last copy of a span id wins
        by_id[span.span_id] = span
    if not by_id:
        return None
    unique = list(by_id.values())
    trace_ids = {s.trace_id for s in unique}
    if len(trace_ids) != 1:
        raise ValueError(f"spans of one trace expected, got {len(trace_ids)} trace ids")
    by_start = sorted(unique, key=_start_key)
    # One pass sorts the spans into the roles below (each list in start order).
    root_clients: list[SpanRow] = []
    llm_calls: list[SpanRow] = []  # model calls other instrumentations mark (INTERNAL spans)
    engines: list[SpanRow] = []
    by_stage: dict[str, list[SpanRow]] = {}
    for s in by_start:
        stage = s.span_attributes.get(STAGE)
        if stage is not None:
            by_stage.setdefault(stage, []).append(s)
        if sources.is_llm_call(s):
            llm_calls.append(s)
            if s.parent_span_id not in by_id:
                root_clients.append(s)
        elif s.span_kind == "Client" and s.parent_span_id not in by_id:
            root_clients.append(s)
        if engine_sources.engine_source(s) is not None:
            engines.append(s)

    gateways = [s for s in by_stage.get("gateway", ()) if s.span_kind == "Server"]
    if not root_clients and not gateways:
        # A model call inside the app's own spans (an LLM span of OpenInference or Langfuse, or
        # a GenAI CLIENT span outside inferpath's stages), with no gateway: the outermost one.
        nested = llm_calls or [
            s
            for s in by_start
            if s.span_kind == "Client" and STAGE not in s.span_attributes and _has_genai_attributes(s)
        ]
        if nested:
            root_clients = [min(nested, key=lambda s: (_depth(s, by_id), s.start_ns))]
    # Prefer the root client that carries a TTFT (the end user's streaming call).
    root_client = root_clients[0] if root_clients else None
    client_reading: TTFTReading | None = None
    for candidate in root_clients:
        client_reading = span_ttft(candidate, counts)
        if client_reading is not None:
            root_client = candidate
            break
    # The outermost gateway span; of several at that depth, failed ones first were attempts
    # a caller retried (a model server still loading): the request is the attempt after them.
    top_depth = min((_depth(s, by_id) for s in gateways), default=0)
    outermost = [s for s in gateways if _depth(s, by_id) == top_depth]
    gateway = outermost[_retried(outermost)] if outermost else None
    engine = engines[_retried(engines)] if engines else None
    model_clients = [s for s in by_stage.get("model", ()) if s.span_kind == "Client"]
    genai_client = root_client is not None and (sources.is_llm_call(root_client) or _has_genai_attributes(root_client))
    if not (gateway or engine or by_stage or genai_client):
        return None

    # The attributes of the spans that play a role ({} for a role no span plays).
    client_attrs = root_client.span_attributes if root_client is not None else _NO_ATTRIBUTES
    gateway_attrs = gateway.span_attributes if gateway is not None else _NO_ATTRIBUTES
    engine_attrs = engine.span_attributes if engine is not None else _NO_ATTRIBUTES

    # Client-side view of the end user.
    client_ttft_ns = client_reading.ttft_ns if client_reading is not None else None
    client_e2e_ns = root_client.duration_ns if root_client is not None else None

    # The engine's own measures (engine_sources: vLLM, SGLang, TGI), its descendants on demand.
    engine_reading = (
        engine_sources.read_engine(
            engine, lambda: _descendants(engine, unique), counts if counts is not None else DerivationCounts()
        )
        if engine is not None
        else _NO_ENGINE_READING
    )

    # Server-side TTFT/E2E: the gateway's, else the engine's own measurement.
    e2e_ns: int | None
    if gateway is not None:
        server_reading = span_ttft(gateway, counts)
        e2e_ns = gateway.duration_ns
    else:
        server_reading = engine_reading.ttft
        e2e_ns = engine_reading.e2e_ns
    ttft_ns = server_reading.ttft_ns if server_reading is not None else None
    shown_reading = client_reading or server_reading

    # Stage times: the engine's own measure, else the union of the stage's spans (tokenize:
    # the spans first).
    engine_decode_ns = engine_reading.decode_ns
    queue_ns = _first_of((engine_reading.queue_ns, _stage_union(by_stage.get("queue"))))
    prefill_ns = _first_of((engine_reading.prefill_ns, _stage_union(by_stage.get("prefill"))))
    decode_ns = _first_of((engine_decode_ns, _stage_union(by_stage.get("decode"))))
    tokenize_ns = _first_of((_stage_union(by_stage.get("tokenize")), engine_reading.tokenize_ns))

    input_tokens = _first_int(
        (gateway, root_client, *model_clients, *by_stage.get("tokenize", ()), engine), INPUT_TOKENS
    )
    output_tokens = _first_int((gateway, root_client, *model_clients, engine), OUTPUT_TOKENS)
    if output_tokens is None:
        output_tokens = engine_reading.output_tokens
    if (input_tokens is None or output_tokens is None) and root_client is not None:
        langfuse_input, langfuse_output = sources.langfuse_usage_tokens(root_client)
        input_tokens = input_tokens if input_tokens is not None else langfuse_input
        output_tokens = output_tokens if output_tokens is not None else langfuse_output

    itl_ns = seconds_to_ns(gateway_attrs.get(ITL_SECONDS))
    if itl_ns is None and engine is not None:
        engine_tokens = engine_reading.output_tokens
        if engine_decode_ns is not None and engine_tokens is not None and engine_tokens >= 2:
            itl_ns = round(engine_decode_ns / (engine_tokens - 1))
    if itl_ns is None and root_client is not None:
        # Client-only rows (another instrumentation, no server span): the client's own ITL,
        # else AIPerf's (E2E − TTFT) / (output tokens − 1) on the client's measures.
        itl_ns = seconds_to_ns(client_attrs.get(ITL_SECONDS))
        if itl_ns is None and client_ttft_ns is not None and output_tokens is not None and output_tokens >= 2:
            itl_ns = round(max(0, root_client.duration_ns - client_ttft_ns) / (output_tokens - 1))

    model_ns = _stage_union(model_clients)

    # A hop: the caller's CLIENT span and the callee's SERVER span of the same call; the
    # difference is time on the wire plus the callee's framework before/after its span.
    # An engine's request span under a CLIENT span is the callee's side of a hop too, whatever
    # its kind (SGLang's and TGI's are INTERNAL).
    # A CLIENT span with several callee spans: failed ones before the first that did not fail
    # were attempts it retried. Its hop is to that callee, less the time from the first
    # attempt's start to its start (failed attempts, the caller's back-off: retrying is not
    # the wire; it stays outside every stage, ``rest``); later callees are hops of their own.
    callees: dict[str, list[SpanRow]] = {}
    for s in by_start:
        if (s.span_kind == "Server" or s is engine) and s.parent_span_id in by_id:
            if by_id[s.parent_span_id].span_kind == "Client":
                callees.setdefault(s.parent_span_id, []).append(s)
    hops: list[tuple[SpanRow, SpanRow, tuple[int, int]]] = []
    for client_id, calls in callees.items():
        k = _retried(calls)
        hops.append((by_id[client_id], calls[k], (calls[0].start_ns, calls[k].start_ns)))
        hops += [(by_id[client_id], call, (0, 0)) for call in calls[k + 1 :]]
    network_ns = (
        sum(max(0, c.duration_ns - srv.duration_ns - (retry[1] - retry[0])) for c, srv, retry in hops) if hops else None
    )
    # The hop into the engine, its trip out: what held the call before the engine's span began
    # (the wire, a connection pool or proxy in front of it, its server before the span).
    engine_send_ns = next(
        (max(0, srv.start_ns - c.start_ns - (retry[1] - retry[0])) for c, srv, retry in hops if srv is engine), None
    )

    gateway_ns = gateway_ttft_ns = network_ttft_ns = None
    # The TTFT window of the judged TTFT (vocabulary.CLIENT_FIRST_SQL): the root client's
    # start → its first token when it measured one, so that its hop to the first server is a
    # stage of it; else the gateway's, else the engine's (same clock as the span stamps).
    measuring = gateway if gateway is not None else engine
    window = None
    if root_client is not None and client_ttft_ns is not None:
        window = (root_client.start_ns, root_client.start_ns + client_ttft_ns)
    elif measuring is not None and ttft_ns is not None:
        window = (measuring.start_ns, measuring.start_ns + ttft_ns)
    if gateway is not None:
        inner = _descendants(gateway, unique)
        gateway_ns = _self_ns(gateway, inner, gateway.start_ns, gateway.end_ns)
        if window is not None:
            gateway_ttft_ns = _self_ns(gateway, inner, *window)
    if window is not None and hops:
        network_ttft_ns = sum(
            max(
                0,
                _hop_ttft_part_ns(c, srv, *window, engine_reading.ttft if srv is engine else None)
                - _overlap_ns(*retry, *window),
            )
            for c, srv, retry in hops
        )

    top = [s for s in (gateway, root_client, engine) if s is not None]
    http_status_code = _first_of((_http_status(gateway), _http_status(root_client))) or 0
    if any(s.status_code == "Error" for s in top) or http_status_code >= 500:
        status = "error"
    elif any(s.span_attributes.get(STREAM_STATUS) == "incomplete" for s in top):
        status = "incomplete"
    else:
        status = "ok"

    main = gateway or root_client or engine or by_start[0]
    # Lazily, in order (``or`` skips ``None`` and ``""`` as _first does: values are strings).
    endpoint = gateway_attrs.get(ENDPOINT) or gateway_attrs.get(HTTP_ROUTE) or ""
    # The two walks over every span run only when the gateway names no class.
    endpoint_class = (
        gateway_attrs.get(ENDPOINT_CLASS)
        or (gateway.resource_attributes.get(ENDPOINT_CLASS) if gateway is not None else None)
        or _first_resource_value(by_start, ENDPOINT_CLASS)
        or _first_value(by_start, ENDPOINT_CLASS)
    ) or ""
    model = (
        _first_value((*model_clients, root_client, gateway, engine), GEN_AI_REQUEST_MODEL)
        or engine_attrs.get(GEN_AI_RESPONSE_MODEL)
        or client_attrs.get(sources.OPENINFERENCE_MODEL)
        or client_attrs.get(sources.LANGFUSE_MODEL)
        or UNKNOWN_MODEL
    )
    model_version = _first_value((engine, *model_clients, root_client), GEN_AI_RESPONSE_MODEL) or ""
    replica = (_first_of(engine.resource_attributes.get(name) for name in REPLICA) if engine else None) or ""

    return RequestRow(
        timestamp=by_start[0].timestamp,
        trace_id=main.trace_id,
        service_name=main.service_name,
        endpoint=endpoint,
        endpoint_class=endpoint_class,
        model=model,
        model_version=model_version,
        replica=replica,
        status=status,
        http_status_code=int(http_status_code),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        client_ttft_ns=client_ttft_ns,
        client_e2e_ns=client_e2e_ns,
        ttft_ns=ttft_ns,
        e2e_ns=e2e_ns,
        itl_ns=itl_ns,
        gateway_ns=gateway_ns,
        tokenize_ns=tokenize_ns,
        retrieval_ns=_stage_union(by_stage.get("retrieval")),
        queue_ns=queue_ns,
        prefill_ns=prefill_ns,
        decode_ns=decode_ns,
        model_ns=model_ns,
        network_ns=network_ns,
        postprocess_ns=_stage_union(by_stage.get("postprocess")),
        gateway_ttft_ns=gateway_ttft_ns,
        network_ttft_ns=network_ttft_ns,
        ttft_source=shown_reading.source if shown_reading is not None else "",
        engine_send_ns=engine_send_ns,
        missing_measures=sources.missing_measures(
            client=root_client,
            gateway=gateway,
            engine=engine,
            ttft_ns=client_ttft_ns if client_ttft_ns is not None else ttft_ns,
            e2e_ns=client_e2e_ns if client_e2e_ns is not None else e2e_ns,
            output_tokens=output_tokens,
            itl_ns=itl_ns,
            engine_ttft_reason=engine_sources.missing_ttft_reason(engine) if engine is not None else None,
        ),
        span_count=len(unique),
        updated_at=updated_at or datetime.now(timezone.utc),
    )
