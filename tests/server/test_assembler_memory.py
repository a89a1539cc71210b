"""Request rows derived from the spans the server holds in memory equal the rows derived
from the spans read back from the store; memory is used only when it provably holds every
stored span of a trace (restart, late spans, eviction), on real chDB and recorded input."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from inferpath.config import Settings
from inferpath.server.assembler import RequestAssembler, read_trace_spans
from inferpath.server.otlp import decode_trace_request
from inferpath.server.runtime import serve_in_thread
from inferpath.server.span_buffer import SpanBuffer, TraceIdFilter, trace_id_ints
from inferpath.storage.rows import SPAN_COLUMNS, SpanRow
from inferpath.storage.store import Store

PROTOBUF = {"content-type": "application/x-protobuf"}


@pytest.fixture()
def store(store_url: str):
    opened = Store.open(store_url)
    yield opened
    opened.close()


def recorded_bodies(shared_data: Path) -> list[bytes]:
    """vLLM's own OTLP exports: under load, then at start-up (in the order vLLM sent them)."""
    capture = shared_data / "vllm_live_capture"
    paths = sorted((capture / "otlp").glob("*.pb")) + sorted((capture / "startup_otlp").glob("*.pb"))
    assert len(paths) >= 10
    return [path.read_bytes() for path in paths]


def decode(body: bytes) -> list[SpanRow]:
    return decode_trace_request(body, content_type="application/x-protobuf", content_encoding=None).spans


def commit(store: Store, assembler: RequestAssembler, spans: list[SpanRow], now: float | None = None) -> None:
    """What the server does per export: insert, then hand the committed spans over."""
    store.insert("otel_traces", [s.to_insert_row() for s in spans], SPAN_COLUMNS)
    assembler.note_spans(spans, now=now)


def stored_rows(store: Store) -> dict[str, dict]:
    rows = store.query_dicts("SELECT * FROM inferpath_requests FINAL ORDER BY trace_id")
    return {row["trace_id"]: {k: v for k, v in row.items() if k != "updated_at"} for row in rows}


def read_back_rows(store: Store, trace_ids) -> dict[str, dict]:
    """Re-derive ``trace_ids`` on the read-back path (every stored span, read from the store)
    and return the stored rows then: each row's newest version is the read-back one."""
    reading = RequestAssembler(store, settle_seconds=0, hold_spans=False)
    try:
        assert not reading.holds_spans
        reading.note_trace_ids(trace_ids)
        assert reading.flush(10.0)
        assert reading.assembled_from_memory_total == 0
        assert reading.assembled_from_store_total == len(set(trace_ids))
    finally:
        reading.stop()
    return stored_rows(store)


def test_recorded_vllm_exports_through_the_server_give_the_read_back_rows(shared_data: Path, store_url: str) -> None:
    bodies = recorded_bodies(shared_data)
    with serve_in_thread(Settings(store_url=store_url, assembly_settle_seconds=0.1), port=0) as running:
        runtime = running.runtime
        assert runtime.assembler.holds_spans
        with httpx.Client(base_url=running.url, timeout=60.0) as http:
            for body in bodies:
                assert http.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 200
            assert http.post("/api/v1/flush").json()["ok"]
        trace_ids = {s.trace_id for body in bodies for s in decode(body)}
        stored = stored_rows(runtime.store)
        # Every trace went the memory path (some twice: a late span), none was read back.
        assert runtime.assembler.assembled_from_memory_total >= len(trace_ids)
        assert runtime.assembler.assembled_from_store_total == 0
        expected = read_back_rows(runtime.store, trace_ids)
    llm_requests = sum(s.span_name == "llm_request" for body in bodies for s in decode(body))
    assert llm_requests >= 10 and len(stored) >= 10
    assert stored == expected


