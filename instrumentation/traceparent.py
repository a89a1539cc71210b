"""The caller's trace context from raw ASGI headers, read without a carrier dict.

W3C Trace Context (https://www.w3.org/TR/trace-context/): ``traceparent`` is
``{version}-{trace-id}-{parent-id}-{flags}``, lower-case hex, 55 characters for version
``00``. Almost every caller sends exactly that, so it is matched directly (one anchored
regular expression, no header decoding besides the one value); anything else (another
version, surrounding blanks, a malformed value) goes to the OTel SDK's
``TraceContextTextMapPropagator``, so the answer is the propagator's in every case: a
value it rejects gives ``None`` here too.

Several ``tracestate`` header lines are joined with ``,`` as RFC 9110 §5.3 says, and
parsed by the SDK's ``TraceState.from_header`` only when present. Several ``traceparent``
lines join into a value that is not a ``traceparent``, so the request has no valid parent
and starts a new trace (the W3C Trace Context test suite's ``traceparent`` duplicated case;
the SDK's ASGI getter would take the first line).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.span import TraceState

from inferpath.instrumentation import provider

__all__ = ["parent_context", "PROPAGATION_HEADERS"]

#: The request headers read (ASGI header names are lower-case bytes).
PROPAGATION_HEADERS = (b"traceparent", b"tracestate")
_LENGTHS = frozenset(len(name) for name in PROPAGATION_HEADERS)
_VERSION_00 = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE_ID = "0" * 32
_ZERO_SPAN_ID = "0" * 16
# The SDK's limit on the joined tracestate (W3C: 512 characters).
_MAX_TRACESTATE_CHARS = 512
_FLAGS = {value: trace.TraceFlags(value) for value in range(256)}


def parent_context(headers: Iterable[tuple[bytes, bytes]]) -> Context | None:
    """The context of the caller's span from ASGI ``headers`` (``(name, value)`` byte
    pairs), or ``None`` when there is no valid ``traceparent`` (none, several, malformed).

    The result holds a ``NonRecordingSpan`` with the remote ``SpanContext``
    (``is_remote=True``), as ``TraceContextTextMapPropagator.extract`` builds it. Header
    names are compared lower-cased (servers that do not lower-case them are accepted);
    values are decoded as Latin-1, as ASGI defines. Never raises for bad input.
    """
    traceparent: bytes | None = None
    duplicated = False
    tracestate: list[str] | None = None
    for name, value in headers:
        # Lower-case a name only when its length could match one of the two headers.
        if len(name) in _LENGTHS:
            lowered = name.lower()
            if lowered == b"traceparent":
                duplicated = traceparent is not None
                traceparent = value
            elif lowered == b"tracestate":
                if tracestate is None:
                    tracestate = []
                tracestate.append(value.decode("latin-1"))
    if traceparent is None or duplicated:
        return None
    header = traceparent.decode("latin-1")
    match = _VERSION_00.fullmatch(header)
    if match is None:
        return _extract_with_propagator(header, tracestate)
    trace_id_hex, span_id_hex, flags_hex = match.groups()
    if trace_id_hex == _ZERO_TRACE_ID or span_id_hex == _ZERO_SPAN_ID:
        return None
    state = None
    if tracestate is not None:
        if sum(map(len, tracestate)) + len(tracestate) - 1 <= _MAX_TRACESTATE_CHARS:
            state = TraceState.from_header(tracestate)
    span_context = trace.SpanContext(
        trace_id=int(trace_id_hex, 16),
        span_id=int(span_id_hex, 16),
        is_remote=True,
        trace_flags=_FLAGS[int(flags_hex, 16)],
        trace_state=state,
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context), Context())


def _extract_with_propagator(header: str, tracestate: list[str] | None) -> Context | None:
    carrier: dict[str, object] = {"traceparent": header}
    if tracestate is not None:
        carrier["tracestate"] = tracestate
    context = provider.PROPAGATOR.extract(carrier)
    span_context = trace.get_current_span(context).get_span_context()
    return context if span_context.is_valid else None
