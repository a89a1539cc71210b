"""The span log: records, progress, token retention, and its drainer
on a real chDB store (crash in the middle of an insert, backlog bound)."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from inferpath.server.ingest import DurableIngest, Reservation, TableRows, dedup_token
from inferpath.server.otlp import decode_trace_request
from inferpath.server.span_log import LoggedSpanIngest, SpanLog, UnfinishedInsert, range_token, token_digest
from inferpath.storage.rows import SPAN_COLUMNS
from inferpath.storage.store import Store

from .otlp_factory import trace_body

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


def _token(n: int) -> bytes:
    return token_digest(f"export-{n}")


def test_records_survive_reopen_with_their_media_type_and_ids_continue(tmp_path: Path) -> None:
    log = SpanLog(tmp_path / "log")
    ids = [
        log.append(_token(n), JSON if n == 1 else PROTOBUF, "gzip" if n == 2 else None, b"%d" % n * 60)
        for n in range(3)
    ]
    assert ids == [1, 2, 3] and log.backlog_bytes == 3 * 60
    log.close()  # killed: nothing drained
    reopened = SpanLog(tmp_path / "log")
    assert [r.body for r in reopened.unfinished] == [b"%d" % n * 60 for n in range(3)]
    assert [(r.start, r.end, r.token) for r in reopened.unfinished] == [(n + 1, n + 2, _token(n)) for n in range(3)]
    assert [(r.content_type, r.content_encoding) for r in reopened.unfinished] == [
        (PROTOBUF, None),
        (JSON, None),
        (PROTOBUF, "gzip"),
    ]
    assert reopened.knows(_token(2)) and not reopened.knows(_token(3)) and reopened.backlog_bytes == 3 * 60
    assert reopened.append(_token(3), PROTOBUF, "deflate", b"next") == 4
    reopened.close()


def test_progress_decides_what_is_unfinished(tmp_path: Path, caplog) -> None:
    log = SpanLog(tmp_path / "log")
    ids = [log.append(_token(n), PROTOBUF, None, b"x" * 50) for n in range(4)]
    log.begin_insert(ids[0], ids[1] + 1, [("a" * 32, "b" * 16)])
    log.done_insert(ids[1] + 1)
    assert log.committed_offset == ids[1] + 1 and log.backlog_bytes == 100
    log.begin_insert(ids[2], ids[3] + 1, [("c" * 32, "d" * 16), ("e" * 32, "f" * 16)])  # killed during it
    log.close()
    reopened = SpanLog(tmp_path / "log")
    assert reopened.committed_offset == ids[2] and reopened.backlog_bytes == 100
    assert [r.start for r in reopened.unfinished] == ids[2:]
    samples = (("c" * 32, "d" * 16), ("e" * 32, "f" * 16))
    assert reopened.unfinished_insert == UnfinishedInsert(ids[2], ids[3] + 1, samples)
    assert all(reopened.knows(_token(n)) for n in range(4))  # drained records' tokens too
    reopened.done_insert(ids[3] + 1)
    reopened.close()
    drained = SpanLog(tmp_path / "log")
    assert drained.unfinished == [] and drained.unfinished_insert is None and drained.backlog_bytes == 0
    assert drained.append(_token(4), PROTOBUF, None, b"z") == 5  # ids are not reused
    drained.close()
    with closing(sqlite3.connect(tmp_path / "log" / "spans.sqlite")) as db, db:  # a line no version writes
        db.execute("INSERT OR REPLACE INTO meta VALUES ('begun', 'abc def')")
    with caplog.at_level(logging.WARNING, logger="inferpath.server.span_log"):
        damaged = SpanLog(tmp_path / "log")
    assert damaged.unfinished_insert is None and [r.start for r in damaged.unfinished] == [5]
    assert any("unreadable begun-insert line 'abc def'" in r.getMessage() for r in caplog.records)
    damaged.close()


def test_drained_records_are_deleted_and_only_the_newest_tokens_kept(tmp_path: Path) -> None:
    log = SpanLog(tmp_path / "log", max_tokens=3)
    ids = [log.append(_token(n), PROTOBUF, None, b"y" * 100) for n in range(8)]
    log.done_insert(ids[-1])  # seven drained, the last not
    log.close()
    reopened = SpanLog(tmp_path / "log", max_tokens=3)
    assert [r.start for r in reopened.unfinished] == [8]
    assert reopened.knows(_token(5)) and not reopened.knows(_token(4))
    reopened.close()
    with closing(sqlite3.connect(tmp_path / "log" / "spans.sqlite")) as db, db:
        assert db.execute("SELECT count(*) FROM exports").fetchone() == (1,)
        assert db.execute("SELECT count(*) FROM tokens").fetchone() == (3,)


def test_a_second_process_cannot_open_a_log_in_use(tmp_path: Path) -> None:
    import subprocess
    import sys

    log = SpanLog(tmp_path / "log")
    log.append(_token(0), PROTOBUF, None, b"held")
    opener = "import sys; from inferpath.server.span_log import SpanLog; SpanLog(sys.argv[1])"
    other = subprocess.run([sys.executable, "-c", opener, str(tmp_path / "log")], capture_output=True, text=True)
    assert other.returncode != 0 and "database is locked" in other.stderr
    log.close()
    again = subprocess.run([sys.executable, "-c", opener, str(tmp_path / "log")], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr


def test_a_commit_that_fails_changes_nothing(tmp_path: Path) -> None:
    import resource

    log = SpanLog(tmp_path / "log")
    assert log.append(_token(0), PROTOBUF, None, b"a" * 1000) == 1
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, hard))
    try:
        with pytest.raises(sqlite3.Error):
            log.append(_token(1), PROTOBUF, None, os.urandom(300_000))  # the WAL cannot grow: the commit fails
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert not log.knows(_token(1)) and log.backlog_bytes == 1000 and log.end_offset == 2
    assert log.append(_token(1), PROTOBUF, None, b"b" * 10) == 2
    log.close()


def test_a_log_held_by_another_process_is_refused_and_left_in_place(tmp_path: Path) -> None:
    SpanLog(tmp_path / "log").close()
    holder = sqlite3.connect(tmp_path / "log" / "spans.sqlite", isolation_level=None, timeout=0)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            SpanLog(tmp_path / "log")
    finally:
        holder.close()
    assert sorted(p.name for p in (tmp_path / "log").iterdir() if "corrupt" in p.name) == []


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
            first[0].start, first[-1].end, [(first[0].spans[0].trace_id, first[0].spans[0].span_id)]
        )
        if landed:
            assert ingest.commit(
                [TableRows("otel_traces", SPAN_COLUMNS, rows, checked=True)],
                range_token([queued.token for queued in first]),
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
    import base64
    import gzip
    import json
    import zlib

    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    bodies = [trace_body(spans_per_trace=3, traces=2) for _ in range(4)]
    as_json = json_format.MessageToDict(ExportTraceServiceRequest.FromString(bodies[3][0]))
    for span in (s for r in as_json["resourceSpans"] for ss in r["scopeSpans"] for s in ss["spans"]):
        for key in ("traceId", "spanId", "parentSpanId"):
            if key in span:  # OTLP/JSON ids are hex
                span[key] = base64.b64decode(span[key]).hex()
    sent = [
        (gzip.compress(bodies[0][0]), PROTOBUF, "gzip"),
        (zlib.compress(bodies[1][0]), PROTOBUF, "deflate"),
        (gzip.compress(bodies[2][0]), PROTOBUF, "x-gzip"),
        (json.dumps(as_json).encode(), "application/json; charset=utf-8", None),
    ]
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        first = LoggedSpanIngest(ingest, SpanLog(tmp_path / "log"))
        for body, content_type, encoding in sent:
            decoded = decode_trace_request(body, content_type=content_type, content_encoding=encoding)
            token = dedup_token("traces", content_type, encoding, body)
            assert first.accept(decoded.spans, token, body, content_type, encoding).ok
        first.log.close()  # killed before the drainer ran
        restarted = LoggedSpanIngest(ingest, SpanLog(tmp_path / "log"))
        assert restarted.recovered_spans_total == 24 and restarted.log.corrupt_records_total == 0
        restarted.start()
        assert restarted.flush(30)
        restarted.close()
        stored = {r[0] for r in store.query("SELECT SpanId FROM otel_traces")}
    assert stored == {s for _, ids in bodies for spans in ids.values() for s in spans}
    assert os.path.isdir(tmp_path / "log")


def test_record_ids_used_again_never_make_a_new_range_look_inserted(store_url: str, tmp_path: Path) -> None:
    exports = _exports(2)
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        first = LoggedSpanIngest(ingest, SpanLog(tmp_path / "log"))
        first.start()
        assert _accept(first, exports[0][0]).ok and first.flush(30)
        first.close()
        with closing(sqlite3.connect(tmp_path / "log" / "spans.sqlite")) as db, db:  # as a log restored without its WAL
            db.execute("DELETE FROM sqlite_sequence")
        second = LoggedSpanIngest(ingest, SpanLog(tmp_path / "log"))
        second.start()
        assert _accept(second, exports[1][0]).ok and second.flush(30)
        assert second.log.end_offset == 2  # record 1 again, under another export
        second.close()
        assert _span_counts(store) == (40, 40)