def test_memory_and_read_back_assemblers_write_identical_rows(shared_data: Path, store: Store) -> None:
    memory = RequestAssembler(store, settle_seconds=0)
    try:
        for body in recorded_bodies(shared_data):
            commit(store, memory, decode(body))
        assert memory.flush(10.0)
        from_memory = stored_rows(store)
        assert memory.assembled_from_memory_total > 0 and memory.assembled_from_store_total == 0
    finally:
        memory.stop()
    trace_ids = {s.trace_id for body in recorded_bodies(shared_data) for s in decode(body)}
    assert len(from_memory) >= 10
    assert read_back_rows(store, trace_ids) == from_memory


def _trace(shared_data: Path) -> list[SpanRow]:
    """The start-up capture's three engine spans sharing one trace, earliest first."""
    spans = [
        s
        for body in recorded_bodies(shared_data)
        for s in decode(body)
        if s.trace_id == "0af7651916cd43dd8448eb211c80319c"
    ]
    assert len(spans) == 3
    return sorted(spans, key=lambda s: s.start_ns)


def _shifted(span: SpanRow, seconds: float, span_id: str | None = None) -> SpanRow:
    return replace(span, timestamp=span.timestamp + timedelta(seconds=seconds), span_id=span_id or span.span_id)


def test_after_a_restart_spans_stored_earlier_are_read_back(shared_data: Path, store: Store) -> None:
    first, second, third = _trace(shared_data)
    store.insert("otel_traces", [first.to_insert_row()], SPAN_COLUMNS)  # before the "restart"
    assembler = RequestAssembler(store, settle_seconds=0)
    try:
        # Later spans, all starting after everything stored: memory alone would miss `first`.
        later = [_shifted(second, 10), _shifted(third, 10)]
        commit(store, assembler, later)
        assert assembler.flush(10.0)
        assert assembler.assembled_from_store_total == 1 and assembler.assembled_from_memory_total == 0
        (row,) = stored_rows(store).values()
        assert row["span_count"] == 3
        # A late span of the same trace is read back too: memory let go of it.
        commit(store, assembler, [_shifted(third, 11, span_id="00000000000000a1")])
        assert assembler.flush(10.0)
        assert assembler.assembled_from_store_total == 2 and stored_rows(store)[first.trace_id]["span_count"] == 4
    finally:
        assembler.stop()


@pytest.mark.parametrize(
    "trace_id",
    [
        "00000000000000000000000000000001",
        "00ff0000000000000000000000000000",
        "0000000000000000ffffffffffffffff",
        "ffffffffffffffffffffffffffffffff",
    ],
)
def test_the_check_for_older_stored_spans_finds_ids_with_leading_zero_bytes(
    shared_data: Path, store: Store, trace_id: str
) -> None:
    # The check binds trace ids as 128-bit integers and formats them back to 32 digits in SQL.
    first, second, third = (replace(s, trace_id=trace_id) for s in _trace(shared_data))
    store.insert("otel_traces", [first.to_insert_row()], SPAN_COLUMNS)  # before the "restart"
    # Held traces that the check must clear: ids differing only in their trailing digits.
    others = [replace(second, trace_id=f"{n:032x}", span_id="00000000000000c1") for n in (2, 3, 0xFF << 8)]
    assembler = RequestAssembler(store, settle_seconds=0)
    try:
        commit(store, assembler, [_shifted(second, 10), _shifted(third, 10)] + [_shifted(o, 10) for o in others])
        assert assembler.flush(10.0)
        assert assembler.assembled_from_store_total == 1
        assert assembler.assembled_from_memory_total == len(others)
        assert stored_rows(store)[trace_id]["span_count"] == 3
    finally:
        assembler.stop()


def test_trace_id_ints_splits_off_ids_that_are_not_32_hex_digits() -> None:
    odd = ["abc", "g" * 32, "0x" + "0" * 30, "0_" + "0" * 30, " " + "0" * 31, "A" * 32, "0" * 33]
    ints, malformed = trace_id_ints(["0" * 31 + "a", "f" * 32] + odd)
    assert ints == [10, (1 << 128) - 1]
    assert malformed == odd


