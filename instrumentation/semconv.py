"""Span attribute names of docs/telemetry-contract.md, and the stream-result writer.

OTel GenAI / HTTP semantic-convention names where one exists, ``inferpath.*`` otherwise.
The names are the vocabulary's (:mod:`inferpath.vocabulary`, where the server reads them
too); the values of ``inferpath.stage`` are its :data:`~inferpath.vocabulary.STAGES`.
"""

from __future__ import annotations

from typing import Any

from inferpath.vocabulary import (  # noqa: F401 - the contract's names, written here
    ENDPOINT,
    ENDPOINT_CLASS,
    ERROR_TYPE,
    GEN_AI_OPERATION_NAME,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_TIME_TO_FIRST_CHUNK,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    HTTP_REQUEST_METHOD,
    HTTP_RESPONSE_STATUS_CODE,
    HTTP_ROUTE,
    ITL_SECONDS,
    RETRIEVAL_DOCUMENTS,
    SERVER_ADDRESS,
    SERVER_PORT,
    STAGE,
    STREAM_CHUNKS,
    STREAM_INCOMPLETE_REASON,
    STREAM_STATUS,
    URL_PATH,
    URL_SCHEME,
)

STATUS_COMPLETE = "complete"
STATUS_INCOMPLETE = "incomplete"

# Reasons written to inferpath.stream.incomplete_reason.
REASON_NO_VISIBLE_TOKEN = "no_visible_token"
REASON_CLIENT_DISCONNECT = "client_disconnect"
REASON_CANCELLED = "cancelled"
REASON_CONSUMER_STOPPED = "consumer_stopped"
REASON_RESPONSE_NOT_FINISHED = "response_not_finished"
# An OpenAI-shaped stream whose body ended with neither a finish_reason nor ``data: [DONE]``:
# cut short (a close-delimited body that lost its connection reads as a normal end).
REASON_STREAM_NOT_FINISHED = "stream_not_finished"
REASON_ERROR = "error"


def stream_result_attributes(meter: Any, status: str, reason: str | None) -> dict[str, Any]:
    """Attributes of a finished (or abandoned) stream measured by a ``ChatStreamMeter``.

    TTFT and ITL only appear when defined (a visible token; ≥ 2 output tokens), so the
    assembler can tell "not measured" from zero. Seconds, from the monotonic clock.
    """
    timeline = meter.timeline
    attributes: dict[str, Any] = {STREAM_STATUS: status, STREAM_CHUNKS: meter.data_events}
    if meter.chat_chunks or timeline.usage_output_tokens is not None:
        attributes[GEN_AI_USAGE_OUTPUT_TOKENS] = timeline.output_tokens
    if reason is not None:
        attributes[STREAM_INCOMPLETE_REASON] = reason
    ttft = timeline.ttft_seconds
    if ttft is not None:
        attributes[GEN_AI_TIME_TO_FIRST_CHUNK] = ttft
    itl = timeline.itl_seconds
    if itl is not None:
        attributes[ITL_SECONDS] = itl
    if timeline.usage_input_tokens is not None:
        attributes[GEN_AI_USAGE_INPUT_TOKENS] = timeline.usage_input_tokens
    if meter.response_model:
        attributes[GEN_AI_RESPONSE_MODEL] = meter.response_model
    if meter.finish_reasons:
        attributes[GEN_AI_RESPONSE_FINISH_REASONS] = list(dict.fromkeys(meter.finish_reasons))
    return attributes


def finished_stream_status(meter: Any, *, only_if_chat: bool = False) -> tuple[str, str | None]:
    """Status of a stream that reached its end: complete, or incomplete because not one
    visible token came (a generation with no output is not a completed generation), or
    because OpenAI-shaped chunks came but neither a ``finish_reason`` nor ``data: [DONE]``
    (the OpenAI streaming format ends every generation with both; a body that stops
    without them was cut short, which a close-delimited HTTP body cannot tell otherwise).

    ``only_if_chat``: apply these rules only when the stream carried OpenAI-shaped
    chunks, so a gateway's non-LLM event streams are simply complete.
    Returns ``(status, reason)``: ``("complete", None)`` or ``("incomplete", REASON_*)``.
    """
    if only_if_chat and meter.chat_chunks == 0:
        return STATUS_COMPLETE, None
    if meter.timeline.first_token_ns is None:
        return STATUS_INCOMPLETE, REASON_NO_VISIBLE_TOKEN
    if meter.chat_chunks and not meter.finish_reasons and not meter.done:
        return STATUS_INCOMPLETE, REASON_STREAM_NOT_FINISHED
    return STATUS_COMPLETE, None


_OTEL_SCALARS = (bool, str, int, float)


def _scalar_value(value: Any) -> Any:
    """``value`` as a Python scalar when it is a NumPy scalar, ``Decimal`` or ``bytes``."""
    kind = type(value)
    if kind in _OTEL_SCALARS:
        return value
    module = kind.__module__
    if (module == "numpy" or module.startswith("numpy.")) and hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        if getattr(value, "itemsize", 8) < 8 and kind.__name__.startswith("float"):
            # np.float32(0.7).item() is 0.699999988...; its shortest text is the value meant.
            return float(str(value))
        return value.item()  # np.int64(5) -> 5, np.bool_(True) -> True, np.float64 -> float
    for plain in _OTEL_SCALARS:  # a subclass (an IntEnum, a str subclass): the plain type
        if isinstance(value, plain):
            return plain(value)
    if kind.__name__ == "Decimal":
        return float(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value


def attribute_value(value: Any) -> Any:
    """``value`` as OpenTelemetry takes it: bool, str, int, float, or a homogeneous sequence
    of one of them; ``None`` when it cannot be an attribute (``None`` itself).

    NumPy scalars and arrays (and ``Decimal``, ``bytes``) become Python values: the SDK
    refuses them with an "Invalid type" warning. A sequence mixing ints and floats becomes
    floats; one mixing other types, a mapping or any other object becomes its ``str()``.
    """
    if value is None:
        return None
    value = _scalar_value(value)
    if isinstance(value, _OTEL_SCALARS):
        return value
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # NumPy/pandas arrays
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        items = [_scalar_value(item) for item in value]
        kinds = {type(item) for item in items if item is not None}
        if kinds <= {int, float} and float in kinds:
            return [None if item is None else float(item) for item in items]
        if len(kinds) <= 1 and kinds <= set(_OTEL_SCALARS):
            return items
    return str(value)


def coerce_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """``attributes`` with every value through :func:`attribute_value`; ``None`` values left
    out. Never raises: a value whose conversion fails is kept as ``<unconvertible TYPE>``."""
    out = {}
    for key, value in attributes.items():
        try:
            coerced = attribute_value(value)
        except Exception:  # noqa: BLE001 - an odd user object must not break the request path
            coerced = f"<unconvertible {type(value).__name__}>"
        if coerced is not None:
            out[key] = coerced
    return out
