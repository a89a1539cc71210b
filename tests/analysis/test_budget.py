"""Diagnosis against a TTFT target: the seed example (900 ms against a 600 ms target)."""

from __future__ import annotations

import pytest
from fault_scenarios import MS, budget_rows

from inferpath.analysis.budget import diagnose_against_target
from inferpath.analysis.diagnosis import InsufficientDataError
from inferpath.analysis.signals import SignalWindows, WindowSignals
from inferpath.vocabulary import GPU_UTILIZATION_RATIO


def test_tokenization_and_retrieval_not_gpu_recover_about_300_ms() -> None:
    rows = budget_rows(200, tokenize_ms=150, retrieval_ms=150, prefill_ms=560)  # TTFT ≈ 900 ms
    signals = SignalWindows(current=WindowSignals.from_values({GPU_UTILIZATION_RATIO: [0.3, 0.35, 0.4]}))
    verdict = diagnose_against_target(rows, ttft_target_ns=600 * MS, signals=signals)
    assert not verdict.healthy
    assert 880 * MS < verdict.degradations[0].current_p99_ns < 940 * MS
    assert {c.cause for c in verdict.causes} == {"tokenization", "retrieval"}
    for cause in verdict.causes:
        assert 140 * MS < cause.added_ns < 165 * MS
        assert cause.would_not_help[0].startswith("adding GPUs will not help")
    helps = " ".join(h for c in verdict.causes for h in c.would_help)
    assert "tokenization in-process" in helps and "retrieval in parallel with the first model pass" in helps
    assert ", not GPU" in verdict.summary
    recovered_ms = int(verdict.summary.rsplit("about ", 1)[1].split(" ms")[0])
    assert 290 <= recovered_ms <= 320


def test_engine_over_target_names_gpu_and_within_target_is_healthy() -> None:
    slow_engine = budget_rows(100, tokenize_ms=5, retrieval_ms=5, prefill_ms=900)
    verdict = diagnose_against_target(slow_engine, ttft_target_ns=600 * MS)
    assert verdict.top_cause == "gpu_compute" and ", not GPU" not in verdict.summary
    fast = budget_rows(100, tokenize_ms=5, retrieval_ms=5, prefill_ms=200)
    assert diagnose_against_target(fast, ttft_target_ns=600 * MS).healthy


def test_target_input_is_validated() -> None:
    with pytest.raises(ValueError, match="ttft_target_ns"):
        diagnose_against_target(budget_rows(30, 1, 1, 1), ttft_target_ns=0)
    with pytest.raises(InsufficientDataError):
        diagnose_against_target(budget_rows(5, 1, 1, 1), ttft_target_ns=600 * MS)