def test_held_spans_older_than_the_store_are_read_back_without_a_check(shared_data: Path, store: Store) -> None:
    first, second, third = _trace(shared_data)
    store.insert("otel_traces", [_shifted(third, 60, span_id="00000000000000b1").to_insert_row()], SPAN_COLUMNS)
    assembler = RequestAssembler(store, settle_seconds=0)
    try:
        commit(store, assembler, [first, second, third])
        assert assembler.flush(10.0)
        assert assembler.assembled_from_store_total == 1
        assert stored_rows(store)[first.trace_id]["span_count"] == 4
    finally:
        assembler.stop()


def test_late_spans_rederive_from_memory_within_the_window_and_read_back_after(shared_data: Path, store: Store) -> None:
    first, second, third = _trace(shared_data)
    assembler = RequestAssembler(store, settle_seconds=2.0, late_window_seconds=30.0)
    try:
        commit(store, assembler, [first], now=0.0)
        assert assembler.run_once(now=1.0) == 0  # not settled
        assert assembler.run_once(now=100.0) == 1 and assembler.writer.flush(10.0)
        assert stored_rows(store)[first.trace_id]["span_count"] == 1
        commit(store, assembler, [second, first], now=105.0)  # late, and `first` re-sent by a retry
        assert assembler.run_once(force=True, now=110.0) == 1 and assembler.writer.flush(10.0)
        assert stored_rows(store)[first.trace_id]["span_count"] == 2
        assert assembler.assembled_from_memory_total == 2 and assembler.held_spans == 3
        # Past the late window the spans are let go; a later span means a read-back.
        assembler.run_once(now=150.0)
        assert assembler.held_spans == 0
        commit(store, assembler, [third], now=151.0)
        assert assembler.run_once(force=True, now=152.0) == 1 and assembler.writer.flush(10.0)
        assert assembler.assembled_from_store_total == 1
        assert stored_rows(store)[first.trace_id]["span_count"] == 3
    finally:
        assembler.stop()


def test_evicted_and_externally_noted_traces_are_read_back(shared_data: Path, store: Store) -> None:
    bodies = recorded_bodies(shared_data)
    assembler = RequestAssembler(store, settle_seconds=3600, max_held_spans=5, max_held_traces=3)
    try:
        for body in bodies:
            commit(store, assembler, decode(body))
        assert assembler.held_spans <= 5
        assert assembler.held_spans_evicted_traces_total > 0
        first, *_ = _trace(shared_data)
        assembler.note_trace_ids([first.trace_id])  # someone else wrote spans of it
        assert assembler.flush(10.0)
        assert assembler.assembled_from_store_total >= assembler.held_spans_evicted_traces_total
        trace_ids = {s.trace_id for body in bodies for s in decode(body)}
        assert stored_rows(store) == read_back_rows(store, trace_ids)
    finally:
        assembler.stop()


def test_trace_id_filter_rotates_and_has_no_false_negatives_within_two_generations() -> None:
    ids = [f"{n:032x}" for n in range(1, 3001)]
    bloom = TraceIdFilter(capacity=1000, bits=1 << 16)
    rotations = [bloom.add(trace_id) for trace_id in ids[:2000]]
    assert rotations.count(True) == 1 and rotations[1000]
    assert all(trace_id in bloom for trace_id in ids[:2000])
    assert sum(trace_id in bloom for trace_id in ids[2000:]) < 100  # never added: few false positives
    bloom.add(ids[2000])  # drops the generation of ids[:1000]
    assert sum(trace_id in bloom for trace_id in ids[:1000]) < 100
    with pytest.raises(ValueError, match="bits"):
        TraceIdFilter(bits=1000)


