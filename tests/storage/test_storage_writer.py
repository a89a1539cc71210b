"""BatchWriter: batching, bounded queue with counted drops, failed inserts never raise."""

from __future__ import annotations

import secrets
import time
from datetime import datetime, timedelta, timezone

import pytest

from inferpath.storage.rows import REQUEST_COLUMNS, RequestRow
from inferpath.storage.store import Store
from inferpath.storage.writer import BatchWriter

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def _rows(n: int) -> list[tuple]:
    return [RequestRow(T0 + timedelta(milliseconds=i), secrets.token_hex(16)).to_insert_row() for i in range(n)]


def _count(store: Store) -> int:
    return store.query("SELECT count() FROM inferpath_requests")[0][0]


def test_rows_are_inserted_in_batches_and_flush_waits(store: Store) -> None:
    writer = BatchWriter(store, "inferpath_requests", REQUEST_COLUMNS, max_batch_rows=10, flush_interval_seconds=60.0)
    try:
        assert writer.submit(_rows(7))
        assert writer.submit(_rows(18))
        assert writer.flush(timeout_seconds=20)
        assert writer.rows_inserted_total == 25
        assert writer.queue_rows == 0
        assert _count(store) == 25
        assert writer.last_insert_seconds > 0
        assert writer.insert_errors_total == writer.rows_dropped_total == 0
    finally:
        writer.close()


def test_interval_flush_without_explicit_flush(store: Store) -> None:
    writer = BatchWriter(store, "inferpath_requests", REQUEST_COLUMNS, flush_interval_seconds=0.05)
    try:
        writer.submit(_rows(3))
        deadline = time.monotonic() + 20
        while writer.rows_inserted_total < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert writer.rows_inserted_total == 3
    finally:
        writer.close()


def test_full_queue_drops_and_counts(store: Store) -> None:
    # A long interval and large batches keep the worker idle, so the queue only fills.
    writer = BatchWriter(
        store,
        "inferpath_requests",
        REQUEST_COLUMNS,
        max_batch_rows=1000,
        flush_interval_seconds=60.0,
        max_queue_rows=10,
    )
    try:
        assert writer.submit(_rows(8)) is True
        assert writer.submit(_rows(5)) is False  # 8 + 5 > 10: all five dropped
        assert writer.submit(_rows(2)) is True  # exactly full
        assert writer.rows_dropped_total == 5
        assert writer.queue_rows == 10
        assert writer.flush(timeout_seconds=20)
        assert writer.rows_inserted_total == 10
        assert _count(store) == 10
    finally:
        writer.close()


def test_failed_inserts_are_retried_then_dropped_without_raising(store: Store) -> None:
    store.command("CREATE TABLE doomed (x UInt8) ENGINE = MergeTree ORDER BY x")
    writer = BatchWriter(
        store, "doomed", ["x"], flush_interval_seconds=60.0, max_insert_attempts=3, retry_backoff_seconds=0.01
    )
    try:
        store.command("DROP TABLE doomed")  # every insert now fails in ClickHouse
        assert writer.submit([(1,), (2,)]) is True
        assert writer.flush(timeout_seconds=20) is False
        assert writer.insert_errors_total == 3
        assert writer.rows_dropped_total == 2
        assert writer.rows_inserted_total == 0
        assert writer.queue_rows == 0
    finally:
        writer.close()


def test_bad_rows_are_not_retried(store: Store) -> None:
    writer = BatchWriter(
        store, "inferpath_requests", REQUEST_COLUMNS, flush_interval_seconds=60.0, retry_backoff_seconds=0.01
    )
    try:
        bad = list(_rows(1)[0])
        bad[0] = datetime(2025, 1, 1)  # naive: the store rejects this row alone
        assert writer.submit([tuple(bad)] + _rows(2)) is True
        assert writer.flush(timeout_seconds=20) is False
        assert (writer.insert_errors_total, writer.rows_rejected_total, writer.rows_dropped_total) == (0, 1, 1)
        assert writer.rows_inserted_total == 2 and _count(store) == 2
    finally:
        writer.close()


def test_close_flushes_and_later_submits_are_dropped(store: Store) -> None:
    writer = BatchWriter(store, "inferpath_requests", REQUEST_COLUMNS, flush_interval_seconds=60.0)
    writer.submit(_rows(4))
    writer.close()
    writer.close()
    assert _count(store) == 4
    assert writer.submit(_rows(3)) is False
    assert writer.rows_dropped_total == 3


def test_submit_never_raises_on_garbage(store: Store) -> None:
    writer = BatchWriter(store, "inferpath_requests", REQUEST_COLUMNS, flush_interval_seconds=60.0)
    try:
        assert writer.submit(None) is False  # type: ignore[arg-type]
        assert writer.submit([]) is True
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(max_batch_rows=0), "max_batch_rows"),
        (dict(max_queue_rows=0), "max_queue_rows"),
        (dict(flush_interval_seconds=0), "flush_interval_seconds"),
        (dict(table="x;y"), "table name"),
    ],
)
def test_bad_configuration_raises_at_setup(store: Store, kwargs: dict, message: str) -> None:
    table = kwargs.pop("table", "inferpath_requests")
    with pytest.raises(ValueError, match=message):
        BatchWriter(store, table, REQUEST_COLUMNS, **kwargs)
