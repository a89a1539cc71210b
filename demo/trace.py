"""Reading LLM request traces: arrival times and token counts of real requests.

The Azure LLM inference trace 2023 (CC-BY-4.0, see ``assets/traces/ORIGIN.md``) has one row per
request: ``TIMESTAMP`` (wall clock, 7 fractional digits, e.g. ``2023-11-16 18:17:03.9799600``),
``ContextTokens`` (prompt length) and ``GeneratedTokens`` (output length).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from inferpath.demo.assets import AZURE_CODE_TRACE_CSV


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


def _parse_azure_timestamp(text: str, line: int) -> int:
    """Azure's ``YYYY-MM-DD HH:MM:SS.fffffff`` (UTC assumed) → unix nanoseconds."""
    whole, _, fraction = text.strip().partition(".")
    try:
        base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError as exc:
        raise ValueError(f"line {line}: TIMESTAMP {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fffffff]'") from exc
    if fraction and not fraction.isdigit():
        raise ValueError(f"line {line}: TIMESTAMP {text!r} has a non-numeric fraction")
    fraction_ns = int((fraction + "000000000")[:9]) if fraction else 0
    return int(base.timestamp()) * 1_000_000_000 + fraction_ns


def load_azure_trace(path: Path | str | None = None, *, limit: int | None = None) -> list[TraceRequest]:
    """Load an Azure LLM inference trace CSV (2023 schema) sorted by arrival.

    ``limit`` keeps the first N requests. Raises ``ValueError`` naming the line and column of a
    malformed row, and ``FileNotFoundError`` for a missing file.
    """
    source = Path(path) if path is not None else AZURE_CODE_TRACE_CSV
    rows: list[tuple[int, int, int]] = []
    with source.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{source.name}: missing column(s) {sorted(missing)}")
        for line, row in enumerate(reader, start=2):
            if limit is not None and len(rows) >= limit:
                break
            arrival_ns = _parse_azure_timestamp(row["TIMESTAMP"], line)
            try:
                context, generated = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{source.name} line {line}: token counts must be integers") from exc
            if context < 1 or generated < 1:
                raise ValueError(f"{source.name} line {line}: token counts must be ≥ 1")
            rows.append((arrival_ns, context, generated))
    rows.sort(key=lambda r: r[0])
    if not rows:
        return []
    first_ns = rows[0][0]
    return [
        TraceRequest(i, (arrival_ns - first_ns) / 1e9, context, generated)
        for i, (arrival_ns, context, generated) in enumerate(rows)
    ]
