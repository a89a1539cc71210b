"""The request assembler against a real embedded store: settling, late spans, re-derivation."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from inferpath.server.assembler import RequestAssembler, read_trace_spans
from inferpath.server.otlp import decode_trace_request
from inferpath.storage.rows import SPAN_COLUMNS, SpanRow
from inferpath.storage.store import Store

SHARED_TRACE = "0af7651916cd43dd8448eb211c80319c"  # vLLM start-up capture: three requests, one traceparent
CALLER_SPAN = "b7ad6b7169203331"


@pytest.fixture()
def store(store_url: str):
    opened = Store.open(store_url)
    yield opened
    opened.close()


def startup_spans(shared_data: Path) -> list[SpanRow]:
    spans = []
    for path in sorted((shared_data / "vllm_live_capture" / "startup_otlp").glob("*.pb")):
        spans += decode_trace_request(
            path.read_bytes(), content_type="application/x-protobuf", content_encoding=None
        ).spans
    return spans


def insert(store: Store, spans: list[SpanRow]) -> None:
    store.insert("otel_traces", [s.to_insert_row() for s in spans], SPAN_COLUMNS)


def stored_rows(store: Store) -> list[dict]:
    return store.query_dicts("SELECT * FROM inferpath_requests FINAL ORDER BY trace_id")


def test_settled_traces_are_assembled_and_late_spans_rederive_the_row(shared_data: Path, store: Store) -> None:
    spans = startup_spans(shared_data)
    engine = sorted((s for s in spans if s.trace_id == SHARED_TRACE), key=lambda s: s.start_ns)
    startup_only = [s for s in spans if s.trace_id != SHARED_TRACE]
    assert len(engine) == 3 and startup_only
    assembler = RequestAssembler(store, settle_seconds=2.0)
    try:
        insert(store, engine[:2] + startup_only)
        assembler.note_trace_ids({s.trace_id for s in engine[:2] + startup_only}, now=100.0)
        assert assembler.run_once(now=101.0) == 0  # not settled yet
        assert assembler.pending_traces == 1 + len({s.trace_id for s in startup_only})
        assert assembler.run_once(now=102.5) == 1
        assert assembler.traces_without_row_total == len({s.trace_id for s in startup_only})
        assert assembler.writer.flush(10.0)
        (row,) = stored_rows(store)
        assert row["trace_id"] == SHARED_TRACE and row["span_count"] == 2
        assert row["client_e2e_ns"] is None and row["network_ns"] is None

        # The caller's CLIENT span and the third engine span arrive late.
        first = engine[0]
        caller = SpanRow(
            timestamp=first.timestamp - timedelta(milliseconds=5),
            trace_id=SHARED_TRACE,
            span_id=CALLER_SPAN,
            span_name="chat tiny",
            span_kind="Client",
            service_name="client",
            span_attributes={"gen_ai.operation.name": "chat", "gen_ai.response.time_to_first_chunk": "0.25"},
            duration_ns=first.duration_ns + 10_000_000,
        )
        insert(store, [caller, engine[2], engine[0]])  # engine[0] re-sent: deduplicated
        assembler.note_trace_ids([SHARED_TRACE], now=200.0)
        assert assembler.run_once(now=202.0) == 1
        assert assembler.writer.flush(10.0)
        (row,) = stored_rows(store)
        assert row["span_count"] == 4
        assert row["client_ttft_ns"] == 250_000_000
        assert row["client_e2e_ns"] == first.duration_ns + 10_000_000
        # Every engine span's parent is the caller: three hops of (caller − engine).
        assert row["network_ns"] == sum(max(0, caller.duration_ns - s.duration_ns) for s in engine)
    finally:
        assembler.stop()
    assert assembler.writer.rows_inserted_total == 2


def test_force_assembles_at_once_and_read_back_groups_by_trace(shared_data: Path, store: Store) -> None:
    spans = startup_spans(shared_data)
    insert(store, spans)
    grouped = read_trace_spans(store, {s.trace_id for s in spans} | {"f" * 32})
    assert sum(len(v) for v in grouped.values()) == len(spans) and "f" * 32 not in grouped
    assembler = RequestAssembler(store, settle_seconds=3600)
    try:
        assembler.note_trace_ids(grouped)
        assert assembler.run_once() == 0
        assert assembler.flush(10.0)
        assert [r["trace_id"] for r in stored_rows(store)] == [SHARED_TRACE]
        assert assembler.pending_traces == 0
    finally:
        assembler.stop()


def test_background_thread_assembles_without_being_asked(shared_data: Path, store: Store) -> None:
    spans = [s for s in startup_spans(shared_data) if s.trace_id == SHARED_TRACE]
    insert(store, spans)
    assembler = RequestAssembler(store, settle_seconds=0.1, interval_seconds=0.05)
    assembler.start()
    try:
        assembler.note_trace_ids([SHARED_TRACE])
        deadline = time.monotonic() + 10
        while assembler.rows_written_total == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert assembler.rows_written_total == 1
    finally:
        assembler.stop()
    assert [r["span_count"] for r in stored_rows(store)] == [3]