@pytest.mark.e2e
def test_demo_multi_process_traces_give_the_same_rows_from_memory_and_from_the_store(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from inferpath.demo.run import DemoOptions, run_demo

    base = tmp_path_factory.mktemp("demo")
    store_url = f"chdb://{base / 'store'}"
    outcome = run_demo(
        DemoOptions(
            requests=30,
            speed=10.0,
            exit_when_done=True,
            store_url=store_url,
            port=0,
            dashboard=False,
            log_dir=base / "logs",
        )
    )
    assert outcome.stored_requests == 30
    store = Store.open(store_url)
    try:
        # (1) The demo server's rows (derived from the spans it held) against a read-back pass.
        served = stored_rows(store)
        assert len(served) == 30
        assert read_back_rows(store, served) == served
        # (2) The same spans committed again the way the gateway, engine and client processes
        # exported them (one chunk per trace and process, in order of their last span end,
        # several chunks per export), under new trace ids and one hour later: every trace
        # goes the memory path, and its rows equal the read-back rows.
        spans_by_trace = read_trace_spans(store, served)
        renamed = {trace_id: f"{int(trace_id, 16) ^ 1:032x}" for trace_id in served}
        chunks = []
        for trace_id, spans in spans_by_trace.items():
            by_service: dict[str, list[SpanRow]] = {}
            for span in spans:
                moved = replace(span, trace_id=renamed[trace_id], timestamp=span.timestamp + timedelta(hours=1))
                by_service.setdefault(span.service_name, []).append(moved)
            chunks += [(max(s.end_ns for s in group), group) for group in by_service.values()]
        assert len(chunks) >= 3 * 30  # client, gateway, engine
        chunks.sort(key=lambda chunk: chunk[0])
        memory = RequestAssembler(store, settle_seconds=3600)
        try:
            for offset in range(0, len(chunks), 7):
                commit(store, memory, [s for _end, group in chunks[offset : offset + 7] for s in group])
            assert memory.flush(10.0)
            assert memory.assembled_from_memory_total == 30 and memory.assembled_from_store_total == 0
        finally:
            memory.stop()
        from_memory = {t: row for t, row in stored_rows(store).items() if t in set(renamed.values())}
        assert len(from_memory) == 30
        assert read_back_rows(store, from_memory) == {**served, **from_memory}
    finally:
        store.close()


def _span(trace_number: int, start_unix_s: float, span_number: int = 1) -> SpanRow:
    start = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=start_unix_s)
    return SpanRow(timestamp=start, trace_id=f"{trace_number:032x}", span_id=f"{span_number:016x}")


def _rotate(buffer: SpanBuffer, first_filler: int, capacity: int) -> None:
    """Let go of ``capacity`` filler traces: one rotation of the buffer's filter."""
    for number in range(first_filler, first_filler + capacity):
        buffer.drop(f"{number:032x}")


def test_traces_held_at_a_filter_rotation_stay_in_memory_and_dropped_ids_are_caught() -> None:
    buffer = SpanBuffer(0, trace_filter=TraceIdFilter(capacity=4, bits=1 << 10))
    old = _span(1, 100.0)
    buffer.add(old.trace_id, [old], was_pending=False)
    buffer.take([old.trace_id])
    buffer.drop(old.trace_id)  # let go of: its id is forgotten from now on
    _rotate(buffer, 1000, 4)
    now = _span(2, 500.0)
    buffer.add(now.trace_id, [now], was_pending=False)
    _rotate(buffer, 2000, 4)  # drops the generation holding trace 1
    # Current traffic is not sent to be read back: the cutoff moved past what the dropped
    # generation can hold (starts seen at the previous rotation), not past the newest start.
    assert buffer.cutoff_unix_s <= 501
    memory, _ = buffer.take([now.trace_id])
    assert now.trace_id in memory
    # A late span of the dropped trace is caught by the cutoff: it is read back.
    late = _span(1, 100.5, span_number=2)
    buffer.add(late.trace_id, [late], was_pending=False)
    memory, _ = buffer.take([late.trace_id])
    assert late.trace_id not in memory


