"""``diagnose`` over a store (aggregates in ClickHouse, only tail sums and starting replicas'
rows read) equals ``diagnose_from`` over every row and sample read into Python (real chDB).

Separate from ``test_in_database_views``: chDB opens one data folder per process, and each
scenario here needs a store of its own.
"""

from __future__ import annotations

import pytest
from fault_scenarios import SCENARIOS, load_scenario

from inferpath.analysis.breakdown import fetch_request_rows
from inferpath.analysis.diagnosis import DIAGNOSIS_COLUMNS, diagnose, diagnose_from
from inferpath.analysis.signals import SignalWindows, fetch_window_signals_rows
from inferpath.analysis.verdict import verdict_to_dict
from inferpath.storage.store import Store


def _python_diagnosis(store, windows: dict) -> dict:
    """The diagnosis over every request row and sample read into Python (the definition)."""
    current = fetch_request_rows(
        store, start=windows["window_start"], end=windows["window_end"], columns=DIAGNOSIS_COLUMNS
    )
    baseline = fetch_request_rows(
        store, start=windows["baseline_start"], end=windows["baseline_end"], columns=DIAGNOSIS_COLUMNS
    )
    signals = SignalWindows(
        current=fetch_window_signals_rows(store, windows["window_start"], windows["window_end"]),
        baseline=fetch_window_signals_rows(store, windows["baseline_start"], windows["baseline_end"]),
    )
    verdict = diagnose_from(
        current,
        baseline,
        signals,
        current_window=(windows["window_start"], windows["window_end"]),
        baseline_window=(windows["baseline_start"], windows["baseline_end"]),
    )
    return verdict_to_dict(verdict)


def _assert_same(got, expected, where: str = "verdict") -> None:
    if isinstance(expected, dict):
        assert list(got) == list(expected), where
        for key in expected:
            _assert_same(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert len(got) == len(expected), where
        for index, (mine, reference) in enumerate(zip(got, expected)):
            _assert_same(mine, reference, f"{where}[{index}]")
    elif isinstance(expected, float):
        assert got == pytest.approx(expected, rel=1e-12), where
    else:
        assert got == expected, where


@pytest.mark.parametrize("scenario", ["cold_start", "kv_cache_pressure", "slow_tokenizer", "healthy"])
def test_diagnosis_from_the_store_equals_the_diagnosis_of_its_rows(tmp_path, scenario) -> None:
    with Store.open(f"chdb://{tmp_path / 'store'}") as store:
        windows = load_scenario(store, SCENARIOS[scenario])
        got = verdict_to_dict(
            diagnose(
                store,
                window_start=windows["window_start"],
                window_end=windows["window_end"],
                baseline_start=windows["baseline_start"],
                baseline_end=windows["baseline_end"],
            )
        )
        expected = _python_diagnosis(store, windows)
    _assert_same(got, expected)
    assert got["healthy"] == (scenario == "healthy")
    if scenario == "cold_start":
        assert got["top_cause"] == "cold_start"


def test_a_window_where_requests_failed_is_not_healthy_however_fast_the_rest(tmp_path) -> None:
    from fault_scenarios import REQUEST_COLUMNS, T0, WINDOW, request_rows

    from inferpath.storage.rows import RequestRow

    rows = request_rows(SCENARIOS["healthy"].current, T0, seed=5)
    # One request in eight failed at the gateway (its engine was gone): 502, no first token.
    failed = [RequestRow(**(vars(r) | {"status": "error", "http_status_code": 502})) for r in rows[::8]]
    kept = [r for i, r in enumerate(rows) if i % 8]
    with Store.open(f"chdb://{tmp_path / 'store'}") as store:
        store.insert("inferpath_requests", [r.to_insert_row() for r in kept + failed], REQUEST_COLUMNS)
        verdict = diagnose(store, window_start=T0, window_end=T0 + WINDOW)
    assert not verdict.healthy and verdict.causes == [], verdict.summary
    share = len(failed) / len(rows)
    assert f"{share:.0%} of requests failed: {len(failed)} error (HTTP 502)" in verdict.summary, verdict.summary
    assert verdict.current_requests == len(kept)
    assert any(f"{len(failed)} of {len(rows)} requests in the window failed" in note for note in verdict.notes)
