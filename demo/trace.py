"""Reading LLM request traces: arrival times and token counts of real requests.

A trace file's format is recognised from its content (the first non-blank line: a CSV
header or a JSON object and its keys), never from its name. The formats, one entry each in
:data:`TRACE_FORMATS`:

| name | file | arrival | prompt tokens | output tokens |
|---|---|---|---|---|
| ``azure`` | Azure LLM inference trace 2023 CSV (CC-BY-4.0, see ``assets/traces/ORIGIN.md``) | ``TIMESTAMP``: UTC wall clock, ``2023-11-16 18:17:03.9799600`` | ``ContextTokens`` | ``GeneratedTokens`` |
| ``burstgpt`` | BurstGPT CSV (``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``) | ``Timestamp``: seconds from the trace's start | ``Request tokens`` | ``Response tokens`` |
| ``mooncake`` | Mooncake FAST'25 JSONL (``hash_ids`` of prefix blocks are ignored) | ``timestamp``: milliseconds from the trace's start | ``input_length`` | ``output_length`` |
| ``jsonl`` | the minimal JSONL, one object a line | ``timestamp``: seconds (any origin) | ``input_tokens`` | ``output_tokens`` |

The minimal JSONL, for traces of your own::

    {"timestamp": 0.0, "input_tokens": 812, "output_tokens": 64}
    {"timestamp": 0.35, "input_tokens": 1204, "output_tokens": 12}

Token counts are integers ≥ 1. BurstGPT marks a failed request with ``Response tokens`` 0;
such a row is not replayable and is skipped, and counted (:attr:`Trace.skipped_rows`).
Every other bad row is an error that names its line; a file with bad rows is refused as a
whole (:class:`TraceError` lists the first :data:`MAX_REPORTED_ROWS` of them), because a
replay of part of a trace would measure a different load.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from inferpath.demo.assets import AZURE_CODE_TRACE_CSV

MAX_REPORTED_ROWS = 10
"""Bad rows named in a :class:`TraceError`; the rest are counted."""
NS_PER_SECOND = 1_000_000_000


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    ``arrival_offset_seconds``: arrival time relative to the trace's first request (s, ≥ 0).
    ``context_tokens`` / ``generated_tokens``: prompt and output length in tokens.
    """

    index: int
    arrival_offset_seconds: float
    context_tokens: int
    generated_tokens: int


class TraceError(ValueError):
    """A trace file that cannot be replayed: unknown format, or rows named by line number."""


class SkipRow(Exception):
    """Raised by a row parser for a row its format documents as not a request (with why)."""


RowParser = Callable[[Mapping[str, Any]], tuple[int, int, int]]
"""A row's fields → (arrival in ns on the format's own clock, prompt tokens, output tokens).
Raises ``ValueError`` naming the field for a bad value, :class:`SkipRow` for a row to skip."""


@dataclass(frozen=True, slots=True)
class TraceFormat:
    """One trace file format: how to recognise it (``kind`` and ``fields``) and read a row."""

    name: str
    title: str
    kind: Literal["csv", "jsonl"]
    fields: tuple[str, ...]
    """Columns (CSV) or keys (JSONL) every row has; all present in the first line recognises it."""
    parse_row: RowParser


@dataclass(frozen=True, slots=True)
class Trace:
    """The requests of a trace file, sorted by arrival, and how the file was read."""

    source: Path
    format: TraceFormat
    requests: list[TraceRequest]
    skipped_rows: int = 0
    skip_reason: str = ""

    def describe(self) -> str:
        """One line for people: file, format, requests, skipped rows and why."""
        text = f"{self.source.name} ({self.format.title}): {len(self.requests)} requests"
        if self.skipped_rows:
            text += f", {self.skipped_rows} rows skipped ({self.skip_reason})"
        return text


def _count(row: Mapping[str, Any], field: str) -> int:
    """A token count: an integer ≥ 1 (JSON number or CSV text; ``12.0`` is 12)."""
    value = row.get(field)
    if isinstance(value, bool) or value is None or value == "":
        raise ValueError(f"{field} {value!r} is not a token count")
    try:
        number = float(value) if isinstance(value, str) else value
        count = int(number)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{field} {value!r} is not an integer") from None
    if count != number:
        raise ValueError(f"{field} {value!r} is not an integer")
    if count < 1:
        raise ValueError(f"{field} {value!r} must be ≥ 1")
    return count