def test_a_late_span_of_a_forgotten_trace_renews_its_id_in_the_filter() -> None:
    buffer = SpanBuffer(0, trace_filter=TraceIdFilter(capacity=4, bits=1 << 10))
    first = _span(1, 100.0)
    buffer.add(first.trace_id, [first], was_pending=False)
    buffer.take([first.trace_id])
    buffer.drop(first.trace_id)
    _rotate(buffer, 1000, 4)
    late = _span(1, 700.0, span_number=2)  # starts after anything seen at that rotation
    buffer.add(late.trace_id, [late], was_pending=False)  # forgotten: not held, id renewed
    _rotate(buffer, 2000, 4)
    later = _span(1, 701.0, span_number=3)
    buffer.add(later.trace_id, [later], was_pending=False)
    memory, _ = buffer.take([later.trace_id])
    assert later.trace_id not in memory  # still known forgotten: read back with every span


def test_pending_spans_are_counted_apart_from_assembled_ones() -> None:
    buffer = SpanBuffer(0, max_spans=4, max_traces=10)
    first, second = _span(1, 100.0), _span(1, 100.1, span_number=2)
    buffer.add(first.trace_id, [first, second], was_pending=False)
    assert buffer.pending_spans == 2 and buffer.has_room_for(2, 1) and not buffer.has_room_for(3, 1)
    buffer.take([first.trace_id])
    buffer.assembled(first.trace_id, still_pending=False, now=0.0)
    assert buffer.pending_spans == 0 and buffer.held_spans == 2  # held for late spans
    late = _span(1, 100.2, span_number=3)
    buffer.add(late.trace_id, [late], was_pending=False)  # re-derived from all three
    assert buffer.pending_spans == 3
    buffer.drop(late.trace_id)
    assert buffer.pending_spans == 0 and buffer.held_spans == 0


def test_a_full_buffer_of_pending_traces_holds_the_inserter_back_instead_of_evicting(store: Store) -> None:
    """Pending traces alone at the bound: the next committed spans wait for an assembly pass
    (bounded), so no pending trace is let go into a read-back."""
    assembler = RequestAssembler(
        store,
        settle_seconds=0.3,
        interval_seconds=0.05,
        max_held_spans=10,
        max_held_traces=100,
        max_room_wait_seconds=5.0,
    )
    now = datetime.now(timezone.utc).timestamp()
    batches = [[_span(100 * batch + n, now + 0.001 * n) for n in range(5)] for batch in range(4)]
    assembler.start()
    try:
        for batch in batches:  # 20 spans of 20 traces through a bound of 10 spans
            commit(store, assembler, batch)
        assert assembler.flush(10.0)
        assert assembler.room_waits_total >= 1 and assembler.room_wait_seconds_total > 0
        assert assembler.assembled_from_store_total == 0
        assert assembler.assembled_from_memory_total == 20
    finally:
        assembler.stop()


def test_without_the_assembly_thread_nothing_waits_and_the_bounds_evict(store: Store) -> None:
    assembler = RequestAssembler(
        store, settle_seconds=3600, max_held_spans=10, max_held_traces=100, max_room_wait_seconds=5.0
    )
    now = datetime.now(timezone.utc).timestamp()
    try:
        for batch in range(4):
            commit(store, assembler, [_span(100 * batch + n, now) for n in range(5)])
        assert assembler.room_waits_total == 0 and assembler.held_spans_evicted_traces_total == 10
    finally:
        assembler.stop()


def test_the_held_span_bounds_come_from_the_environment(store_url: str) -> None:
    environ = {"INFERPATH_ASSEMBLY_MAX_HELD_SPANS": "123456", "INFERPATH_ASSEMBLY_MAX_HELD_TRACES": "7890"}
    settings = Settings.from_env(environ, store_url=store_url)
    assert (settings.assembly_max_held_spans, settings.assembly_max_held_traces) == (123_456, 7_890)
    with serve_in_thread(settings, port=0) as running:
        buffer = running.runtime.assembler._buffer
        assert buffer is not None and (buffer.max_spans, buffer.max_traces) == (123_456, 7_890)
    with pytest.raises(ValueError, match="assembly_max_held_spans"):  # below the floor of 1000
        Settings.from_env({"INFERPATH_ASSEMBLY_MAX_HELD_SPANS": "10"}, store_url=store_url)
