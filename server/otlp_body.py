"""OTLP/HTTP request bodies: content negotiation, gzip, JSON id conversion, responses.

Reference: the OTLP specification, "OTLP/HTTP" (binary protobuf ``application/x-protobuf``,
JSON ``application/json``; ``Content-Encoding: gzip``; the JSON mapping differs from proto3
JSON in that ``traceId``/``spanId`` are hex strings, not base64).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
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
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media in ("application/x-protobuf", "application/protobuf"):
        return "protobuf"
    if media == "application/json":
        return "json"
    if not media and not (content_type or "").strip():
        raise UnsupportedMediaTypeError("missing Content-Type: use application/x-protobuf or application/json")
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


def _hex_to_base64(value: Any, path: str, hex_digits: int) -> str:
    if not isinstance(value, str):
        raise OTLPDecodeError(f"{path}: expected a hex string, got {type(value).__name__}")
    if value == "":
        return ""
    if len(value) != hex_digits:
        raise OTLPDecodeError(f"{path}: expected {hex_digits} hex digits, got {len(value)} ({value[:40]!r})")
    try:
        raw = binascii.unhexlify(value)
    except (binascii.Error, ValueError):
        raise OTLPDecodeError(f"{path}: not a hex string ({value[:40]!r})") from None
    return base64.b64encode(raw).decode("ascii")


def _get(obj: dict, camel: str, snake: str) -> tuple[str | None, Any]:
    for key in (camel, snake):
        if key in obj:
            return key, obj[key]
    return None, None


def _list_at(obj: dict, camel: str, snake: str, path: str) -> list:
    key, value = _get(obj, camel, snake)
    if key is None or value is None:
        return []
    if not isinstance(value, list):
        raise OTLPDecodeError(f"{path + '.' if path else ''}{camel}: expected an array, got {type(value).__name__}")
    return value


def _objects(items: list, path: str) -> list[tuple[str, dict]]:
    out = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise OTLPDecodeError(f"{path}[{index}]: expected an object, got {type(item).__name__}")
        out.append((f"{path}[{index}]", item))
    return out


def _convert_ids(obj: dict, path: str, fields: tuple[tuple[str, str, int], ...]) -> None:
    for camel, snake, digits in fields:
        key, value = _get(obj, camel, snake)
        if key is not None and value is not None:
            obj[key] = _hex_to_base64(value, f"{path}.{camel}", digits)


_SPAN_IDS = (("traceId", "trace_id", 32), ("spanId", "span_id", 16), ("parentSpanId", "parent_span_id", 16))
_LINK_IDS = (("traceId", "trace_id", 32), ("spanId", "span_id", 16))
_SPAN_KINDS = frozenset(Span.SpanKind.keys())
_STATUS_CODES = frozenset(Status.StatusCode.keys())
_METRIC_KINDS = (
    ("gauge", "gauge"),
    ("sum", "sum"),
    ("histogram", "histogram"),
    ("exponentialHistogram", "exponential_histogram"),
    ("summary", "summary"),
)


_INT32 = (-(1 << 31), (1 << 31) - 1)
_INTEGER_TEXT = re.compile(r"\s*-?[0-9]{1,10}\s*")  # what int() takes, at most int32's digits
_SHOWN = 64  # characters of an offending value quoted in a message


def _enum_value(value: Any, names: frozenset[str], path: str, what: str) -> tuple[Any, str | None]:
    """Check an OTLP/JSON enum value (proto3 JSON: a name or an integer, also as text) at
    ``path``. Returns ``(value for the parser, warning)``: a known name or an int32 number
    passes (an undefined number is kept and warned about after parsing, as in protobuf);
    an unknown name gives ``(None, warning)``: the default is kept, since the parser would
    drop it silently (``ignore_unknown_fields`` covers enum names too). An integral float
    passes as its int. Raises :class:`OTLPDecodeError` for another type (bool, fraction,
    object, array) or a number outside int32, which the parser would truncate, wrap or
    quote whole."""
    if isinstance(value, str):
        if value in names:
            return value, None
        if _INTEGER_TEXT.fullmatch(value):
            value = int(value)
        else:
            return None, f"unknown {what} {value[:_SHOWN]!r}, stored as the default"
    elif isinstance(value, float) and value.is_integer() and _INT32[0] <= value <= _INT32[1]:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise OTLPDecodeError(
            f"{path}: expected a {what} name or integer, got {type(value).__name__} ({repr(value)[:_SHOWN]})"
        )
    if not _INT32[0] <= value <= _INT32[1]:
        raise OTLPDecodeError(f"{path}: {what} {str(value)[:_SHOWN]} is outside the int32 range of an enum")
    return value, None


def _check_enum(
    obj: dict, camel: str, names: frozenset[str], path: str, what: str, found: list[str], label: str
) -> None:
    """:func:`_enum_value` of ``obj[camel]`` in place (``null`` is the default); a warning
    is appended to ``found`` as ``"{label}: …"`` (``label``: the field's path in the span)."""
    value = obj.get(camel)
    if value is None:
        return
    checked, warning = _enum_value(value, names, f"{path}.{camel}", what)
    if warning is None:
        obj[camel] = checked
    else:
        del obj[camel]
        found.append(f"{label}: {warning}")


_UNSIGNED_TEXT = re.compile(r"^\d+$")


def _check_event_time(event: dict, label: str, found: list[str]) -> None:
    """An event whose ``timeUnixNano`` is not a whole number (``"abc"``, ``1.5``, ``true``)
    loses that field, with a warning in ``found``: the event is kept without a time (as a
    protobuf event without one), and its span and the export's other spans are not lost
    over it. Request derivation ignores and counts events without a valid time."""
    key, value = _get(event, "timeUnixNano", "time_unix_nano")
    if key is None or value is None:
        return
    if isinstance(value, bool) or not (
        (isinstance(value, int) and value >= 0)
        or (isinstance(value, float) and value.is_integer() and value >= 0)
        or (isinstance(value, str) and _UNSIGNED_TEXT.match(value))
    ):
        del event[key]
        found.append(f"{label}.timeUnixNano: {value!r} is not a time in ns; the event is kept without a time")


def _object_at(obj: dict, camel: str, snake: str, path: str) -> dict | None:
    """The message at ``obj[camel]`` (or its snake_case key): ``None`` when absent or
    ``null``; raises :class:`OTLPDecodeError` for anything but an object (the parser would
    drop it silently)."""
    key, value = _get(obj, camel, snake)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise OTLPDecodeError(f"{path}.{camel}: expected an object, got {type(value).__name__}")
    return value


def _prepare_json(
    document: dict, signal: Literal["traces", "metrics"], warnings: dict[str, list[str]] | None = None
) -> None:
    """Make an OTLP/JSON document ready for proto3 JSON parsing, in place: hex ids to the
    base64 it expects; span kinds and status codes checked (:func:`_enum_value`), unknown
    names removed with a warning in ``warnings[span path]``; resources, scopes and statuses
    that are not objects refused. Raises :class:`OTLPDecodeError` naming the path."""
    if signal == "traces":
        for rpath, resource in _objects(_list_at(document, "resourceSpans", "resource_spans", ""), "resourceSpans"):
            _object_at(resource, "resource", "resource", rpath)
            for spath, scope in _objects(_list_at(resource, "scopeSpans", "scope_spans", rpath), f"{rpath}.scopeSpans"):
                _object_at(scope, "scope", "scope", spath)
                for path, span in _objects(_list_at(scope, "spans", "spans", spath), f"{spath}.spans"):
                    _convert_ids(span, path, _SPAN_IDS)
                    found: list[str] = []
                    _check_enum(span, "kind", _SPAN_KINDS, path, "span kind", found, "kind")
                    status = _object_at(span, "status", "status", path)
                    if status is not None:
                        _check_enum(
                            status, "code", _STATUS_CODES, f"{path}.status", "status code", found, "status.code"
                        )
                    for epath, event in _objects(_list_at(span, "events", "events", path), f"{path}.events"):
                        _check_event_time(event, epath[len(path) + 1 :], found)
                    if found and warnings is not None:
                        warnings[path] = found
                    for lpath, link in _objects(_list_at(span, "links", "links", path), f"{path}.links"):
                        _convert_ids(link, lpath, _LINK_IDS)
        return
    for rpath, resource in _objects(_list_at(document, "resourceMetrics", "resource_metrics", ""), "resourceMetrics"):
        _object_at(resource, "resource", "resource", rpath)
        for spath, scope in _objects(
            _list_at(resource, "scopeMetrics", "scope_metrics", rpath), f"{rpath}.scopeMetrics"
        ):
            _object_at(scope, "scope", "scope", spath)
            for mpath, metric in _objects(_list_at(scope, "metrics", "metrics", spath), f"{spath}.metrics"):
                for camel, snake in _METRIC_KINDS:
                    key, data = _get(metric, camel, snake)
                    if not isinstance(data, dict):
                        continue
                    dpath = f"{mpath}.{camel}.dataPoints"
                    for ppath, point in _objects(
                        _list_at(data, "dataPoints", "data_points", f"{mpath}.{camel}"), dpath
                    ):
                        for epath, exemplar in _objects(
                            _list_at(point, "exemplars", "exemplars", ppath), f"{ppath}.exemplars"
                        ):
                            _convert_ids(exemplar, epath, _LINK_IDS)


_PARSE_STEP = re.compile(r"Failed to parse (\w+) field: ")


def _parse_error(exc: json_format.ParseError) -> tuple[list[str], str]:
    """protobuf's nested ``Failed to parse X field: Failed to parse Y field: reason.`` as
    ``(["X", "Y"], "reason")``, the reason cut to 200 characters."""
    text, fields = str(exc), []
    while match := _PARSE_STEP.match(text):
        fields.append(match.group(1))
        text = text[match.end() :]
    reason = text.rstrip(".")
    return fields, (reason if len(reason) <= 200 else f"{reason[:200]}… ({len(reason)} characters)")


def _described(path: str, fields: list[str], reason: str) -> str:
    """``path.field.field: reason`` (either part may be empty)."""
    where = ".".join(part for part in (path, *fields) if part)
    return f"{where}: {reason}" if where else reason


def _located(document: dict, signal: Literal["traces", "metrics"]) -> str | None:
    """After the whole document failed to parse: ``path.field…: reason`` of the first span,
    metric, resource or scope that fails alone (``None`` if none does). Only on the error
    path, so a malformed body is answered with the index of the item to fix."""
    top, scopes, items, item_type = (
        ("resourceSpans", "scopeSpans", "spans", Span)
        if signal == "traces"
        else ("resourceMetrics", "scopeMetrics", "metrics", Metric)
    )
    snake = {
        "resourceSpans": "resource_spans",
        "scopeSpans": "scope_spans",
        "resourceMetrics": "resource_metrics",
        "scopeMetrics": "scope_metrics",
    }
    for i, resource in enumerate(_get(document, top, snake[top])[1] or ()):
        candidates: list[tuple[str, Any, type[Message]]] = [
            (f"{top}[{i}].resource", resource.get("resource"), Resource)
        ]
        for j, scope in enumerate(_get(resource, scopes, snake[scopes])[1] or ()):
            candidates.append((f"{top}[{i}].{scopes}[{j}].scope", scope.get("scope"), InstrumentationScope))
            candidates.extend(
                (f"{top}[{i}].{scopes}[{j}].{items}[{k}]", item, item_type)
                for k, item in enumerate(scope.get(items) or ())
            )
        for path, value, message_type in candidates:
            if not isinstance(value, dict):
                continue
            try:
                json_format.ParseDict(value, message_type(), ignore_unknown_fields=True)
            except json_format.ParseError as exc:
                return _described(path, *_parse_error(exc))
            except (RecursionError, TypeError, ValueError, AttributeError):
                continue
    return None


# The one field at the top of each signal's Export*ServiceRequest (lowerCamelCase, snake_case).
_TOP_LEVEL_FIELDS = {"traces": ("resourceSpans", "resource_spans"), "metrics": ("resourceMetrics", "resource_metrics")}
# Top-level fields of every OTLP export, to say which signal a misrouted body carries.
_SIGNAL_OF_FIELD = {
    "resourceSpans": ("traces", "/v1/traces"),
    "resource_spans": ("traces", "/v1/traces"),
    "resourceMetrics": ("metrics", "/v1/metrics"),
    "resource_metrics": ("metrics", "/v1/metrics"),
    "resourceLogs": ("logs", "/v1/logs"),
    "resource_logs": ("logs", "/v1/logs"),
    "resourceProfiles": ("profiles", "/v1development/profiles"),
    "resource_profiles": ("profiles", "/v1development/profiles"),
}
_SHOWN_KEYS = 5


def _check_top_level(document: dict, signal: Literal["traces", "metrics"], name: str) -> None:
    """Refuse a JSON object that is not this signal's export at all.

    OTLP/JSON receivers must ignore unknown fields, and the JSON parser does, so an OTLP logs
    export (``resourceLogs``) posted to ``/v1/traces`` parsed as an *empty* trace export and
    was answered 200 while its data was thrown away. An empty object is a valid empty export
    (the specification asks for success), and unknown fields next to ``resourceSpans`` stay
    ignored; an object with fields but not this signal's one is not an export of it.
    Raises :class:`OTLPDecodeError` naming what was found.
    """
    expected = _TOP_LEVEL_FIELDS[signal]
    if not document or any(field in document for field in expected):
        return
    keys = sorted(map(str, document))
    shown = ", ".join(repr(k[:64]) for k in keys[:_SHOWN_KEYS]) + (
        f" and {len(keys) - _SHOWN_KEYS} more" if len(keys) > _SHOWN_KEYS else ""
    )
    other = next((_SIGNAL_OF_FIELD[k] for k in keys if k in _SIGNAL_OF_FIELD), None)
    hint = ""
    if other is not None:
        accepted = other[0] in _TOP_LEVEL_FIELDS
        hint = f": an OTLP {other[0]} export, which belongs at {other[1]}" + (
            "" if accepted else " (inferpath accepts traces and metrics only)"
        )
    raise OTLPDecodeError(f"JSON body is not an {name}: no {expected[0]} at the top level, found {shown}{hint}")


def parse_message(
    payload: bytes,
    fmt: BodyFormat,
    message: Message,
    signal: Literal["traces", "metrics"],
    warnings: dict[str, list[str]] | None = None,
) -> Message:
    """Fill ``message`` (an ``Export*ServiceRequest``) from a decompressed body.

    JSON follows the OTLP/JSON mapping: lowerCamelCase (snake_case also accepted), enums as
    ints or names, 64-bit ints as strings or numbers, ids as hex; unknown fields are ignored
    as the specification requires, except that a non-empty object without this signal's
    top-level field (``resourceSpans``/``resourceMetrics``; e.g. a logs export's
    ``resourceLogs``) is refused as not an export of it. An unknown span kind or status code name leaves the
    default, with a message in ``warnings[span path]`` (``resourceSpans[i].scopeSpans[j].spans[k]``).
    Raises :class:`OTLPDecodeError` naming the problem.
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
        except (UnicodeDecodeError, ValueError) as exc:
            raise OTLPDecodeError(f"body is not valid JSON: {exc}") from None
        if not isinstance(document, dict):
            raise OTLPDecodeError(f"JSON body must be an object ({name}), got {type(document).__name__}")
        _check_top_level(document, signal, name)
        _prepare_json(document, signal, warnings)
        try:
            json_format.ParseDict(document, message, ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            located = _located(document, signal) or _described("", *_parse_error(exc))
            raise OTLPDecodeError(f"invalid OTLP/JSON {name}: {located}") from None
    except RecursionError:  # the parsers recurse per level of nesting; OTLP needs fewer than 20
        raise OTLPDecodeError("JSON body is nested too deeply to decode") from None
    return message


def encode_message(message: Message, fmt: BodyFormat) -> bytes:
    """Serialize a response message in the request's format (OTLP/JSON uses camelCase)."""
    if fmt == "protobuf":
        return message.SerializeToString()
    return json.dumps(json_format.MessageToDict(message), separators=(",", ":")).encode()
