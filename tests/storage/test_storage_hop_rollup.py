"""Per-minute hop rollup (schema 010): over a real chDB store it agrees with the exact hop
pairing (counts and means exact, percentiles within DDSketch's 0.5 % of a value of that
rank), a late span re-derives only its trace's minutes, and minutes past the horizon are
paired from raw spans. Calls are the recorded Azure LLM inference trace (arrival times and
token counts), stretched over five hours."""

from __future__ import annotations

import csv
import math
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread
from inferpath.storage import hop_rollup
from inferpath.storage.hop_rollup import hop_overhead_rows, hop_overhead_view
from inferpath.storage.refresher import RollupRefresher
from inferpath.storage.rollup import RELATIVE_ACCURACY
from inferpath.storage.rows import REQUEST_COLUMNS, SPAN_COLUMNS, RequestRow, SpanRow
from inferpath.storage.store import Store

MS = 1_000_000
T0 = (datetime.now(timezone.utc) - timedelta(hours=8)).replace(minute=0, second=0, microsecond=0)
STRETCH = 5  # the trace's hour of arrivals becomes five hours: windows past the 3 h threshold
LATE_TRACE = 1234  # this call's engine span arrives late
WINDOW = (T0 + timedelta(seconds=17), T0 + timedelta(hours=4, minutes=30, seconds=-23))


def _azure_calls(shared_data) -> list[tuple[float, int, int]]:
    path = shared_data / "llm_request_traces" / "azure2023_AzureLLMInferenceTrace_code.csv"
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    first = datetime.fromisoformat(rows[0]["TIMESTAMP"][:26])
    return [
        (
            (datetime.fromisoformat(r["TIMESTAMP"][:26]) - first).total_seconds() * STRETCH,
            int(r["ContextTokens"]),
            int(r["GeneratedTokens"]),
        )
        for r in rows
    ]


def _trace(
    index: int, offset_seconds: float, context_tokens: int, generated_tokens: int, *, with_engine: bool = True
) -> list[SpanRow]:
    """Client → gateway → engine, durations from the request's token counts; the client's
    network share varies with the prompt and is sometimes negative (clock skew)."""
    trace_id = f"{index:032x}"
    ids = [f"{index:012x}{k:04x}" for k in range(4)]
    start = T0 + timedelta(seconds=offset_seconds)
    engine_ms = 20 + generated_tokens * 0.5 + context_tokens * 0.01
    gateway_ms = engine_ms + 3 + (context_tokens % 11)
    client_ms = gateway_ms + (context_tokens % 23) - 4
    spans = [
        SpanRow(
            timestamp=start,
            trace_id=trace_id,
            span_id=ids[0],
            span_name="chat code",
            span_kind="Client",
            service_name="replay-client",
            duration_ns=int(client_ms * MS),
        ),
        SpanRow(
            timestamp=start + timedelta(milliseconds=1),
            trace_id=trace_id,
            span_id=ids[1],
            parent_span_id=ids[0],
            span_name="POST /v1/chat/completions",
            span_kind="Server",
            service_name="gateway",
            duration_ns=int(gateway_ms * MS),
        ),
        SpanRow(
            timestamp=start + timedelta(milliseconds=2),
            trace_id=trace_id,
            span_id=ids[2],
            parent_span_id=ids[1],
            span_name="chat code",
            span_kind="Client",
            service_name="gateway",
            duration_ns=int((engine_ms + 1 + context_tokens % 3) * MS),
        ),
    ]
    if with_engine:
        spans.append(_engine_span(index, start, engine_ms))
    return spans


def _engine_span(index: int, start: datetime, engine_ms: float) -> SpanRow:
    return SpanRow(
        timestamp=start + timedelta(milliseconds=3),
        trace_id=f"{index:032x}",
        span_id=f"{index:012x}{3:04x}",
        parent_span_id=f"{index:012x}{2:04x}",
        span_name="llm_request",
        span_kind="Server",
        service_name="engine",
        duration_ns=int(engine_ms * MS),
    )


@pytest.fixture()
def calls(shared_data):
    return _azure_calls(shared_data)


