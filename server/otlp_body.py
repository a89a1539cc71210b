"""OTLP/HTTP request bodies: content negotiation, gzip, JSON id conversion, responses.

Reference: the OTLP specification, "OTLP/HTTP" (binary protobuf ``application/x-protobuf``,
JSON ``application/json``; ``Content-Encoding: gzip``; the JSON mapping differs from proto3
JSON in that ``traceId``/``spanId`` are hex strings, not base64).
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from typing import Any, Literal

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

__all__ = [
    "OTLPDecodeError",
    "UnsupportedMediaTypeError",
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


def body_format(content_type: str | None) -> BodyFormat:
    """Map a ``Content-Type`` header to ``"protobuf"`` or ``"json"``; parameters are ignored.

    Raises :class:`UnsupportedMediaTypeError` for anything else (including a missing header).
    """
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media in ("application/x-protobuf", "application/protobuf"):
        return "protobuf"
    if media == "application/json":
        return "json"
    if not media:
        raise UnsupportedMediaTypeError("missing Content-Type: use application/x-protobuf or application/json")
    raise UnsupportedMediaTypeError(
        f"unsupported Content-Type {content_type!r}: use application/x-protobuf or application/json"
    )


def decompress(body: bytes, content_encoding: str | None,
               max_bytes: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """Undo ``Content-Encoding`` (``gzip``, ``deflate`` or ``identity``/none).

    Raises :class:`OTLPDecodeError` for a corrupt stream or one inflating past ``max_bytes``,
    :class:`UnsupportedMediaTypeError` for an unknown encoding.
    """
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise UnsupportedMediaTypeError(
            f"unsupported Content-Encoding {content_encoding!r}: use gzip, deflate or identity")
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
            raise OTLPDecodeError(f"{encoding} body inflates past {max_bytes} bytes")
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
        raise OTLPDecodeError(
            f"{path}: expected {hex_digits} hex digits, got {len(value)} ({value[:40]!r})")
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


_SPAN_IDS = (("traceId", "trace_id", 32), ("spanId", "span_id", 16),
             ("parentSpanId", "parent_span_id", 16))
_LINK_IDS = (("traceId", "trace_id", 32), ("spanId", "span_id", 16))
_SPAN_KINDS = frozenset(Span.SpanKind.keys())
_STATUS_CODES = frozenset(Status.StatusCode.keys())
_METRIC_KINDS = (("gauge", "gauge"), ("sum", "sum"), ("histogram", "histogram"),
                 ("exponentialHistogram", "exponential_histogram"), ("summary", "summary"))


def _known_enum(value: Any, names: frozenset[str]) -> bool:
    """Whether proto3 JSON parsing takes ``value`` for an enum with ``names``: a name, or a
    number (an int or its text; an unknown number is kept and checked after parsing). Other
    types are left to the parser, which fails the body naming the field."""
    if not isinstance(value, str) or value in names:
        return True
    try:
        int(value)
    except ValueError:
        return False
    return True


def _drop_unknown_enum(obj: dict, camel: str, snake: str, names: frozenset[str], path: str, what: str,
                       warnings: list[str] | None) -> None:
    """Remove an enum name the parser would drop silently (``ignore_unknown_fields`` covers
    unknown enum names too), saying so in ``warnings``: the item is kept with the default."""
    key, value = _get(obj, camel, snake)
    if key is not None and not _known_enum(value, names):
        del obj[key]
        if warnings is not None:
            warnings.append(f"{path}.{camel}: unknown {what} {value[:64]!r}, stored as the default")


def _hex_ids_to_base64(document: dict, signal: Literal["traces", "metrics"],
                       warnings: list[str] | None = None) -> None:
    """Rewrite OTLP/JSON hex ids in place to the base64 that proto3 JSON parsing expects;
    drop unknown span kind and status code names (:func:`_drop_unknown_enum`)."""
    if signal == "traces":
        for rpath, resource in _objects(
                _list_at(document, "resourceSpans", "resource_spans", ""), "resourceSpans"):
            for spath, scope in _objects(
                    _list_at(resource, "scopeSpans", "scope_spans", rpath), f"{rpath}.scopeSpans"):
                for path, span in _objects(_list_at(scope, "spans", "spans", spath), f"{spath}.spans"):
                    _convert_ids(span, path, _SPAN_IDS)
                    _drop_unknown_enum(span, "kind", "kind", _SPAN_KINDS, path, "span kind", warnings)
                    status = span.get("status")
                    if isinstance(status, dict):
                        _drop_unknown_enum(status, "code", "code", _STATUS_CODES, f"{path}.status", "status code",
                                           warnings)
                    for lpath, link in _objects(_list_at(span, "links", "links", path), f"{path}.links"):
                        _convert_ids(link, lpath, _LINK_IDS)
        return
    for rpath, resource in _objects(
            _list_at(document, "resourceMetrics", "resource_metrics", ""), "resourceMetrics"):
        for spath, scope in _objects(
                _list_at(resource, "scopeMetrics", "scope_metrics", rpath), f"{rpath}.scopeMetrics"):
            for mpath, metric in _objects(_list_at(scope, "metrics", "metrics", spath), f"{spath}.metrics"):
                for camel, snake in _METRIC_KINDS:
                    key, data = _get(metric, camel, snake)
                    if not isinstance(data, dict):
                        continue
                    dpath = f"{mpath}.{camel}.dataPoints"
                    for ppath, point in _objects(
                            _list_at(data, "dataPoints", "data_points", f"{mpath}.{camel}"), dpath):
                        for epath, exemplar in _objects(
                                _list_at(point, "exemplars", "exemplars", ppath), f"{ppath}.exemplars"):
                            _convert_ids(exemplar, epath, _LINK_IDS)


def parse_message(payload: bytes, fmt: BodyFormat, message: Message,
                  signal: Literal["traces", "metrics"], warnings: list[str] | None = None) -> Message:
    """Fill ``message`` (an ``Export*ServiceRequest``) from a decompressed body.

    JSON follows the OTLP/JSON mapping: lowerCamelCase (snake_case also accepted), enums as
    ints or names, 64-bit ints as strings or numbers, ids as hex; unknown fields are ignored
    as the specification requires. An unknown span kind or status code name leaves the
    default, with a message appended to ``warnings`` naming its path. Raises
    :class:`OTLPDecodeError` naming the problem.
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
        _hex_ids_to_base64(document, signal, warnings)
        try:
            json_format.ParseDict(document, message, ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise OTLPDecodeError(f"invalid OTLP/JSON {name}: {exc}") from None
    except RecursionError:  # the parsers recurse per level of nesting; OTLP needs fewer than 20
        raise OTLPDecodeError("JSON body is nested too deeply to decode") from None
    return message


def encode_message(message: Message, fmt: BodyFormat) -> bytes:
    """Serialize a response message in the request's format (OTLP/JSON uses camelCase)."""
    if fmt == "protobuf":
        return message.SerializeToString()
    return json.dumps(json_format.MessageToDict(message), separators=(",", ":")).encode()
