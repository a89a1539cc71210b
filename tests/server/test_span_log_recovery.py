"""Start-up of the span log over damaged files: a damaged body is skipped and reported once,
an unreadable database is moved aside, and recovery says what it re-queued."""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing
from pathlib import Path

from inferpath.server.ingest import DurableIngest, dedup_token
from inferpath.server.otlp import decode_trace_request
from inferpath.server.span_log import LoggedSpanIngest, SpanLog, token_digest
from inferpath.storage.store import Store

from .otlp_factory import trace_body

PROTOBUF = "application/x-protobuf"


def _token(n: int) -> bytes:
    return token_digest(f"export-{n}")


def test_a_damaged_body_is_skipped_counted_and_every_other_record_kept(tmp_path: Path, caplog) -> None:
    log = SpanLog(tmp_path / "log")
    ids = [log.append(_token(n), PROTOBUF, None, f"body {n} ".encode() * 30) for n in range(5)]
    log.close()
    with (
        closing(sqlite3.connect(tmp_path / "log" / "spans.sqlite")) as db,
        db,
    ):  # the disk flipped bytes of the 2nd body
        db.execute("UPDATE exports SET body = ? WHERE id = ?", (b"bodY 1 " * 30, ids[1]))
    with caplog.at_level(logging.WARNING, logger="inferpath.server.span_log"):
        reopened = SpanLog(tmp_path / "log")
    # Kept in place without its body: its token stays part of the range it is drained with.
    assert [(r.start, r.body is None) for r in reopened.unfinished] == [(n, n == ids[1]) for n in ids]
    assert reopened.corrupt_records_total == 1 and reopened.backlog_bytes == 4 * 210
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and f"record {ids[1]} is damaged" in errors[0]
    assert reopened.knows(_token(1))  # a retry of it would not help: its 200 was given
    reopened.done_insert(ids[-1] + 1)
    reopened.close()
    again = SpanLog(tmp_path / "log")  # drained: not reported again
    assert again.corrupt_records_total == 0 and again.unfinished == []
    again.close()


def test_an_unreadable_log_is_moved_aside_and_a_new_one_started(tmp_path: Path, caplog) -> None:
    folder = tmp_path / "log"
    folder.mkdir()
    (folder / "spans.sqlite").write_bytes(b"not a database, " * 1000)
    (folder / "spans.sqlite-wal").write_bytes(b"its write-ahead log")
    with caplog.at_level(logging.WARNING, logger="inferpath.server.span_log"):
        log = SpanLog(folder)
    assert log.unreadable_logs_total == 1 and log.unfinished == []
    aside = sorted(p.name for p in folder.iterdir() if ".corrupt-" in p.name)
    assert aside[0].startswith("spans.sqlite.corrupt-") and aside[0] + "-wal" in aside
    assert (folder / (aside[0] + "-wal")).read_bytes() == b"its write-ahead log"  # kept beside it, not deleted
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "unreadable" in errors[0] and aside[0] in errors[0]
    assert log.append(_token(0), PROTOBUF, None, b"new") == 1
    log.close()
    reopened = SpanLog(folder)
    assert [(r.start, r.body) for r in reopened.unfinished] == [(1, b"new")]
    reopened.close()


def _accept(log_ingest: LoggedSpanIngest, body: bytes):
    decoded = decode_trace_request(body, content_type=PROTOBUF, content_encoding=None)
    return log_ingest.accept(decoded.spans, dedup_token("traces", PROTOBUF, None, body), body, PROTOBUF, None)


def _span_counts(store: Store) -> tuple[int, int]:
    return tuple(store.query("SELECT count(), uniqExact(SpanId) FROM otel_traces")[0])


def test_recovery_logs_what_it_re_queued(store_url: str, tmp_path: Path, caplog) -> None:
    exports = [trace_body(spans_per_trace=3, traces=2) for _ in range(4)]
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        first = LoggedSpanIngest(ingest, SpanLog(tmp_path / "log"))
        assert all(_accept(first, body).ok for body, _ in exports)
        first.log.close()  # killed before the drainer ran
        with caplog.at_level(logging.INFO, logger="inferpath.server.span_log"):
            restarted = LoggedSpanIngest(ingest, SpanLog(tmp_path / "log"))
        assert [r.getMessage() for r in caplog.records] == [
            "span log: re-queued 4 records (24 spans) not inserted before the last stop"
        ]
        restarted.start()
        assert restarted.flush(30)
        restarted.close()
        assert _span_counts(store) == (24, 24)
