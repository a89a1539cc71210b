"""The TTFT breakdown reads the TTFT-phase columns (schema 012), falls back to the whole-call
columns on rows stored before them, and the in-database bands agree with Python (real chDB)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from inferpath.analysis.band_query import fetch_breakdown_bands
from inferpath.analysis.breakdown import (
    breakdown_by_band,
    fetch_request_rows,
    request_breakdown,
    stage_columns,
    stage_sql,
)
from inferpath.storage.migrations import apply_migrations
from inferpath.storage.rows import REQUEST_COLUMNS, RequestRow
from inferpath.storage.store import Store

MS = 1_000_000
T0 = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=30)
PHASE_COLUMNS = ("gateway_ttft_ns", "network_ttft_ns")


def streamed_row(i: int, *, phases: bool = True) -> RequestRow:
    """A streamed request: the gateway relays every token after the first, so its whole-call
    self time and network overhead exceed the TTFT; their TTFT parts are small."""
    ttft_ms = 200 + 7 * i
    return RequestRow(
        timestamp=T0 + timedelta(seconds=i),
        trace_id=f"{i + 1:032x}",
        endpoint="/v1/chat/completions",
        endpoint_class="interactive",
        status="ok",
        ttft_ns=ttft_ms * MS,
        e2e_ns=(1500 + 11 * i) * MS,
        tokenize_ns=5 * MS,
        retrieval_ns=40 * MS,
        queue_ns=(10 + i % 9) * MS,
        prefill_ns=60 * MS,
        decode_ns=(1100 + 9 * i) * MS,
        gateway_ns=(150 + i) * MS,
        network_ns=(120 + 2 * i) * MS,
        gateway_ttft_ns=(4 + i % 3) * MS if phases else None,
        network_ttft_ns=(6 + i % 5) * MS if phases else None,
        updated_at=T0 + timedelta(minutes=1),
    )


def test_ttft_reads_the_phase_columns_and_e2e_the_whole_call() -> None:
    row = vars(streamed_row(3))
    ttft, e2e = request_breakdown(row, "ttft"), request_breakdown(row, "e2e")
    assert (ttft.stage_ns["gateway"], ttft.stage_ns["network"]) == (row["gateway_ttft_ns"], row["network_ttft_ns"])
    assert ttft.stage_ns["rest"] >= 0
    # The whole-call values would claim more than the TTFT holds.
    whole = request_breakdown({**row, "gateway_ttft_ns": None, "network_ttft_ns": None}, "ttft")
    assert whole.stage_ns["rest"] < 0
    # E2E is the whole call, with or without the phase columns.
    assert (e2e.stage_ns["gateway"], e2e.stage_ns["network"]) == (row["gateway_ns"], row["network_ns"])
    assert request_breakdown({k: v for k, v in row.items() if k not in PHASE_COLUMNS}, "e2e") == e2e


def test_stage_columns_are_one_definition_for_python_and_sql() -> None:
    assert stage_columns("ttft", "gateway") == ("gateway_ttft_ns", "gateway_ns")
    assert stage_columns("ttft", "network") == ("network_ttft_ns", "network_ns")
    assert stage_columns("e2e", "gateway") == ("gateway_ns",)
    assert stage_sql("ttft", "network") == "coalesce(network_ttft_ns, network_ns, 0)"
    assert stage_sql("e2e", "queue") == "coalesce(queue_ns, 0)"
    with pytest.raises(ValueError, match="decode"):
        stage_columns("ttft", "decode")
    with pytest.raises(ValueError, match="measure"):
        stage_columns("itl", "gateway")
    with pytest.raises(ValueError, match="gateway_ttft_ns"):
        request_breakdown({**vars(streamed_row(0)), "gateway_ttft_ns": -1}, "ttft")


def _assert_bands_equal(got: list, expected: list) -> None:
    assert [s.group for s in got] == [s.group for s in expected] and got
    for mine, reference in zip(got, expected):
        mine, reference = dataclasses.asdict(mine), dataclasses.asdict(reference)
        for key in ("count", "total_mean_ns", "stage_mean_ns", "stage_share"):
            assert mine[key] == reference[key], key
        assert mine["stage_p99_ns"] == pytest.approx(reference["stage_p99_ns"], rel=1e-12)


def test_rows_stored_before_schema_012_get_null_and_fall_back(tmp_path) -> None:
    # 30 of 60 rows: the old ones are exactly the p0-50 TTFT band (the smallest TTFTs).
    old = [streamed_row(i, phases=False) for i in range(30)]
    new = [streamed_row(i) for i in range(30, 60)]
    old_columns = [c for c in REQUEST_COLUMNS if c not in PHASE_COLUMNS]
    with Store.open(f"chdb://{tmp_path}/store") as store:
        # Put the table back as it was before 012, with rows in it, then migrate.
        store.command("ALTER TABLE inferpath_requests DROP COLUMN gateway_ttft_ns, DROP COLUMN network_ttft_ns")
        store.command("ALTER TABLE inferpath_schema_migrations DELETE WHERE version = 12 SETTINGS mutations_sync = 1")
        store.insert("inferpath_requests", [tuple(getattr(r, c) for c in old_columns) for r in old], old_columns)
        assert apply_migrations(store, 30) == [12]
        assert [n for n, _ in store.table_columns("inferpath_requests")] == list(REQUEST_COLUMNS)
        store.insert("inferpath_requests", [r.to_insert_row() for r in new], REQUEST_COLUMNS)

        stored = store.query(
            "SELECT countIf(gateway_ttft_ns IS NULL), countIf(network_ttft_ns IS NULL),"
            " countIf(gateway_ttft_ns IS NOT NULL) FROM inferpath_requests FINAL"
        )
        assert stored == [(len(old), len(old), len(new))]
        start, end = T0 - timedelta(minutes=1), T0 + timedelta(minutes=5)
        rows = fetch_request_rows(store, start=start, end=end)
        count, bands = fetch_breakdown_bands(store, start=start, end=end)
    assert count == len(rows) == len(old) + len(new)
    for measure in ("ttft", "e2e"):
        _assert_bands_equal(bands[measure], breakdown_by_band(rows, measure=measure))
    # The fastest TTFT band holds the old rows: whole-call values there.
    fastest = bands["ttft"][0]
    assert fastest.count == len(old) and fastest.upper_ns <= min(r.ttft_ns for r in new)
    assert fastest.stage_mean_ns["gateway"] == sum(r.gateway_ns for r in old) / len(old)
    assert fastest.stage_mean_ns["network"] == sum(r.network_ns for r in old) / len(old)
    # Bands of rows with the phase columns explain no more than their TTFT.
    assert all(band.stage_mean_ns["rest"] >= 0 for band in bands["ttft"][1:])
    # E2E reads the whole call everywhere.
    assert sum(b.stage_mean_ns["gateway"] * b.count for b in bands["e2e"]) == sum(r.gateway_ns for r in old + new)
