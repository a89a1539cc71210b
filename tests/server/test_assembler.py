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


def recorded_bodies(shared_data: Path) -> list[bytes]:
    """vLLM's own OTLP exports: under load, then at start-up (in the order vLLM sent them)."""
    capture = shared_data / "vllm_live_capture"
    paths = sorted((capture / "otlp").glob("*.pb")) + sorted((capture / "startup_otlp").glob("*.pb"))
    assert len(paths) >= 10
    return [path.read_bytes() for path in paths]


def decode(body: bytes) -> list[SpanRow]:
    return decode_trace_request(body, content_type="application/x-protobuf", content_encoding=None).spans


def commit(store: Store, assembler: RequestAssembler, spans: list[SpanRow], now: float | None = None) -> None:
    """What the server does per insert block: insert (a block committed again is deduplicated
    by its token), then hand the committed spans over."""
    token = "test-" + ",".join(s.span_id for s in spans)
    store.insert("otel_traces", [s.to_insert_row() for s in spans], SPAN_COLUMNS, dedup_token=token)
    assembler.note_spans(spans, now=now)


def rows_by_trace(store: Store) -> dict[str, dict]:
    return {row.pop("trace_id"): row for row in stored_rows(store) if row.pop("updated_at")}


def read_back_rows(store: Store, trace_ids) -> dict[str, dict]:
    """Re-derive ``trace_ids`` from their spans read back; the stored rows then."""
    reading = RequestAssembler(store, settle_seconds=0)
    try:
        reading.note_trace_ids(trace_ids)
        assert reading.flush(10.0)
        assert reading.assembled_from_memory_total == 0
    finally:
        reading.stop()
    return rows_by_trace(store)


def test_rows_from_held_spans_equal_rows_from_spans_read_back(shared_data: Path, store: Store) -> None:
    bodies = recorded_bodies(shared_data)
    assembler = RequestAssembler(store, settle_seconds=0)
    try:
        for body in bodies:
            commit(store, assembler, decode(body))
        # A block committed again (a client's retry): deduplicated by its token, but the
        # trace-id table may count it, so its traces are read back.
        commit(store, assembler, decode(bodies[0]))
        assert assembler.flush(10.0)
        retried = {s.trace_id for s in decode(bodies[0])}
        assert assembler.assembled_from_store_total == len(retried)
        assert assembler.assembled_from_memory_total >= 10
        assert assembler.held_spans == 0
    finally:
        assembler.stop()
    from_memory = rows_by_trace(store)
    assert len(from_memory) >= 10
    assert read_back_rows(store, from_memory) == from_memory


def _engine_spans(shared_data: Path) -> list[SpanRow]:
    spans = [s for s in startup_spans(shared_data) if s.trace_id == SHARED_TRACE]
    return sorted(spans, key=lambda s: s.start_ns)


def test_spans_stored_before_a_restart_or_assembled_earlier_are_read_back(shared_data: Path, store: Store) -> None:
    first, second, third = _engine_spans(shared_data)
    insert(store, [first])  # stored before this assembler existed
    assembler = RequestAssembler(store, settle_seconds=0)
    try:
        commit(store, assembler, [second])
        assert assembler.flush(10.0)
        assert assembler.assembled_from_store_total == 1 and assembler.assembled_from_memory_total == 0
        assert rows_by_trace(store)[SHARED_TRACE]["span_count"] == 2
        commit(store, assembler, [third])  # a late span of a trace assembled already
        assert assembler.flush(10.0)
        assert assembler.assembled_from_store_total == 2
        assert rows_by_trace(store)[SHARED_TRACE]["span_count"] == 3
    finally:
        assembler.stop()


def test_spans_past_the_bound_are_let_go_and_read_back(shared_data: Path, store: Store) -> None:
    first, second, third = _engine_spans(shared_data)
    assembler = RequestAssembler(store, settle_seconds=3600, max_held_spans=2)
    try:
        commit(store, assembler, [first, second])
        assert assembler.held_spans == 2
        commit(store, assembler, [third])
        assert assembler.held_spans == 0
        assert assembler.flush(10.0)
        assert assembler.assembled_from_store_total == 1
        assert rows_by_trace(store)[SHARED_TRACE]["span_count"] == 3
    finally:
        assembler.stop()
