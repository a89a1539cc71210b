"""DurableIngest on a real chDB store: back-off after store errors, data errors kept apart."""

from __future__ import annotations

from datetime import datetime

from inferpath.server.ingest import DurableIngest, TableRows, dedup_token
from inferpath.storage.rows import SPAN_COLUMNS, SpanRow
from inferpath.storage.store import Store


def _rows(n: int = 3) -> list[tuple]:
    from datetime import timezone

    return [
        SpanRow(
            timestamp=datetime.now(timezone.utc), trace_id="ef" * 16, span_id=f"{i:016x}", duration_ns=1
        ).to_insert_row()
        for i in range(n)
    ]


def test_back_off_doubles_per_outage_probe_and_resets_on_success(store_url: str) -> None:
    now = [100.0]
    with Store.open(store_url) as store:
        ingest = DurableIngest(store, retry_after_seconds=1.0, max_retry_after_seconds=4.0, clock=lambda: now[0])
        spans = [TableRows("otel_traces", SPAN_COLUMNS, _rows())]
        store.command("DETACH TABLE otel_traces")
        waits = []
        for _ in range(4):
            result = ingest.commit(spans, "t1")
            assert result.status == "unavailable" and "UNKNOWN_TABLE" in result.message
            waits.append(result.retry_after_seconds)
            # Another export that was already inserting fails too: the back-off does not grow.
            assert ingest.commit(spans, "t2").retry_after_seconds == result.retry_after_seconds
            assert isinstance(ingest.admit(10), type(result)) and not ingest.store_available
            now[0] += result.retry_after_seconds
        assert waits == [1, 2, 4, 4]
        store.command("ATTACH TABLE otel_traces")
        assert ingest.commit(spans, "t1").ok
        assert ingest.commit(spans, "t1").ok  # the same token again: stored once
        assert store.query("SELECT count() FROM otel_traces")[0][0] == 3
        store.command("DETACH TABLE otel_traces")
        assert ingest.commit(spans, "t3").retry_after_seconds == 1  # reset after the success
        store.command("ATTACH TABLE otel_traces")


def test_rows_the_store_cannot_take_are_invalid_and_do_not_trip_the_back_off(store_url: str) -> None:
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        bad = list(_rows(1)[0])
        bad[0] = datetime(2025, 1, 1)  # naive: refused before it reaches the driver
        result = ingest.commit([TableRows("otel_traces", SPAN_COLUMNS, [tuple(bad)])], None)
        assert result.status == "invalid" and "naive" in result.message
        assert ingest.store_available and ingest.data_errors_total == 1 and ingest.store_errors_total == 0


def test_dedup_token_depends_on_every_part_of_the_export() -> None:
    base = dedup_token("traces", "application/x-protobuf", None, b"body")
    assert base == dedup_token("traces", "Application/X-Protobuf", "", b"body")
    assert (
        len(
            {
                base,
                dedup_token("metrics", "application/x-protobuf", None, b"body"),
                dedup_token("traces", "application/json", None, b"body"),
                dedup_token("traces", "application/x-protobuf", "gzip", b"body"),
                dedup_token("traces", "application/x-protobuf", None, b"body2"),
            }
        )
        == 5
    )
