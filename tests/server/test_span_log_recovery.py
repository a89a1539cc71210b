"""Start-up of the span log over damaged files: a damaged record in the middle is skipped (not
cut with everything after it), progress past the end never hides new records, a lost progress
file stores nothing twice, and recovery says what it re-queued."""

from __future__ import annotations

import logging
from pathlib import Path

from inferpath.server.ingest import DurableIngest, dedup_token
from inferpath.server.log_ingest import LoggedSpanIngest, token_digest
from inferpath.server.otlp import decode_trace_request
from inferpath.server.span_log import HEADER_BYTES, SpanLog
from inferpath.storage.store import Store

from .otlp_factory import trace_body

PROTOBUF = "application/x-protobuf"


def _token(n: int) -> bytes:
    return token_digest(f"export-{n}")


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_record_in_the_middle_is_skipped_and_every_other_record_kept(tmp_path: Path, caplog) -> None:
    log = SpanLog(tmp_path / "log")
    ranges = [log.append(_token(n), 0, f"body {n} ".encode() * 30) for n in range(27)]
    log.close()
    segment = next((tmp_path / "log").glob("*.log"))
    size = segment.stat().st_size
    _flip(segment, ranges[1][0] + HEADER_BYTES + 7)  # one byte in the 2nd record's body
    with caplog.at_level(logging.WARNING, logger="inferpath.server.span_log"):
        reopened = SpanLog(tmp_path / "log")
    assert [(r.start, r.end) for r in reopened.unfinished] == ranges[:1] + ranges[2:]
    assert segment.stat().st_size == size and reopened.end_offset == size and reopened.torn_bytes_dropped == 0
    assert (reopened.corrupt_records_total, reopened.corrupt_bytes_total) == (1, ranges[1][1] - ranges[1][0])
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and segment.name in errors[0] and f"at offset {ranges[1][0]}" in errors[0]
    assert f"skipped {ranges[1][1] - ranges[1][0]} bytes" in errors[0]
    assert not any("torn" in r.getMessage() for r in caplog.records)
    assert reopened.knows(_token(26)) and not reopened.knows(_token(1))
    assert reopened.append(_token(27), 0, b"next")[0] == size  # offsets continue at the file's end
    reopened.close()


