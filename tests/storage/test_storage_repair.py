"""A trace whose spans were stored but whose trace-id bounds were not (the process died
between the table and its materialized view) is found again after the start-up repair."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta, timezone

from inferpath.storage.reader import Reader
from inferpath.storage.repair import repair_trace_id_index
from inferpath.storage.rows import SPAN_COLUMNS, SpanRow
from inferpath.storage.store import Store


def _span(trace_id: str, start: datetime, name: str) -> SpanRow:
    return SpanRow(
        timestamp=start,
        trace_id=trace_id,
        span_id=secrets.token_hex(8),
        parent_span_id="",
        trace_state="",
        span_name=name,
        span_kind="Server",
        service_name="gateway",
        resource_attributes={},
        scope_name="t",
        scope_version="",
        span_attributes={},
        duration_ns=1_000_000,
        status_code="Ok",
        status_message="",
    )


def test_missing_and_narrow_trace_bounds_are_rebuilt(store_url):
    now = datetime.now(timezone.utc)
    with Store.open(store_url) as store:
        lost, narrow, intact = (secrets.token_hex(16) for _ in range(3))
        rows = [
            _span(lost, now - timedelta(minutes=5), "a"),
            _span(narrow, now - timedelta(minutes=4), "b"),
            _span(intact, now - timedelta(minutes=3), "c"),
        ]
        store.insert("otel_traces", [r.to_insert_row() for r in rows], SPAN_COLUMNS)
        # What a kill between the table and its view leaves: spans, no (or old) bounds.
        store.command(
            "DELETE FROM otel_traces_trace_id_ts WHERE TraceId IN {ids:Array(String)}", {"ids": [lost, narrow]}
        )
        store.command(
            "INSERT INTO otel_traces_trace_id_ts (TraceId, Start, End) VALUES"
            " ({t:String}, {s:DateTime('UTC')}, {s:DateTime('UTC')})",
            {"t": narrow, "s": now - timedelta(minutes=30)},
        )
        reader = Reader(store)
        assert reader.trace_spans(lost) == [] and reader.trace_spans(narrow) == []
        assert len(reader.trace_spans(intact)) == 1
        assert repair_trace_id_index(store, now=now) == 2
        assert [s.span_name for s in reader.trace_spans(lost)] == ["a"]
        assert [s.span_name for s in reader.trace_spans(narrow)] == ["b"]
        assert repair_trace_id_index(store, now=now) == 0  # nothing left to repair
