"""OTLP/HTTP request bodies: content negotiation, gzip, OTLP/JSON checks, responses.

Reference: the OTLP specification, "OTLP/HTTP" (binary protobuf ``application/x-protobuf``,
JSON ``application/json``; ``Content-Encoding: gzip``; the JSON mapping differs from proto3
JSON in that ``traceId``/``spanId`` are hex strings, not base64).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
import zlib
from collections.abc import Iterator
from typing import Any, Literal

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

__all__ = [
    "OTLPDecodeError",
    "UnsupportedMediaTypeError",
    "BodyTooLargeError",
    "BodyFormat",
    "body_format",
    "decompress",
    "parse_message",
    "encode_message",
    "MAX_DECOMPRESSED_BYTES",
]

# A gzip body can expand a thousandfold; cap what one request may inflate to.
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024

BodyFormat = Literal["protobuf", "json"]
Signal = Literal["traces", "metrics"]


class OTLPDecodeError(ValueError):
    """A malformed OTLP body; the message names what is wrong and where (a JSON-like path)."""


class UnsupportedMediaTypeError(OTLPDecodeError):
    """A ``Content-Type`` or ``Content-Encoding`` the receiver does not speak (HTTP 415)."""


class BodyTooLargeError(OTLPDecodeError):
    """A compressed body that inflates past the limit (HTTP 413, as a raw body over
    ``max_body_bytes`` is)."""


def body_format(content_type: str | None) -> BodyFormat:
    """Map a ``Content-Type`` header to ``"protobuf"`` or ``"json"``; parameters are ignored.

    Raises :class:`UnsupportedMediaTypeError` for anything else (including a missing header).
    """
    if not (content_type or "").strip():
        raise UnsupportedMediaTypeError("missing Content-Type: use application/x-protobuf or application/json")
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media in ("application/x-protobuf", "application/protobuf"):
        return "protobuf"
    if media == "application/json":
        return "json"
    raise UnsupportedMediaTypeError(
        f"unsupported Content-Type {content_type!r}: use application/x-protobuf or application/json"
    )


def decompress(body: bytes, content_encoding: str | None, max_bytes: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """Undo ``Content-Encoding`` (``gzip``, ``deflate`` or ``identity``/none).

    Raises :class:`BodyTooLargeError` for a stream inflating past ``max_bytes``,
    :class:`OTLPDecodeError` for a corrupt one, :class:`UnsupportedMediaTypeError` for an
    unknown encoding.
    """
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise UnsupportedMediaTypeError(
            f"unsupported Content-Encoding {content_encoding!r}: use gzip, deflate or identity"
        )
    # wbits 47 = auto-detect zlib or gzip header; deflate bodies in the wild are zlib-wrapped.
    # A gzip body may hold several members (RFC 1952), inflated one after the other; bytes
    # after the last stream that are not another member are an error, as is a cut stream.
    parts: list[bytes] = []
    size, rest = 0, body
    while True:
        inflater = zlib.decompressobj(47 if encoding != "deflate" else 15)
        try:
            out = inflater.decompress(rest, max_bytes - size + 1)
        except zlib.error as exc:
            raise OTLPDecodeError(f"body is not valid {encoding}: {exc}") from None
        size += len(out)
        if size > max_bytes:
            raise BodyTooLargeError(f"{encoding} body inflates past {max_bytes} bytes")
        if not inflater.eof:
            raise OTLPDecodeError(f"body is not valid {encoding}: stream is truncated")
        parts.append(out)
        rest = inflater.unused_data
        if not rest:
            return b"".join(parts)
        if encoding == "deflate" or not rest.startswith(b"\x1f\x8b"):
            raise OTLPDecodeError(f"body is not valid {encoding}: {len(rest)} bytes follow the end of the stream")


@functools.cache
def _snake(camel: str) -> str:
    return re.sub("([A-Z])", r"_\1", camel).lower()


def _get(obj: dict, camel: str) -> tuple[str | None, Any]:
    """``(key, value)`` of the field named ``camel`` in lowerCamelCase or snake_case;
    ``(None, None)`` when it is absent."""
    for key in (camel, _snake(camel)):
        if key in obj:
            return key, obj[key]
    return None, None


def _objects_at(obj: dict, camel: str, path: str) -> list[tuple[str, dict]]:
    """``[(path, object)]`` of the array at ``obj[camel]`` (none when absent or ``null``).
    Raises :class:`OTLPDecodeError` for a value that is not an array of objects."""
    where = f"{path}.{camel}" if path else camel
    value = _get(obj, camel)[1]
    if value is None:
        return []
    if not isinstance(value, list):
        raise OTLPDecodeError(f"{where}: expected an array, got {type(value).__name__}")
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise OTLPDecodeError(f"{where}[{index}]: expected an object, got {type(item).__name__}")
    return [(f"{where}[{index}]", item) for index, item in enumerate(value)]


def _object_at(obj: dict, camel: str, path: str) -> dict | None:
    """The message at ``obj[camel]``: ``None`` when absent or ``null``; raises
    :class:`OTLPDecodeError` for anything but an object (the parser would drop it silently)."""
    value = _get(obj, camel)[1]
    if value is not None and not isinstance(value, dict):
        raise OTLPDecodeError(f"{path}.{camel}: expected an object, got {type(value).__name__}")
    return value


def _convert_ids(obj: dict, path: str, fields: tuple[tuple[str, int], ...]) -> None:
    """OTLP/JSON's hex ids in ``obj`` to the base64 that proto3 JSON expects, in place;
    ``fields``: ``(name, hex digits)``. Raises :class:`OTLPDecodeError` for a bad id."""
    for camel, digits in fields:
        key, value = _get(obj, camel)
        if key is None or value is None or value == "":
            continue
        where = f"{path}.{camel}"
        if not isinstance(value, str):
            raise OTLPDecodeError(f"{where}: expected a hex string, got {type(value).__name__}")
        if len(value) != digits:
            raise OTLPDecodeError(f"{where}: expected {digits} hex digits, got {len(value)} ({value[:40]!r})")
        try:
            obj[key] = base64.b64encode(binascii.unhexlify(value)).decode("ascii")
        except (binascii.Error, ValueError):
            raise OTLPDecodeError(f"{where}: not a hex string ({value[:40]!r})") from None


# Each signal's export: top-level array, scope array, item array, item message.
_LEVELS: dict[str, tuple[str, str, str, type[Message]]] = {
    "traces": ("resourceSpans", "scopeSpans", "spans", Span),
    "metrics": ("resourceMetrics", "scopeMetrics", "metrics", Metric),
}
_SPAN_IDS = (("traceId", 32), ("spanId", 16), ("parentSpanId", 16))
_LINK_IDS = _SPAN_IDS[:2]
_SPAN_KINDS = frozenset(Span.SpanKind.keys())
_STATUS_CODES = frozenset(Status.StatusCode.keys())
_METRIC_KINDS = ("gauge", "sum", "histogram", "exponentialHistogram", "summary")
_INT32 = (-(1 << 31), (1 << 31) - 1)
_INTEGER_TEXT = re.compile(r"\s*-?[0-9]{1,10}\s*")  # what int() takes, at most int32's digits
_UNSIGNED_TEXT = re.compile(r"^\d+$")
_SHOWN = 64  # characters of an offending value quoted in a message


def _walk(document: dict, signal: Signal) -> Iterator[tuple[str, type[Message], Any]]:
    """Each resource, scope and span or metric of an OTLP/JSON export, depth first, as
    ``(path, message type, object or None)``. Raises :class:`OTLPDecodeError` naming an
    array or object of the wrong type."""
    top, scopes, items, item_type = _LEVELS[signal]
    for rpath, resource in _objects_at(document, top, ""):
        yield f"{rpath}.resource", Resource, _object_at(resource, "resource", rpath)
        for spath, scope in _objects_at(resource, scopes, rpath):
            yield f"{spath}.scope", InstrumentationScope, _object_at(scope, "scope", spath)
            for path, item in _objects_at(scope, items, spath):
                yield path, item_type, item


def _check_enum(obj: dict, key: str, names: frozenset[str], what: str, path: str, label: str, found: list[str]) -> None:
    """Check the OTLP/JSON enum ``obj[key]`` (named ``path.label``) in place. proto3 JSON
    takes a name or an integer, also as text: a known name or an int32 number stays (an
    undefined number is warned about after parsing, as in protobuf; an integral float
    becomes its int). An unknown name is removed, with ``"{label}: …"`` appended to
    ``found``, since the parser would drop it silently. Raises :class:`OTLPDecodeError`
    for another type (bool, fraction, object, array) or a number outside int32, which the
    parser would truncate, wrap or quote whole."""
    value = obj.get(key)
    if value is None:
        return
    if isinstance(value, str):
        if value in names:
            return
        if not _INTEGER_TEXT.fullmatch(value):
            del obj[key]
            found.append(f"{label}: unknown {what} {value[:_SHOWN]!r}, stored as the default")
            return
        value = int(value)
    elif isinstance(value, float) and value.is_integer() and _INT32[0] <= value <= _INT32[1]:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise OTLPDecodeError(
            f"{path}.{label}: expected a {what} name or integer, got {type(value).__name__} ({repr(value)[:_SHOWN]})"
        )
    if not _INT32[0] <= value <= _INT32[1]:
        raise OTLPDecodeError(f"{path}.{label}: {what} {str(value)[:_SHOWN]} is outside the int32 range of an enum")
    obj[key] = value


def _check_event_time(event: dict, label: str, found: list[str]) -> None:
    """An event whose ``timeUnixNano`` is not a whole number (``"abc"``, ``1.5``, ``true``)
    loses that field, with a warning in ``found``: the event is kept without a time (as a
    protobuf event without one) rather than losing the export. Request derivation ignores
    and counts events without a valid time."""
    key, value = _get(event, "timeUnixNano")
    if key is None or value is None:
        return
    if isinstance(value, bool) or not (
        (isinstance(value, int) and value >= 0)
        or (isinstance(value, float) and value.is_integer() and value >= 0)
        or (isinstance(value, str) and _UNSIGNED_TEXT.match(value))
    ):
        del event[key]
        found.append(f"{label}.timeUnixNano: {value!r} is not a time in ns; the event is kept without a time")


def _prepare_span(span: dict, path: str) -> list[str]:
    """Make one OTLP/JSON span ready for the proto3 JSON parser, in place: hex ids to the
    base64 it expects, kind and status code checked (:func:`_check_enum`), event times
    checked. Returns its warnings; raises :class:`OTLPDecodeError` naming the path."""
    _convert_ids(span, path, _SPAN_IDS)
    found: list[str] = []
    _check_enum(span, "kind", _SPAN_KINDS, "span kind", path, "kind", found)
    status = _object_at(span, "status", path)
    if status is not None:
        _check_enum(status, "code", _STATUS_CODES, "status code", path, "status.code", found)
    for epath, event in _objects_at(span, "events", path):
        _check_event_time(event, epath[len(path) + 1 :], found)
    for lpath, link in _objects_at(span, "links", path):
        _convert_ids(link, lpath, _LINK_IDS)
    return found


def _prepare_metric(metric: dict, path: str) -> None:
    """The hex ids of one OTLP/JSON metric's exemplars to base64, in place."""
    for kind in _METRIC_KINDS:
        data = _get(metric, kind)[1]
        if isinstance(data, dict):
            for ppath, point in _objects_at(data, "dataPoints", f"{path}.{kind}"):
                for epath, exemplar in _objects_at(point, "exemplars", ppath):
                    _convert_ids(exemplar, epath, _LINK_IDS)


