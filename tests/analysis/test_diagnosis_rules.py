"""Each diagnosis rule on its own, and the pure core fed directly."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from fault_scenarios import MS, T0

from inferpath.analysis.diagnosis import (
    DEGRADED_RATIO, MIN_DEGRADATION_NS, InsufficientDataError, batch_grew, cold_start_rows, degradation,
    diagnose_from, gpu_saturated, kv_pressure, stage_cause,
)
from inferpath.analysis.signals import SignalWindows, WindowSignals
from inferpath.analysis.verdict import CAUSES, verdict_to_dict


def _signals(current: dict, baseline: dict, current_preemptions=None, baseline_preemptions=None) -> SignalWindows:
    return SignalWindows(current=WindowSignals.from_values(current, current_preemptions),
                         baseline=WindowSignals.from_values(baseline, baseline_preemptions))


def test_kv_pressure_from_usage_or_from_more_preemptions_per_request() -> None:
    assert kv_pressure(_signals({"kv_cache_usage_ratio": [0.95] * 10}, {}), 100, 100)
    assert not kv_pressure(_signals({"kv_cache_usage_ratio": [0.5] * 9 + [0.95]}, {}), 100, 100)  # one blip
    assert kv_pressure(_signals({}, {}, current_preemptions=30, baseline_preemptions=0), 100, 100)
    # Same preemptions per request as the baseline: nothing new.
    assert not kv_pressure(_signals({}, {}, current_preemptions=10, baseline_preemptions=20), 100, 200)
    assert not kv_pressure(SignalWindows(), 100, 100)


def test_gpu_saturated_and_batch_grew() -> None:
    assert gpu_saturated(_signals({"gpu_utilization_ratio": [0.97, 0.99]}, {}))
    assert not gpu_saturated(_signals({"gpu_utilization_ratio": [0.5, 0.99]}, {}))
    assert not gpu_saturated(SignalWindows())
    assert batch_grew(_signals({"running_requests": [40]}, {"running_requests": [8]}))
    assert not batch_grew(_signals({"running_requests": [10]}, {"running_requests": [8]}))
    assert not batch_grew(_signals({"running_requests": [10]}, {}))


@pytest.mark.parametrize(("stage", "kv", "saturated", "batch", "cause"), [
    ("tokenize", True, True, True, "tokenization"),
    ("retrieval", False, False, False, "retrieval"),
    ("network", False, True, False, "network_hop"),
    ("queue", True, True, True, "gpu_memory"),
    ("queue", False, True, True, "gpu_compute"),
    ("queue", False, False, True, "batching"),
    ("queue", False, False, False, "queueing"),
    ("prefill", True, False, False, "gpu_memory"),
    ("prefill", False, False, True, "gpu_compute"),
    ("decode", False, True, True, "batching"),
    ("decode", False, True, False, "gpu_compute"),
    ("decode", True, False, True, "gpu_memory"),
    ("gateway", False, False, False, "unexplained"),
    ("rest", False, False, False, "unexplained"),
])
def test_stage_cause_walks_the_troubleshooting_order(stage, kv, saturated, batch, cause) -> None:
    assert stage_cause(stage, kv=kv, saturated=saturated, batch=batch) == cause
    assert cause in CAUSES


def test_degradation_needs_both_ratio_and_absolute_rise() -> None:
    base = [{"ttft_ns": 100 * MS} for _ in range(50)]
    assert degradation("ttft", [{"ttft_ns": 200 * MS}] * 50, base).degraded
    small = [{"ttft_ns": 2 * MS}] * 50
    tiny_rise = degradation("ttft", [{"ttft_ns": 2 * MS + MIN_DEGRADATION_NS // 2}] * 50, small)
    assert tiny_rise.ratio >= DEGRADED_RATIO and not tiny_rise.degraded
    assert not degradation("ttft", [{"ttft_ns": 140 * MS}] * 50, base).degraded
    missing = degradation("itl", [{"itl_ns": None}], base)
    assert missing.ratio is None and not missing.degraded


def test_cold_start_rows_are_a_new_replicas_first_minute() -> None:
    baseline = [{"replica": "a", "timestamp": T0}]
    current = [{"replica": r, "timestamp": T0 + timedelta(seconds=s), "trace_id": f"{r}{s}"}
               for r, s in [("a", 0), ("b", 10), ("b", 30), ("b", 75), ("c", 5)]]
    cold = cold_start_rows(current, baseline)
    assert {k: [r["trace_id"] for r in v] for k, v in cold.items()} == {"b": ["b10", "b30"], "c": ["c5"]}


def test_diagnose_from_rows_alone_names_the_tokenizer(scenario_rows) -> None:
    current, baseline = scenario_rows("slow_tokenizer")
    verdict = diagnose_from(current, baseline)
    assert not verdict.healthy and verdict.measure == "ttft"
    assert verdict.top_cause == "tokenization"
    assert verdict.causes[0].share > 0.8
    tokenize = next(e for e in verdict.causes[0].evidence if e.measure == "tokenize_ns")
    assert tokenize.baseline < 10 * MS and tokenize.current > 150 * MS
    assert tokenize.current_window == (current[0]["timestamp"], current[-1]["timestamp"])
    # No GPU signal: the advice still says why GPUs are not the fix, without inventing a number.
    assert "before the request reaches the engine" in verdict.causes[0].would_not_help[0]


def test_diagnose_from_healthy_and_insufficient_windows(scenario_rows) -> None:
    current, baseline = scenario_rows("healthy")
    verdict = diagnose_from(current, baseline)
    assert verdict.healthy and verdict.causes == [] and verdict.top_cause is None
    assert verdict.summary.startswith("healthy")
    with pytest.raises(InsufficientDataError, match="baseline window has 5"):
        diagnose_from(current, baseline[:5])


def test_verdict_to_dict_is_json_ready(scenario_rows) -> None:
    current, baseline = scenario_rows("extra_network_hop")
    signals = _signals({"gpu_utilization_ratio": [0.21] * 10}, {"gpu_utilization_ratio": [0.2] * 10})
    verdict = diagnose_from(current, baseline, signals)
    data = json.loads(json.dumps(verdict_to_dict(verdict)))
    assert data["top_cause"] == "network_hop" and data["healthy"] is False
    cause = data["causes"][0]
    assert cause["cause"] == "network_hop"
    assert cause["would_not_help"][0].startswith("adding GPUs will not help: utilization 21% while TTFT p99 rose")
    assert data["current_window"][0] == current[0]["timestamp"].isoformat()
    assert {d["measure"] for d in data["degradations"]} == {"ttft", "itl", "e2e"}