def test_a_bad_magic_in_an_inserted_record_cuts_nothing(tmp_path: Path, caplog) -> None:
    log = SpanLog(tmp_path / "log")
    ranges = [log.append(_token(n), 0, b"z" * 200) for n in range(10)]
    log.begin_insert(ranges[0][0], ranges[5][1])
    log.done_insert(ranges[5][1])
    log.close()
    segment = next((tmp_path / "log").glob("*.log"))
    _flip(segment, ranges[2][0])  # the magic of an old, already inserted record
    with caplog.at_level(logging.WARNING, logger="inferpath.server.span_log"):
        reopened = SpanLog(tmp_path / "log")
    assert reopened.committed_offset == ranges[5][1] and reopened.end_offset == ranges[-1][1]
    assert [(r.start, r.end) for r in reopened.unfinished] == ranges[6:]
    assert segment.stat().st_size == ranges[-1][1] and reopened.corrupt_records_total == 1
    assert not any("past the log's end" in r.getMessage() for r in caplog.records)
    assert "behind the drained mark" in next(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    reopened.close()


def test_damage_at_the_end_of_an_older_segment_is_skipped_not_truncated(tmp_path: Path) -> None:
    log = SpanLog(tmp_path / "log", segment_bytes=1000)
    ranges = [log.append(_token(n), 0, b"y" * 955) for n in range(4)]  # one record per segment
    log.close()
    first = tmp_path / "log" / f"{0:020d}.log"
    _flip(first, 999)  # the last byte of a segment that is not the newest
    reopened = SpanLog(tmp_path / "log")
    assert [(r.start, r.end) for r in reopened.unfinished] == ranges[1:]
    assert first.stat().st_size == 1000 and reopened.torn_bytes_dropped == 0
    assert reopened.corrupt_records_total == 1 and reopened.end_offset == 4000
    reopened.close()


def test_a_torn_tail_after_valid_records_is_still_cut(tmp_path: Path) -> None:
    log = SpanLog(tmp_path / "log")
    ranges = [log.append(_token(n), 0, b"w" * 100) for n in range(3)]
    log.close()
    segment = next((tmp_path / "log").glob("*.log"))
    _flip(segment, ranges[1][0] + HEADER_BYTES + 3)  # damaged in the middle, kept out
    with open(segment, "ab") as tail:
        tail.write(b"IPL1" + bytes(20))  # and a write cut short at the end
    reopened = SpanLog(tmp_path / "log")
    assert [(r.start, r.end) for r in reopened.unfinished] == [ranges[0], ranges[2]]
    assert reopened.torn_bytes_dropped == 24 and segment.stat().st_size == ranges[2][1]
    assert reopened.corrupt_records_total == 1
    reopened.close()


def test_progress_past_the_end_appends_at_or_after_it_and_new_records_are_not_skipped(tmp_path: Path, caplog) -> None:
    log = SpanLog(tmp_path / "log")
    ranges = [log.append(_token(n), 0, b"v" * 100) for n in range(3)]
    log.close()
    progress_offset = ranges[-1][1] + 12_345  # segments cut or removed by hand
    (tmp_path / "log" / "progress").write_text(f"D {progress_offset}\n", encoding="ascii")
    with caplog.at_level(logging.WARNING, logger="inferpath.server.span_log"):
        reopened = SpanLog(tmp_path / "log")
    assert any("past the log's end" in r.getMessage() for r in caplog.records)
    start, end = reopened.append(_token(3), 0, b"new")
    assert start == progress_offset and (tmp_path / "log" / f"{progress_offset:020d}.log").exists()
    reopened.close()
    again = SpanLog(tmp_path / "log")  # killed before that record was inserted
    assert [(r.start, r.end, r.body) for r in again.unfinished] == [(start, end, b"new")]
    assert again.append(_token(4), 0, b"later")[0] == end
    again.close()


def _accept(log_ingest: LoggedSpanIngest, body: bytes):
    decoded = decode_trace_request(body, content_type=PROTOBUF, content_encoding=None)
    return log_ingest.accept(decoded.spans, dedup_token("traces", PROTOBUF, None, body), body, PROTOBUF, None)


def _span_counts(store: Store) -> tuple[int, int]:
    return tuple(store.query("SELECT count(), uniqExact(SpanId) FROM otel_traces")[0])


def test_a_lost_progress_file_stores_nothing_twice_even_across_another_crash(
    store_url: str, tmp_path: Path, caplog
) -> None:
    exports = [trace_body(spans_per_trace=5, traces=2) for _ in range(8)]
    folder = tmp_path / "log"
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        first = LoggedSpanIngest(ingest, SpanLog(folder))
        first.start()
        assert all(_accept(first, body).ok for body, _ in exports[:5])
        first.close()  # drained
        logged_only = LoggedSpanIngest(ingest, SpanLog(folder))  # no drainer: logged, not inserted
        assert all(_accept(logged_only, body).ok for body, _ in exports[5:])
        logged_only.log.close()  # killed
        assert _span_counts(store) == (50, 50)
        (folder / "progress").unlink()

        with caplog.at_level(logging.INFO, logger="inferpath.server"):
            second = LoggedSpanIngest(ingest, SpanLog(folder))
        messages = [r.getMessage() for r in caplog.records]
        assert any(
            r.levelno == logging.WARNING and "progress file is missing" in r.getMessage() for r in caplog.records
        )
        assert any("5 already stored, 3 re-queued" in m for m in messages)
        assert any("re-queued 3 records (30 spans) not inserted before the last stop" in m for m in messages)
        assert second.recovered_spans_total == 30
        second.log.close()  # killed again before draining: the lookup must still apply

        third = LoggedSpanIngest(ingest, SpanLog(folder))
        assert third.recovered_spans_total == 30
        third.start()
        assert third.flush(30)
        third.close()
        assert _span_counts(store) == (80, 80)
        fourth = LoggedSpanIngest(ingest, SpanLog(folder))  # a clean restart: nothing left
        assert fourth.recovered_spans_total == 0 and fourth.backlog_bytes == 0
        fourth.log.close()
        assert "L " not in (folder / "progress").read_text()


def test_recovery_logs_what_it_re_queued(store_url: str, tmp_path: Path, caplog) -> None:
    exports = [trace_body(spans_per_trace=3, traces=2) for _ in range(4)]
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        first = LoggedSpanIngest(ingest, SpanLog(tmp_path / "log"))
        assert all(_accept(first, body).ok for body, _ in exports)
        first.log.close()  # killed before the drainer ran
        with caplog.at_level(logging.INFO, logger="inferpath.server.log_ingest"):
            restarted = LoggedSpanIngest(ingest, SpanLog(tmp_path / "log"))
        assert [r.getMessage() for r in caplog.records] == [
            "span log: re-queued 4 records (24 spans) not inserted before the last stop"
        ]
        restarted.start()
        assert restarted.flush(30)
        restarted.close()
        assert _span_counts(store) == (24, 24)