def _instant_ns(row: Mapping[str, Any], field: str, ns_per_unit: int) -> int:
    """A time on the format's own clock in ``1 / ns_per_unit`` units → nanoseconds."""
    value = row.get(field)
    if isinstance(value, bool) or value is None or value == "":
        raise ValueError(f"{field} {value!r} is not a time")
    if isinstance(value, int):
        return value * ns_per_unit
    # Decimal, not float: unix seconds times 1e9 exceed a float's 53 bits of precision.
    try:
        number = Decimal(value.strip() if isinstance(value, str) else repr(float(value)))
    except (TypeError, ValueError, ArithmeticError):
        raise ValueError(f"{field} {value!r} is not a number") from None
    if not number.is_finite():
        raise ValueError(f"{field} {value!r} is not a finite number")
    return int((number * ns_per_unit).to_integral_value())


def _azure_timestamp_ns(row: Mapping[str, Any]) -> int:
    """Azure's ``YYYY-MM-DD HH:MM:SS.fffffff`` (UTC assumed) → unix nanoseconds."""
    text = str(row.get("TIMESTAMP") or "")
    whole, _, fraction = text.strip().partition(".")
    try:
        base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        raise ValueError(f"TIMESTAMP {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fffffff]'") from None
    if fraction and not fraction.isdigit():
        raise ValueError(f"TIMESTAMP {text!r} has a non-numeric fraction")
    fraction_ns = int((fraction + "000000000")[:9]) if fraction else 0
    return int(base.timestamp()) * NS_PER_SECOND + fraction_ns


def _azure_row(row: Mapping[str, Any]) -> tuple[int, int, int]:
    return _azure_timestamp_ns(row), _count(row, "ContextTokens"), _count(row, "GeneratedTokens")


def _burstgpt_row(row: Mapping[str, Any]) -> tuple[int, int, int]:
    arrival_ns = _instant_ns(row, "Timestamp", NS_PER_SECOND)
    if str(row.get("Response tokens", "")).strip() in ("0", "0.0"):
        raise SkipRow("failed requests: Response tokens 0")
    return arrival_ns, _count(row, "Request tokens"), _count(row, "Response tokens")


def _mooncake_row(row: Mapping[str, Any]) -> tuple[int, int, int]:
    return (_instant_ns(row, "timestamp", 1_000_000), _count(row, "input_length"), _count(row, "output_length"))


def _minimal_row(row: Mapping[str, Any]) -> tuple[int, int, int]:
    return (_instant_ns(row, "timestamp", NS_PER_SECOND), _count(row, "input_tokens"), _count(row, "output_tokens"))


TRACE_FORMATS: dict[str, TraceFormat] = {
    fmt.name: fmt
    for fmt in (
        TraceFormat(
            "azure",
            "Azure LLM inference trace 2023 CSV",
            "csv",
            ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
            _azure_row,
        ),
        TraceFormat(
            "burstgpt", "BurstGPT CSV", "csv", ("Timestamp", "Request tokens", "Response tokens"), _burstgpt_row
        ),
        TraceFormat(
            "mooncake", "Mooncake FAST'25 JSONL", "jsonl", ("timestamp", "input_length", "output_length"), _mooncake_row
        ),
        TraceFormat("jsonl", "minimal JSONL", "jsonl", ("timestamp", "input_tokens", "output_tokens"), _minimal_row),
    )
}
"""Every trace format, tried in this order; adding one is one entry here and its test."""


def _first_line(source: Path) -> str:
    with source.open(encoding="utf-8-sig", newline="") as handle:
        for line in handle:
            if line.strip():
                return line
    raise TraceError(f"{source.name}: the file is empty")


