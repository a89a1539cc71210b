"""Diagnosis against a TTFT target: the seed example (900 ms against a 600 ms target)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from inferpath.analysis.budget import diagnose_against_target
from inferpath.analysis.diagnosis import InsufficientDataError
from inferpath.analysis.signals import GPU_UTILIZATION_RATIO, SignalWindows, WindowSignals

MS = 1_000_000


def _rows(count: int, tokenize_ms: float, retrieval_ms: float, prefill_ms: float) -> list[dict]:
    rng = random.Random(3)
    t0 = datetime.now(timezone.utc)
    rows = []
    for i in range(count):
        stages = {"gateway_ns": 8 * MS, "tokenize_ns": int(tokenize_ms * MS * rng.uniform(0.97, 1.03)),
                  "retrieval_ns": int(retrieval_ms * MS * rng.uniform(0.97, 1.03)), "queue_ns": 20 * MS,
                  "prefill_ns": int(prefill_ms * MS * rng.uniform(0.97, 1.03)), "network_ns": 2 * MS}
        ttft = sum(stages.values()) + 10 * MS
        rows.append({"timestamp": t0 + timedelta(seconds=i), "trace_id": f"{i:032x}", "ttft_ns": ttft,
                     "e2e_ns": ttft + 400 * MS, "decode_ns": 400 * MS, **stages})
    return rows


def test_tokenization_and_retrieval_not_gpu_recover_about_300_ms() -> None:
    rows = _rows(200, tokenize_ms=150, retrieval_ms=150, prefill_ms=560)  # TTFT ≈ 900 ms
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
    slow_engine = _rows(100, tokenize_ms=5, retrieval_ms=5, prefill_ms=900)
    verdict = diagnose_against_target(slow_engine, ttft_target_ns=600 * MS)
    assert verdict.top_cause == "gpu_compute" and ", not GPU" not in verdict.summary
    fast = _rows(100, tokenize_ms=5, retrieval_ms=5, prefill_ms=200)
    assert diagnose_against_target(fast, ttft_target_ns=600 * MS).healthy


def test_target_input_is_validated() -> None:
    with pytest.raises(ValueError, match="ttft_target_ns"):
        diagnose_against_target(_rows(30, 1, 1, 1), ttft_target_ns=0)
    with pytest.raises(InsufficientDataError):
        diagnose_against_target(_rows(5, 1, 1, 1), ttft_target_ns=600 * MS)
