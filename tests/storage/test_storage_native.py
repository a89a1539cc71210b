"""Rows written as Native blocks ahead of their insert (storage/native.py): what lands in
``otel_traces`` is exactly what ``Store.insert`` of the same rows stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from clickhouse_connect.datatypes.registry import get_from_name
from clickhouse_connect.driver.common import write_leb128
from clickhouse_connect.driver.insert import InsertContext
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from inferpath.server.otlp import decode_trace_request
from inferpath.storage.native import NativeBlockWriter
from inferpath.storage.rows import SPAN_COLUMNS
from inferpath.storage.store import Store

PROTOBUF = "application/x-protobuf"
_ALL = "SELECT * FROM otel_traces ORDER BY TraceId, SpanId"


def _linked_export() -> bytes:
    """One span with two events (one with attributes) and a link with trace state and attributes."""
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes(range(1, 17)), bytes(range(1, 9)), "linked"
    span.start_time_unix_nano, span.end_time_unix_nano = 1_735_732_800_000_000_000, 1_735_732_801_000_000_123
    for n in range(2):
        event = span.events.add(time_unix_nano=1_735_732_800_500_000_000 + n, name=f"event-{n}")
        if n:
            event.attributes.add(key="gen_ai.token.index", value=AnyValue(int_value=7))
    link = span.links.add(trace_id=bytes(range(2, 18)), span_id=bytes(range(2, 10)), trace_state="k=v")
    link.attributes.add(key="reason", value=AnyValue(string_value="retry"))
    return request.SerializeToString()


def _span_rows(shared_data: Path) -> list[tuple]:
    """Span rows of the recorded vLLM exports (under load and at start-up) and the OTLP/JSON
    example of opentelemetry-proto (events, links, every attribute type)."""
    folder = shared_data / "vllm_live_capture"
    bodies = [(p.read_bytes(), PROTOBUF) for p in sorted((folder / "otlp").glob("*.pb"))
              + sorted((folder / "startup_otlp").glob("*.pb"))]
    bodies.append(((shared_data / "otlp_traces" / "otel_proto_examples_trace.json").read_bytes(), "application/json"))
    bodies.append((_linked_export(), PROTOBUF))
    spans = [span for body, content_type in bodies
             for span in decode_trace_request(body, content_type=content_type, content_encoding=None).spans]
    assert any(span.events for span in spans) and any(span.links for span in spans)
    return [span.to_insert_row(timestamp_ns=True) for span in spans]


def test_joined_native_blocks_store_exactly_what_a_row_insert_stores(store: Store, shared_data: Path) -> None:
    rows = _span_rows(shared_data)
    store.insert("otel_traces", rows, SPAN_COLUMNS, checked=True)
    expected = store.query(_ALL)
    assert len(expected) == len(rows)
    store.command("TRUNCATE TABLE otel_traces")

    writer = NativeBlockWriter(SPAN_COLUMNS, store.column_types("otel_traces", SPAN_COLUMNS))
    # Several blocks joined are one Native stream: one INSERT, as the span log's drainer sends.
    blocks = [writer.block(rows[i:i + 7]) for i in range(0, len(rows), 7)]
    assert len(blocks) > 3 and not any(block.startswith(b"INSERT") for block in blocks)
    store.insert_native("otel_traces", SPAN_COLUMNS, b"".join(blocks), dedup_token="native-test")
    assert store.query(_ALL) == expected
    # The dedup token works as for row inserts: the same insert again stores nothing.
    store.insert_native("otel_traces", SPAN_COLUMNS, b"".join(blocks), dedup_token="native-test")
    assert store.query("SELECT count() FROM otel_traces")[0][0] == len(rows)


def test_column_types_are_the_tables_own_and_a_missing_column_is_named(store: Store) -> None:
    types = store.column_types("otel_traces", ["Timestamp", "Duration", "SpanAttributes"])
    assert types == ("DateTime64(9)", "UInt64", "Map(LowCardinality(String), String)")
    with pytest.raises(ValueError, match="no column.*NoSuchColumn"):
        store.column_types("otel_traces", ["Timestamp", "NoSuchColumn"])
    with pytest.raises(ValueError):
        store.column_types("otel_traces; DROP TABLE x", ["Timestamp"])


def _clickhouse_connect_block(names: list[str], type_names: list[str], rows: list[tuple]) -> bytes:
    """The Native block of ``rows`` with every column written by clickhouse-connect's type
    classes (no shortcut), the reference for the writer's output."""
    types = [get_from_name(name) for name in type_names]
    out = bytearray()
    write_leb128(len(names), out)
    write_leb128(len(rows), out)
    for name, ch_type, column in zip(names, types, zip(*rows)):
        for text in (name.encode(), ch_type.insert_name.encode()):
            write_leb128(len(text), out)
            out += text
        context = InsertContext("reference", names, types, None, column_oriented=True)
        context.start_column(name)
        ch_type.write_column(column, out, context)
    return bytes(out)


def test_empty_array_columns_are_written_byte_for_byte_as_clickhouse_connect_writes_them(
        store: Store, shared_data: Path) -> None:
    types = list(store.column_types("otel_traces", SPAN_COLUMNS))
    writer = NativeBlockWriter(SPAN_COLUMNS, types)
    rows = _span_rows(shared_data)
    plain = [row for row in rows if not any(row[SPAN_COLUMNS.index(c)] for c in ("Events.Name", "Links.TraceId"))]
    assert plain and len(plain) < len(rows)
    # Every array empty (the shortcut), some not (the type's writer), one row, and lists or
    # "" instead of tuples: the same bytes either way.
    lists = [tuple(list(v) if isinstance(v, tuple) else v for v in row) for row in plain]
    strings = [tuple("" if v == () else v for v in row) for row in plain]
    for sample in (plain, rows, plain[:1], lists, strings):
        assert writer.block(sample) == _clickhouse_connect_block(list(SPAN_COLUMNS), types, sample)
    # A value without a length is refused as clickhouse-connect refuses it, naming the column.
    arrays = NativeBlockWriter(["Tags", "Times"], ["Array(LowCardinality(String))", "Array(DateTime64(9))"])
    with pytest.raises(ValueError, match="column 'Tags'"):
        arrays.block([((), ()), (None, ())])


def test_bad_rows_and_types_are_refused_naming_what_was_wrong() -> None:
    writer = NativeBlockWriter(["Name", "Duration"], ["String", "UInt64"])
    assert writer.block([]) == b""
    with pytest.raises(ValueError, match="row 1 has 1 values for 2 columns"):
        writer.block([("a", 1), ("b",)])
    with pytest.raises(ValueError, match="column 'Duration'"):
        writer.block([("a", "not a number")])
    with pytest.raises(ValueError, match="one type name per column"):
        NativeBlockWriter(["Name", "Duration"], ["String"])
    with pytest.raises(ValueError, match="unknown ClickHouse type"):
        NativeBlockWriter(["Name"], ["NoSuchType(3)"])


def test_a_block_of_the_wrong_types_is_refused_by_the_store_not_stored(store: Store) -> None:
    writer = NativeBlockWriter(["TraceId", "Duration"], ["String", "String"])
    with pytest.raises(Exception):  # noqa: B017 - the driver's error class differs per backend
        store.insert_native("otel_traces", ["TraceId", "Duration"], writer.block([("t", "x")]) + b"\xff")
    assert store.query("SELECT count() FROM otel_traces")[0][0] == 0