_PARSE_STEP = re.compile(r"Failed to parse (\w+) field: ")


def _described(exc: json_format.ParseError, path: str = "") -> str:
    """protobuf's nested ``Failed to parse X field: Failed to parse Y field: reason.`` as
    ``path.X.Y: reason``, the reason cut to 200 characters."""
    text, fields = str(exc), [path] if path else []
    while match := _PARSE_STEP.match(text):
        fields.append(match.group(1))
        text = text[match.end() :]
    reason = text.rstrip(".")
    if len(reason) > 200:
        reason = f"{reason[:200]}… ({len(reason)} characters)"
    return f"{'.'.join(fields)}: {reason}" if fields else reason


def _located(document: dict, signal: Signal) -> str | None:
    """After the whole document failed to parse: ``path.field…: reason`` of the first
    resource, scope, span or metric that fails alone (``None`` if none does), so that a
    malformed body is answered with the index of the item to fix."""
    for path, message_type, value in _walk(document, signal):
        if value is None:
            continue
        try:
            json_format.ParseDict(value, message_type(), ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            return _described(exc, path)
        except (RecursionError, TypeError, ValueError, AttributeError):
            continue
    return None


# The top-level field of each OTLP export, to say which signal a misrouted body carries.
_EXPORTS = {
    "resourceSpans": ("traces", "/v1/traces"),
    "resourceMetrics": ("metrics", "/v1/metrics"),
    "resourceLogs": ("logs", "/v1/logs"),
    "resourceProfiles": ("profiles", "/v1development/profiles"),
}
_SIGNAL_OF_FIELD = {field: export for camel, export in _EXPORTS.items() for field in (camel, _snake(camel))}


def _check_top_level(document: dict, signal: Signal, name: str) -> None:
    """Refuse a non-empty JSON object without this signal's top-level field: the parser
    ignores unknown fields, so a logs export posted to ``/v1/traces`` would parse as an
    empty trace export and its data be lost. An empty object is a valid empty export.
    Raises :class:`OTLPDecodeError` naming what was found."""
    top = _LEVELS[signal][0]
    if not document or top in document or _snake(top) in document:
        return
    keys = sorted(map(str, document))
    shown = ", ".join(repr(k[:64]) for k in keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    other = next((_SIGNAL_OF_FIELD[k] for k in keys if k in _SIGNAL_OF_FIELD), None)
    hint = ""
    if other is not None:
        hint = f": an OTLP {other[0]} export, which belongs at {other[1]}" + (
            "" if other[0] in _LEVELS else " (inferpath accepts traces and metrics only)"
        )
    raise OTLPDecodeError(f"JSON body is not an {name}: no {top} at the top level, found {shown}{hint}")


def parse_message(
    payload: bytes,
    fmt: BodyFormat,
    message: Message,
    signal: Signal,
    warnings: dict[str, list[str]] | None = None,
) -> Message:
    """Fill ``message`` (an ``Export*ServiceRequest``) from a decompressed body.

    JSON follows the OTLP/JSON mapping: lowerCamelCase (snake_case also accepted), enums as
    ints or names, 64-bit ints as strings or numbers, ids as hex; unknown fields are ignored
    as the specification requires, but a non-empty object without this signal's top-level
    field (e.g. a logs export's ``resourceLogs``) is refused. An unknown span kind or status
    code name leaves the default, with a message in ``warnings[span path]``
    (``resourceSpans[i].scopeSpans[j].spans[k]``). Raises :class:`OTLPDecodeError` naming
    the problem.
    """
    name = type(message).__name__
    if fmt == "protobuf":
        try:
            message.ParseFromString(payload)
        except (DecodeError, ValueError) as exc:
            raise OTLPDecodeError(f"body is not a valid protobuf {name}: {exc}") from None
        return message
    try:
        try:
            document = json.loads(payload)
        except ValueError as exc:  # UnicodeDecodeError included
            raise OTLPDecodeError(f"body is not valid JSON: {exc}") from None
        if not isinstance(document, dict):
            raise OTLPDecodeError(f"JSON body must be an object ({name}), got {type(document).__name__}")
        _check_top_level(document, signal, name)
        # Ready for the proto3 JSON parser, in place: ids from hex, enums and event times checked.
        for path, message_type, item in _walk(document, signal):
            if message_type is Span:
                found = _prepare_span(item, path)
                if found and warnings is not None:
                    warnings[path] = found
            elif message_type is Metric:
                _prepare_metric(item, path)
        try:
            json_format.ParseDict(document, message, ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            located = _located(document, signal) or _described(exc)
            raise OTLPDecodeError(f"invalid OTLP/JSON {name}: {located}") from None
    except RecursionError:  # the parsers recurse per level of nesting; OTLP needs fewer than 20
        raise OTLPDecodeError("JSON body is nested too deeply to decode") from None
    return message


def encode_message(message: Message, fmt: BodyFormat) -> bytes:
    """Serialize a response message in the request's format (OTLP/JSON uses camelCase)."""
    if fmt == "protobuf":
        return message.SerializeToString()
    return json.dumps(json_format.MessageToDict(message), separators=(",", ":")).encode()
