"""Store.insert checks column by column: every naive datetime is still found and named by
row and column, aware datetimes in any zone are taken, and SpanRow.from_checked builds the
same row as the checked constructor."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta, timezone

import pytest

from inferpath.storage.rows import SPAN_COLUMNS, SpanRow
from inferpath.storage.store import Store

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def _row(offset_seconds: int = 0, **fields) -> list:
    span = SpanRow(
        timestamp=T0 + timedelta(seconds=offset_seconds),
        trace_id=secrets.token_hex(16),
        span_id=secrets.token_hex(8),
        duration_ns=5,
        **fields,
    )
    return list(span.to_insert_row())


def test_a_naive_datetime_deep_in_a_batch_is_named_by_row_and_column(store: Store) -> None:
    rows = [_row(i) for i in range(6)]
    rows[4][0] = datetime(2025, 1, 1, 12, 0, 0)
    with pytest.raises(ValueError, match="row 4 column 'Timestamp'"):
        store.insert("otel_traces", rows, SPAN_COLUMNS)
    rows = [_row(i, events=[(T0, "e", {})]) for i in range(6)]
    rows[3][15] = [T0, datetime(2025, 1, 1)]
    with pytest.raises(ValueError, match="row 3 column 'Events.Timestamp'"):
        store.insert("otel_traces", rows, SPAN_COLUMNS)
    rows = [_row(i) for i in range(3)]
    rows[2] = rows[2][:-1]
    with pytest.raises(ValueError, match="row 2 has 21 values for 22 columns"):
        store.insert("otel_traces", rows, SPAN_COLUMNS)
    assert store.query("SELECT count() FROM otel_traces")[0][0] == 0


def test_aware_datetimes_in_other_zones_and_events_are_stored_as_utc(store: Store) -> None:
    plus_two = timezone(timedelta(hours=2))
    rows = [_row(i) for i in range(3)]
    rows[1][0] = (T0 + timedelta(seconds=1)).astimezone(plus_two)
    rows[2][15], rows[2][16], rows[2][17] = [T0.astimezone(plus_two)], ["tick"], [{"k": "v"}]
    assert store.insert("otel_traces", rows, SPAN_COLUMNS) == 3
    stored = store.query("SELECT Timestamp, Events.Timestamp FROM otel_traces ORDER BY Timestamp")
    assert [r[0] for r in stored] == [T0, T0 + timedelta(seconds=1), T0 + timedelta(seconds=2)]
    assert stored[2][1] == [T0]


def test_from_checked_builds_the_same_row_as_the_constructor() -> None:
    values = dict(
        timestamp=T0,
        trace_id="ab" * 16,
        span_id="cd" * 8,
        parent_span_id="ef" * 8,
        trace_state="s",
        span_name="n",
        span_kind="Server",
        service_name="svc",
        resource_attributes={"a": "1"},
        scope_name="sc",
        scope_version="1",
        span_attributes={"b": "2"},
        duration_ns=7,
        status_code="Ok",
        status_message="m",
        events=[(T0, "e", {"c": "3"})],
        links=[("ab" * 16, "cd" * 8, "", {})],
    )
    checked = SpanRow.from_checked(*values.values())
    assert checked == SpanRow(**values)
    assert checked.to_insert_row() == SpanRow(**values).to_insert_row()
    with_start = SpanRow.from_checked(*values.values(), start_ns=1_735_732_800 * 10**9)
    assert with_start == checked and with_start.start_ns == checked.start_ns == 1_735_732_800 * 10**9
    assert checked.to_insert_row(timestamp_ns=True) == (1_735_732_800 * 10**9, *checked.to_insert_row()[1:])
    plain = SpanRow(timestamp=T0, trace_id="ab" * 16, span_id="cd" * 8)
    # No events or links: the shared empty tuple for each array (no list for the GC to track).
    assert plain.to_insert_row()[15:] == ((),) * 7


def test_rows_with_nanosecond_timestamps_are_stored_at_the_same_instants(store: Store) -> None:
    """The ingest path gives Timestamp as Unix ns (no per-row conversion in the driver)."""
    spans = [
        SpanRow(
            T0 + timedelta(seconds=i, microseconds=7), "ab" * 16, f"{i:016x}", events=[(T0, "tick", {})] if i else ()
        )
        for i in range(3)
    ]
    assert store.insert("otel_traces", [s.to_insert_row(timestamp_ns=True) for s in spans], SPAN_COLUMNS) == 3
    stored = store.query("SELECT Timestamp, Events.Timestamp FROM otel_traces ORDER BY Timestamp")
    assert [r[0] for r in stored] == [s.timestamp for s in spans]
    assert [r[1] for r in stored] == [[], [T0], [T0]]
    moved = spans[0]
    moved.timestamp = T0 + timedelta(hours=1)  # a new timestamp: the cached start follows it
    assert moved.start_ns == 1_735_732_800 * 10**9 + 3600 * 10**9


def test_checked_rows_skip_the_naive_datetime_scan_and_store_the_same(store: Store) -> None:
    spans = [SpanRow(T0 + timedelta(seconds=i), "cd" * 16, f"{i:016x}", events=[(T0, "e", {})]) for i in range(4)]
    rows = [s.to_insert_row(timestamp_ns=True) for s in spans]
    assert store.insert("otel_traces", rows[:2], SPAN_COLUMNS) == 2
    assert store.insert("otel_traces", rows[2:], SPAN_COLUMNS, checked=True) == 2
    stored = store.query("SELECT Timestamp, Events.Timestamp FROM otel_traces ORDER BY Timestamp")
    assert stored == [(s.timestamp, [T0]) for s in spans]
    naive = list(rows[0])
    naive[15] = [datetime(2025, 1, 1)]
    with pytest.raises(ValueError, match="naive datetime"):  # unchecked rows are still scanned
        store.insert("otel_traces", [tuple(naive)], SPAN_COLUMNS)