@pytest.fixture()
def filled(store, calls):
    spans, requests = [], []
    for index, (offset, context_tokens, generated_tokens) in enumerate(calls):
        spans += _trace(index, offset, context_tokens, generated_tokens, with_engine=index != LATE_TRACE)
        requests.append(
            RequestRow(
                timestamp=T0 + timedelta(seconds=offset),
                trace_id=f"{index:032x}",
                status="ok",
                updated_at=T0 + timedelta(hours=6),
            ).to_insert_row()
        )
    store.insert("otel_traces", [s.to_insert_row() for s in spans], SPAN_COLUMNS)
    store.insert("inferpath_requests", requests, REQUEST_COLUMNS)
    return store


def _overheads(store, start, end) -> dict[tuple, list[int]]:
    """Every pair's overhead (ns) per hop, straight from the definition."""
    out: dict[tuple, list[int]] = {}
    for caller, callee, span, overhead in store.query(
        "SELECT caller, callee, callee_span, overhead FROM "
        + hop_rollup.pairs_sql("{start:DateTime64(9, 'UTC')}", "{end:DateTime64(9, 'UTC')}"),
        {"start": start, "end": end, "slack_ns": int(hop_rollup.HOP_SLACK.total_seconds() * 1e9)},
    ):
        out.setdefault((caller, callee, span), []).append(int(overhead))
    return out


def _within_sketch_error(value_seconds: float, values_ns: list[int], q: float) -> bool:
    """DDSketch's guarantee: the value is within the relative accuracy of a value whose rank
    is that quantile's (either neighbour of the interpolated rank)."""
    ordered = sorted(values_ns)
    rank = q * (len(ordered) - 1)
    candidates = ordered[max(0, math.floor(rank) - 1) : math.ceil(rank) + 2]
    value_ns = value_seconds * 1e9
    return any(abs(value_ns - x) <= RELATIVE_ACCURACY * abs(x) + 1 for x in candidates)


def _assert_agrees(store, rollup_rows, exact_rows, start, end) -> None:
    assert [(r["caller_service"], r["callee_service"], r["callee_span"], r["count"]) for r in rollup_rows] == [
        (r["caller_service"], r["callee_service"], r["callee_span"], r["count"]) for r in exact_rows
    ]
    overheads = _overheads(store, start, end)
    for got, want in zip(rollup_rows, exact_rows):
        assert got["avg_seconds"] == pytest.approx(want["avg_seconds"], rel=1e-9)
        values = overheads[(got["caller_service"], got["callee_service"], got["callee_span"])]
        for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            assert _within_sketch_error(got[f"{name}_seconds"], values, q), (got, name)


def test_the_rollup_path_agrees_with_the_exact_pairing(filled):
    result = hop_rollup.refresh_hops(filled)
    # The first pass rebuilds every minute holding a CLIENT span.
    assert (
        result.minutes
        == filled.query("SELECT uniqExact(toStartOfMinute(Timestamp)) FROM otel_traces WHERE SpanKind = 'Client'")[0][0]
        > 100
    )
    plan = hop_rollup.hop_plan(filled, *WINDOW, min_window_seconds=3 * 3600)
    assert plan is not None and plan.raw and plan.rollup[0] == T0 + timedelta(minutes=1)
    rolled, percentiles = hop_overhead_view(filled, *WINDOW, rollup_min_window_seconds=3 * 3600)
    exact = hop_overhead_rows(filled, *WINDOW)
    assert percentiles == "ddsketch"
    assert [r["callee_service"] for r in exact] == ["engine", "gateway"]
    assert sum(r["count"] for r in exact) > 10_000
    assert any(v < 0 for values in _overheads(filled, *WINDOW).values() for v in values)
    _assert_agrees(filled, rolled, exact, *WINDOW)
    # A window under the threshold stays exact.
    narrow, narrow_percentiles = hop_overhead_view(
        filled, WINDOW[0], WINDOW[0] + timedelta(hours=1), rollup_min_window_seconds=3 * 3600
    )
    assert narrow_percentiles == "exact"
    assert narrow == hop_overhead_rows(filled, WINDOW[0], WINDOW[0] + timedelta(hours=1))


