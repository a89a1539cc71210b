"""The breakdown page's hop overhead: the one-pass grouping equals the CLIENT⋈SERVER join
(real chDB), and a call with a span stored twice falls back to the join's exact pairs."""

from __future__ import annotations

from datetime import timedelta

from fault_scenarios import MS, T0, WINDOW

from inferpath.storage.hop_rollup import hop_overhead_rows, hop_overhead_rows_joined
from inferpath.storage.rows import SPAN_COLUMNS, SpanRow
from inferpath.storage.store import Store


def _call(
    trace: int,
    at_seconds: float,
    client_ms: int,
    server_ms: int,
    *,
    server_delay_seconds: float = 0.0,
    caller: str = "gateway",
    callee: str = "engine",
) -> list[SpanRow]:
    trace_id, client_id = f"{trace:032x}", f"{trace:015x}c"
    start = T0 + timedelta(seconds=at_seconds)
    return [
        SpanRow(
            timestamp=start,
            trace_id=trace_id,
            span_id=f"{trace:015x}a",
            span_name="POST /chat",
            span_kind="Server",
            service_name=caller,
            duration_ns=(client_ms + 5) * MS,
        ),
        SpanRow(
            timestamp=start,
            trace_id=trace_id,
            span_id=client_id,
            parent_span_id=f"{trace:015x}a",
            span_name="chat",
            span_kind="Client",
            service_name=caller,
            duration_ns=client_ms * MS,
        ),
        SpanRow(
            timestamp=start + timedelta(seconds=server_delay_seconds),
            trace_id=trace_id,
            span_id=f"{trace:015x}e",
            parent_span_id=client_id,
            span_name="POST /v1/chat/completions",
            span_kind="Server",
            service_name=callee,
            duration_ns=server_ms * MS,
        ),
    ]


def test_grouped_hops_equal_the_join_and_fall_back_on_duplicates(tmp_path) -> None:
    end = T0 + WINDOW
    spans = [span for i in range(40) for span in _call(i + 1, i * 10, 100 + 7 * i, 90 + 3 * i)]
    spans += _call(100, WINDOW.total_seconds() - 1, 500, 200, server_delay_seconds=20)  # callee after end
    spans += _call(101, WINDOW.total_seconds() + 5, 500, 100)  # called after the window: not counted
    spans += _call(102, 30, 300, 250, caller="edge", callee="gateway")
    with Store.open(f"chdb://{tmp_path / 'store'}") as store:
        store.insert("otel_traces", [s.to_insert_row() for s in spans], SPAN_COLUMNS)
        grouped, joined = hop_overhead_rows(store, T0, end), hop_overhead_rows_joined(store, T0, end)
        assert grouped == joined
        assert [(h["caller_service"], h["count"]) for h in grouped] == [("edge", 1), ("gateway", 41)]
        assert grouped[0]["avg_seconds"] == 0.05  # 300 ms − 250 ms
        # The callee's server span exported twice: the join counts both pairs.
        store.insert("otel_traces", [_call(1, 0, 100, 90)[2].to_insert_row()], SPAN_COLUMNS)
        doubled = hop_overhead_rows(store, T0, end)
        assert doubled == hop_overhead_rows_joined(store, T0, end)
        assert doubled[1]["count"] == 42
