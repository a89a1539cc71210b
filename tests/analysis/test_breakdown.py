"""Per-request stage shares and their aggregation per endpoint and per percentile band."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fault_scenarios import MS, T0, WINDOW, Profile, request_rows

from inferpath.analysis.breakdown import (
    breakdown_by,
    breakdown_by_band,
    fetch_request_rows,
    request_breakdown,
    summarize,
)
from inferpath.storage.rows import REQUEST_COLUMNS, RequestRow
from inferpath.storage.store import Store
from inferpath.vocabulary import BREAKDOWN_STAGES


def _row(**values: int | str | None) -> dict:
    base = {"trace_id": "t", "endpoint": "/chat", "endpoint_class": "interactive"}
    return base | values


def test_request_breakdown_splits_e2e_and_ttft() -> None:
    row = _row(
        ttft_ns=100 * MS,
        e2e_ns=500 * MS,
        tokenize_ns=10 * MS,
        retrieval_ns=30 * MS,
        queue_ns=20 * MS,
        prefill_ns=30 * MS,
        decode_ns=400 * MS,
        gateway_ns=None,
        network_ns=5 * MS,
    )
    e2e = request_breakdown(row, "e2e")
    ttft = request_breakdown(row, "ttft")
    assert e2e is not None and ttft is not None
    assert e2e.stage_ns["rest"] == 500 * MS - 495 * MS
    assert "decode" not in ttft.stage_ns  # decode comes after the first token
    assert ttft.stage_ns["rest"] == 100 * MS - 95 * MS
    assert ttft.stage_ns["gateway"] == 0  # not measured counts as no time
    assert sum(e2e.shares().values()) == pytest.approx(1.0)
    assert ttft.shares()["retrieval"] == pytest.approx(0.3)


def test_request_breakdown_keeps_negative_rest_of_overlapping_stages() -> None:
    breakdown = request_breakdown(_row(e2e_ns=10 * MS, queue_ns=8 * MS, retrieval_ns=8 * MS), "e2e")
    assert breakdown is not None and breakdown.stage_ns["rest"] == -6 * MS


def test_request_breakdown_skips_rows_without_the_measure_and_rejects_bad_ones() -> None:
    assert request_breakdown(_row(e2e_ns=None), "e2e") is None
    with pytest.raises(ValueError, match="queue_ns"):
        request_breakdown(_row(e2e_ns=10, queue_ns=-1), "e2e")
    with pytest.raises(ValueError, match="measure"):
        request_breakdown(_row(e2e_ns=10), "itl")


def test_breakdown_by_endpoint_uses_time_weighted_shares() -> None:
    rows = [
        _row(endpoint="/chat", e2e_ns=100 * MS, decode_ns=90 * MS),
        _row(endpoint="/chat", e2e_ns=1000 * MS, queue_ns=900 * MS),
        _row(endpoint="/embed", e2e_ns=10 * MS, tokenize_ns=5 * MS),
    ]
    chat, embed = breakdown_by(rows, group_by="endpoint")
    assert (chat.group, chat.count, embed.group) == ("/chat", 2, "/embed")
    # 900 of 1100 ms were queue, whatever the per-request ratios average to.
    assert chat.stage_share["queue"] == pytest.approx(900 / 1100)
    assert sum(chat.stage_share.values()) == pytest.approx(1.0)
    assert embed.stage_mean_ns["tokenize"] == 5 * MS
    (everything,) = breakdown_by(rows, group_by=None)
    assert everything.count == 3
    with pytest.raises(ValueError, match="group_by"):
        breakdown_by(rows, group_by="model")


def test_bands_show_that_the_tail_is_queueing() -> None:
    rows = [vars(r) for r in request_rows(Profile(queue_tail_ms=2000.0), T0, seed=3)]
    bands = breakdown_by_band(rows, measure="ttft")
    assert [b.group for b in bands] == ["p0-50", "p50-90", "p90-99", "p99+"]
    assert sum(b.count for b in bands) == len(rows)
    assert bands[0].stage_share["queue"] < 0.2 < 0.8 < bands[-1].stage_share["queue"]
    assert bands[0].upper_ns == bands[1].lower_ns
    assert summarize([request_breakdown(r, "ttft") for r in rows]).count == len(rows)


def test_fetch_request_rows_reads_a_window_once_per_trace(store_url: str) -> None:
    rows = request_rows(Profile(), T0, seed=4)
    stale = RequestRow(**(vars(rows[0]) | {"e2e_ns": 1, "updated_at": rows[0].updated_at - timedelta(seconds=5)}))
    other = RequestRow(**(vars(rows[1]) | {"trace_id": "f" * 32, "endpoint": "/v1/embeddings"}))
    failed = RequestRow(**(vars(rows[2]) | {"trace_id": "e" * 32, "status": "error"}))
    with Store.open(store_url) as store:
        store.insert("inferpath_requests", [r.to_insert_row() for r in [*rows, stale, other, failed]], REQUEST_COLUMNS)
        got = fetch_request_rows(store, start=T0, end=T0 + WINDOW / 2, endpoint="/v1/chat/completions")
        assert len(got) == int(WINDOW.total_seconds() / 2)
        assert got[0]["trace_id"] == rows[0].trace_id and got[0]["e2e_ns"] == rows[0].e2e_ns  # newest version
        assert got == sorted(got, key=lambda r: r["timestamp"])
        assert {r["endpoint"] for r in got} == {"/v1/chat/completions"}
        assert all(set(f"{s}_ns" for s in BREAKDOWN_STAGES) <= set(r) for r in got)
        errors = fetch_request_rows(store, start=T0, end=T0 + WINDOW, status="error")
        assert [r["trace_id"] for r in errors] == ["e" * 32]