def detect_format(source: Path) -> TraceFormat:
    """The format of ``source`` from its first non-blank line. Raises :class:`TraceError`
    naming what was found and what each format of that kind needs."""
    line = _first_line(source)
    if line.lstrip().startswith("{"):
        kind = "jsonl"
        try:
            first = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{source.name} line 1: not a JSON object ({exc.msg})") from None
        found = list(first) if isinstance(first, dict) else []
    else:
        kind = "csv"
        found = [name.strip() for name in next(csv.reader([line]))]
    candidates = [fmt for fmt in TRACE_FORMATS.values() if fmt.kind == kind]
    for fmt in candidates:
        if set(fmt.fields) <= set(found):
            return fmt
    needs = "; ".join(
        f"{fmt.title} needs {', '.join(fmt.fields)} (missing {', '.join(f for f in fmt.fields if f not in found)})"
        for fmt in candidates
    )
    what = "keys" if kind == "jsonl" else "columns"
    raise TraceError(
        f"{source.name}: not a known trace format; first line has {what} {', '.join(found) or 'none'}. {needs}"
    )


def _rows(source: Path, fmt: TraceFormat) -> Iterator[tuple[int, Mapping[str, Any] | str]]:
    """(line number, row) pairs; a row that cannot be read as a mapping is the reason, a str."""
    with source.open(encoding="utf-8-sig", newline="") as handle:
        if fmt.kind == "csv":
            reader = csv.DictReader(handle, skipinitialspace=True)
            reader.fieldnames = [name.strip() for name in reader.fieldnames or ()]
            for row in reader:
                if None in row:
                    yield (
                        reader.line_num,
                        f"{len(reader.fieldnames) + len(row[None])} values for {len(reader.fieldnames)} columns",
                    )
                    continue
                if all(value in (None, "") for value in row.values()):
                    continue
                yield reader.line_num, row
            return
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                yield line_number, f"not JSON ({exc.msg})"
                continue
            yield line_number, row if isinstance(row, dict) else "not a JSON object"


def load_trace(path: Path | str | None = None, *, limit: int | None = None) -> Trace:
    """Load a request trace in any format of :data:`TRACE_FORMATS`, sorted by arrival.

    ``path`` defaults to the shipped Azure code trace; ``limit`` keeps the first N requests
    of the file. Raises :class:`TraceError` (a ``ValueError``) for an unknown format, a file
    that is not UTF-8 text, bad rows (naming each bad row's line and field) or a file without
    requests, and ``OSError`` (``FileNotFoundError``, …) for a file that cannot be read.
    """
    source = Path(path) if path is not None else AZURE_CODE_TRACE_CSV
    rows: list[tuple[int, int, int]] = []
    bad: list[str] = []
    bad_total = skipped = 0
    skip_reason = ""
    try:
        fmt = detect_format(source)
        for line_number, row in _rows(source, fmt):
            if limit is not None and len(rows) >= limit:
                break
            try:
                if isinstance(row, str):
                    raise ValueError(row)
                rows.append(fmt.parse_row(row))
            except SkipRow as why:
                skipped, skip_reason = skipped + 1, str(why)
            except ValueError as exc:
                bad_total += 1
                if len(bad) < MAX_REPORTED_ROWS:
                    bad.append(f"line {line_number}: {exc}")
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{source}: not a text trace (byte {exc.start} is not UTF-8); expected CSV or JSON Lines: {format_help()}"
        ) from None
    if bad_total:
        more = f"; and {bad_total - len(bad)} more" if bad_total > len(bad) else ""
        raise TraceError(f"{source.name} ({fmt.title}): {bad_total} bad row(s): " + "; ".join(bad) + more)
    if not rows:
        skipped_text = f" ({skipped} rows skipped: {skip_reason})" if skipped else ""
        raise TraceError(f"{source.name} ({fmt.title}): no requests{skipped_text}")
    rows.sort(key=lambda r: r[0])
    first_ns = rows[0][0]
    requests = [
        TraceRequest(i, (arrival_ns - first_ns) / NS_PER_SECOND, context, generated)
        for i, (arrival_ns, context, generated) in enumerate(rows)
    ]
    return Trace(source, fmt, requests, skipped, skip_reason)


def format_help() -> str:
    """The accepted formats in one sentence, for ``--help`` texts and error hints."""
    return ", ".join(f"{fmt.title} ({', '.join(fmt.fields)})" for fmt in TRACE_FORMATS.values())