def test_a_late_span_rebuilds_only_its_traces_minutes(filled, calls):
    hop_rollup.refresh_hops(filled)
    offset, context_tokens, generated_tokens = calls[LATE_TRACE]
    start = T0 + timedelta(seconds=offset)
    assert WINDOW[0] + timedelta(minutes=2) < start < WINDOW[1] - timedelta(minutes=2)
    engine_ms = 20 + generated_tokens * 0.5 + context_tokens * 0.01
    filled.insert("otel_traces", [_engine_span(LATE_TRACE, start, engine_ms).to_insert_row()], SPAN_COLUMNS)
    # The assembler re-derives the trace's request row when its late span arrives.
    filled.insert(
        "inferpath_requests",
        [
            RequestRow(
                timestamp=start, trace_id=f"{LATE_TRACE:032x}", status="ok", updated_at=datetime.now(timezone.utc)
            ).to_insert_row()
        ],
        REQUEST_COLUMNS,
    )
    stale, _ = hop_overhead_view(filled, *WINDOW, rollup_min_window_seconds=0)
    exact = hop_overhead_rows(filled, *WINDOW)
    assert stale[0]["count"] == exact[0]["count"] - 1, "the engine hop waits for the next pass"
    result = hop_rollup.refresh_hops(filled)
    assert 1 <= result.minutes <= 2  # the late trace's minutes only
    rolled, percentiles = hop_overhead_view(filled, *WINDOW, rollup_min_window_seconds=0)
    assert percentiles == "ddsketch"
    _assert_agrees(filled, rolled, exact, *WINDOW)


def test_minutes_past_the_horizon_are_paired_from_raw_spans(filled):
    assert hop_rollup.hop_plan(filled, *WINDOW, min_window_seconds=0) is None  # no pass yet
    hop_rollup.refresh_hops(filled, now=T0 + timedelta(hours=2))  # watermark 2 h in, minus the margin
    plan = hop_rollup.hop_plan(filled, *WINDOW, min_window_seconds=0)
    assert plan.rollup[1] <= T0 + timedelta(hours=2) and plan.raw[-1] == (plan.rollup[1], WINDOW[1])
    rolled, _ = hop_overhead_view(filled, *WINDOW, rollup_min_window_seconds=0)
    _assert_agrees(filled, rolled, hop_overhead_rows(filled, *WINDOW), *WINDOW)


def test_the_refresher_pass_builds_both_rollups_and_levels_are_checked(filled):
    result = RollupRefresher(filled).refresh_now()
    assert result.minutes > 0 and result.hop_minutes > 0
    assert hop_rollup.hop_horizon(filled) == result.watermark.replace(second=0, microsecond=0)
    plan = hop_rollup.hop_plan(filled, *WINDOW, min_window_seconds=0)
    with pytest.raises(ValueError, match="levels"):
        hop_rollup.hop_aggregate(filled, plan, (0.75,))


def test_breakdown_view_marks_hop_percentiles_from_the_rollup(store_url, calls):
    spans = [span for index, call in enumerate(calls[::4]) for span in _trace(index, *call)]
    with Store.open(store_url, ttl_days=3650) as opened:
        opened.insert("otel_traces", [s.to_insert_row() for s in spans], SPAN_COLUMNS)
    settings = Settings(store_url=store_url, rollup_min_window_seconds=3 * 3600, rollup_interval_seconds=3600)
    with serve_in_thread(settings, port=0) as running:
        assert running.runtime.refresh_rollups().hop_minutes > 100
        with httpx.Client(base_url=running.url, timeout=60) as http:
            wide = http.get(
                "/api/v1/views/breakdown", params={"start": WINDOW[0].isoformat(), "end": WINDOW[1].isoformat()}
            ).json()
            narrow = http.get(
                "/api/v1/views/breakdown",
                params={"start": WINDOW[0].isoformat(), "end": (WINDOW[0] + timedelta(hours=1)).isoformat()},
            ).json()
        exact = hop_overhead_rows(running.runtime.store, *WINDOW)
    assert wide["hop_percentiles"] == "ddsketch" and narrow["hop_percentiles"] == "exact"
    assert [(h["callee_service"], h["count"]) for h in wide["hops"]] == [
        (h["callee_service"], h["count"]) for h in exact
    ]
    assert sum(h["count"] for h in narrow["hops"]) < sum(h["count"] for h in wide["hops"])
