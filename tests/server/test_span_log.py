"""The span log: records, progress, token retention, and its drainer
on a real chDB store (crash in the middle of an insert, backlog bound)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from inferpath.server.ingest import DurableIngest, Reservation, TableRows, dedup_token
from inferpath.server.otlp import decode_trace_request
from inferpath.server.span_log import FLAG_GZIP, FLAG_JSON, LoggedSpanIngest, SpanLog, token_digest
from inferpath.storage.rows import SPAN_COLUMNS
from inferpath.storage.store import Store

from .otlp_factory import trace_body

PROTOBUF = "application/x-protobuf"


def _token(n: int) -> bytes:
    return token_digest(f"export-{n}")


def test_records_survive_reopen_with_their_media_type_and_ids_continue(tmp_path: Path) -> None:
    log = SpanLog(tmp_path / "log")
    ranges = [log.append(_token(n), FLAG_JSON if n == 1 else 0, f"body {n}".encode() * 10) for n in range(3)]
    assert ranges == [(1, 2), (2, 3), (3, 4)] and log.backlog_bytes == 3 * 60
    log.close()  # killed: nothing drained
    reopened = SpanLog(tmp_path / "log")
    assert [r.body for r in reopened.unfinished] == [f"body {n}".encode() * 10 for n in range(3)]
    assert [(r.start, r.end) for r in reopened.unfinished] == ranges
    assert reopened.unfinished[1].content_type == "application/json"
    assert reopened.unfinished[0].content_encoding is None
    assert reopened.knows(_token(2)) and not reopened.knows(_token(3))
    assert reopened.log_id == log.log_id and reopened.backlog_bytes == 3 * 60
    assert reopened.append(_token(3), FLAG_GZIP, b"next") == (4, 5)
    reopened.close()


def test_progress_decides_what_is_unfinished(tmp_path: Path) -> None:
    log = SpanLog(tmp_path / "log")
    ranges = [log.append(_token(n), 0, b"x" * 50) for n in range(4)]
    log.begin_insert(ranges[0][0], ranges[1][1], "a" * 32, "b" * 16)
    log.done_insert(ranges[1][1])
    assert log.committed_offset == ranges[1][1] and log.backlog_bytes == 100
    log.begin_insert(ranges[2][0], ranges[3][1], "c" * 32, "d" * 16)  # killed during this insert
    log.close()
    reopened = SpanLog(tmp_path / "log")
    assert reopened.committed_offset == ranges[1][1] and reopened.backlog_bytes == 100
    assert [(r.start, r.end) for r in reopened.unfinished] == ranges[2:]
    unfinished = reopened.unfinished_insert
    assert unfinished is not None
    assert (unfinished.start, unfinished.end, unfinished.trace_id, unfinished.span_id) == (
        ranges[2][0],
        ranges[3][1],
        "c" * 32,
        "d" * 16,
    )
    assert all(reopened.knows(_token(n)) for n in range(4))  # drained records' tokens too
    reopened.done_insert(ranges[3][1])
    reopened.close()
    drained = SpanLog(tmp_path / "log")
    assert drained.unfinished == [] and drained.unfinished_insert is None and drained.backlog_bytes == 0
    assert drained.append(_token(4), 0, b"z") == (5, 6)  # ids are never reused
    drained.close()


def test_drained_records_keep_only_the_newest_tokens(tmp_path: Path) -> None:
    log = SpanLog(tmp_path / "log", max_tokens=3)
    ends = [log.append(_token(n), 0, b"y" * 100)[1] for n in range(8)]
    log.done_insert(ends[-2])  # seven drained, the last not
    log.close()
    reopened = SpanLog(tmp_path / "log", max_tokens=3)
    assert [(r.start, r.end) for r in reopened.unfinished] == [(8, 9)]
    assert reopened.knows(_token(5)) and not reopened.knows(_token(4))
    rows = sqlite3.connect(tmp_path / "log" / "spans.sqlite").execute("SELECT count(*) FROM exports").fetchone()
    assert rows == (3,)
    reopened.close()


def _exports(count: int, spans: int = 20) -> list[tuple[bytes, dict[str, list[str]]]]:
    return [trace_body(spans_per_trace=spans // 2, traces=2) for _ in range(count)]


def _accept(log_ingest: LoggedSpanIngest, body: bytes):
    decoded = decode_trace_request(body, content_type=PROTOBUF, content_encoding=None)
    return log_ingest.accept(decoded.spans, dedup_token("traces", PROTOBUF, None, body), body, PROTOBUF, None)


def _span_counts(store: Store) -> tuple[int, int]:
    return tuple(store.query("SELECT count(), uniqExact(SpanId) FROM otel_traces")[0])


@pytest.mark.parametrize("landed", [True, False])
def test_an_insert_cut_by_a_crash_is_settled_exactly_once_at_restart(
    store_url: str, tmp_path: Path, landed: bool
) -> None:
    exports = _exports(5)
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        log_ingest = LoggedSpanIngest(ingest, SpanLog(tmp_path / "log"))
        assert all(_accept(log_ingest, body).ok for body, _ in exports)
        # A crash between "B" and "D": the first three exports' insert ran (or not), no "D".
        first = list(log_ingest._queue)[:3]
        rows = [span.to_insert_row(timestamp_ns=True) for queued in first for span in queued.spans]
        log_ingest.log.begin_insert(
            first[0].start, first[-1].end, first[0].spans[0].trace_id, first[0].spans[0].span_id
        )
        if landed:
            assert ingest.commit(
                [TableRows("otel_traces", SPAN_COLUMNS, rows, checked=True)],
                f"wal-{log_ingest.log.log_id}-{first[0].start}-{first[-1].end}",
            ).ok
        log_ingest.log.close()  # killed: no drain, no close of the ingest

        noted: list[int] = []
        restarted = LoggedSpanIngest(
            ingest, SpanLog(tmp_path / "log"), on_committed=lambda spans: noted.append(len(spans))
        )
        assert restarted.recovered_spans_total == (40 if landed else 100)
        restarted.start()
        assert restarted.flush(30)
        # A retry of an export whose 200 was lost before the crash: known, not stored again.
        assert _accept(restarted, exports[0][0]).ok and restarted.duplicate_exports_total == 1
        restarted.close()
        assert _span_counts(store) == (100, 100)
        assert sum(noted) == (40 if landed else 100)
        if not landed:  # the interrupted range went in as one insert of exactly its rows
            assert noted[0] == 60


def test_the_backlog_bound_refuses_with_503_until_the_drainer_catches_up(store_url: str, tmp_path: Path) -> None:
    exports = _exports(6, spans=100)
    size = len(exports[0][0])
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        log_ingest = LoggedSpanIngest(
            ingest, SpanLog(tmp_path / "log"), max_backlog_bytes=3 * size + 3 * 100, backlog_wait_seconds=0
        )
        results = [_accept(log_ingest, body) for body, _ in exports]
        assert [r.status for r in results] == ["committed"] * 3 + ["overloaded"] * 3
        assert all(r.retry_after_seconds >= 1 and "backlog full" in r.message for r in results[3:])
        assert log_ingest.backlog_full_total == 3 and log_ingest.backlog_spans == 300
        log_ingest.start()
        assert log_ingest.flush(30) and log_ingest.backlog_bytes == 0
        assert all(_accept(log_ingest, body).ok for body, _ in exports[3:])
        assert log_ingest.flush(30)
        log_ingest.close()
        assert _span_counts(store) == (600, 600)
        # Small exports: everything queued went in as few inserts, not one per export.
        assert log_ingest.inserts_total <= 3


def test_exports_being_decoded_hold_backlog_room_and_one_that_cannot_fit_is_refused_at_once(
    store_url: str, tmp_path: Path
) -> None:
    exports = _exports(3, spans=100)
    exports[1] = _exports(1, spans=160)[0]  # larger: it passes the backlog's bound below
    size = len(exports[0][0])
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        log_ingest = LoggedSpanIngest(
            ingest, SpanLog(tmp_path / "log"), max_backlog_bytes=2 * size + size // 4, backlog_wait_seconds=0
        )
        # Alone, an export gets room whatever its size.
        huge = log_ingest.reserve(100 * size)
        assert isinstance(huge, Reservation) and log_ingest.reserved_bytes == 100 * size
        refused = log_ingest.reserve(1)
        assert refused.status == "overloaded" and refused.retry_after_seconds >= 1
        assert f"{100 * size} bytes being decoded, 1 more; max_backlog_bytes={2 * size + size // 4}" in refused.message
        huge.release()
        huge.release()  # once only
        assert log_ingest.reserved_bytes == 0
        # Two fit; the third does not, until one of them is answered.
        first, second = log_ingest.reserve(size), log_ingest.reserve(size)
        assert log_ingest.reserve(size).status == "overloaded"
        with first:
            assert _accept(log_ingest, exports[0][0]).ok  # logged: its bytes are now backlog too
        assert log_ingest.backlog_bytes >= size and log_ingest.reserved_bytes == size
        assert log_ingest.reserve(size).status == "overloaded"  # backlog + second + this > 2 * size
        with second:
            assert _accept(log_ingest, exports[1][0]).status == "overloaded"  # the backlog's own bound
        log_ingest.start()
        assert log_ingest.flush(30) and log_ingest.backlog_bytes == 0
        with log_ingest.reserve(size) as third:
            assert isinstance(third, Reservation) and _accept(log_ingest, exports[2][0]).ok
        assert log_ingest.flush(30)
        assert log_ingest.backlog_full_total == 4  # three refused reservations, one refused accept
        log_ingest.close()
        assert _span_counts(store) == (200, 200)


def test_exports_of_other_media_types_and_encodings_are_decoded_again_from_the_log(
    store_url: str, tmp_path: Path
) -> None:
    import gzip

    body, ids = trace_body(spans_per_trace=3, traces=2)
    zipped = gzip.compress(body)
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        first = LoggedSpanIngest(ingest, SpanLog(tmp_path / "log"))
        decoded = decode_trace_request(zipped, content_type=PROTOBUF, content_encoding="gzip")
        assert first.accept(decoded.spans, "t-gzip", zipped, PROTOBUF, "gzip").ok
        first.log.close()  # killed before the drainer ran
        restarted = LoggedSpanIngest(ingest, SpanLog(tmp_path / "log"))
        restarted.start()
        assert restarted.flush(30)
        restarted.close()
        stored = {r[0] for r in store.query("SELECT SpanId FROM otel_traces")}
    assert stored == {s for spans in ids.values() for s in spans}
    assert os.path.isdir(tmp_path / "log")
