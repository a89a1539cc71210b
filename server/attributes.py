"""OTLP ``AnyValue`` → string, exactly as the OpenTelemetry Collector's ClickHouse exporter writes it.

The exporter stores every attribute as ``Map(LowCardinality(String), String)`` and converts
values with pdata's ``pcommon.Value.AsString()`` (collector ``pdata/pcommon/value.go``):

- string → itself; bool → ``true``/``false``; int → decimal;
- double → Go's ``float64AsString``: shortest round-trip digits, positional notation unless
  ``abs < 1e-6`` or ``abs >= 1e21`` (ES6 ``Number#toString`` cut-offs), exponent without a
  leading zero (``1e-7``), no trailing ``.0`` (``1``, not ``1.0``);
- bytes → standard base64; array / key-value list → ``json.Marshal`` of the raw value
  (maps with sorted keys, no spaces, ``<``, ``>``, ``&`` escaped as ``\\u003c`` …);
- empty value → ``""``.

Matching the exporter byte for byte means rows written by inferpath and rows written by
the Collector group and filter the same way in SQL.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

__all__ = ["any_value_to_string", "attributes_to_map", "format_double", "any_value_to_raw"]


def format_double(value: float) -> str:
    """Format a float64 as Go's ``pcommon`` ``float64AsString`` does (see module docstring).

    ``format_double(1.0) == "1"``, ``format_double(2.5e-05) == "0.000025"``,
    ``format_double(1e-07) == "1e-7"``; infinities and NaN give Go's error text.
    """
    text = repr(value)
    # Finite (not "inf"/"nan") and in fixed notation (0, or 1e-4 <= |value| < 1e16): repr
    # already gives the shortest round-trip digits.
    if "e" not in text and "n" not in text:
        return text[:-2] if text.endswith(".0") else text
    if not math.isfinite(value):
        go = "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
        return f"json: unsupported value: {go}"
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        # Python uses e-notation in this whole range, shortest digits.
        mantissa, _, exponent = text.partition("e")
        sign = exponent[0] if exponent[:1] in "+-" else "+"
        digits = exponent.lstrip("+-").lstrip("0") or "0"
        if sign == "+" and len(digits) < 2:
            digits = digits.zfill(2)  # Go keeps two exponent digits except after the clean-up
        return f"{mantissa}e{sign}{digits}"
    # 1e-6 <= |value| < 1e-4 or 1e16 <= |value| < 1e21: repr's e-notation, written out.
    return format(Decimal(text).normalize(), "f")


# What Go's encoding/json escapes in a string beyond what json.dumps does (HTML-safe output).
_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _go_json(raw: Any) -> str:
    """Serialize a raw value like Go's ``encoding/json`` (HTML-safe, compact, sorted map keys)."""
    if raw is None or isinstance(raw, int):  # bool is an int: "true"/"false"
        return json.dumps(raw)
    if isinstance(raw, float):
        return format_double(raw)
    if isinstance(raw, bytes):
        raw = base64.b64encode(raw).decode("ascii")
    if isinstance(raw, str):
        return json.dumps(raw, ensure_ascii=False).translate(_GO_ESCAPES)
    if isinstance(raw, dict):
        return "{" + ",".join(f"{_go_json(key)}:{_go_json(raw[key])}" for key in sorted(raw)) + "}"
    return "[" + ",".join(_go_json(item) for item in raw) + "]"


def any_value_to_raw(value: AnyValue) -> Any:
    """Convert an ``AnyValue`` to plain Python (pdata ``AsRaw``): str, bool, int, float, bytes,
    list, dict or ``None`` for an empty value."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value_to_raw(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value_to_raw(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)


def any_value_to_string(value: AnyValue) -> str:
    """Flatten one ``AnyValue`` to the string the ClickHouse exporter stores (pdata ``AsString``)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return str(value.int_value)
    if kind == "double_value":
        return format_double(value.double_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return "" if kind is None else _go_json(any_value_to_raw(value))


def attributes_to_map(attributes: Iterable[KeyValue]) -> dict[str, str]:
    """Flatten OTLP ``KeyValue`` attributes to ``{key: string}``; a repeated key keeps the last
    value, as pdata's map does when it is built from the wire."""
    return {kv.key: any_value_to_string(kv.value) for kv in attributes}
