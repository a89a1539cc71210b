"""The diagnosis of each injected fault, read back from a real embedded ClickHouse store."""

from __future__ import annotations

import pytest
from fault_scenarios import SCENARIOS, load_scenario

from inferpath.analysis.diagnosis import MIN_CAUSE_SHARE, diagnose
from inferpath.analysis.verdict import verdict_to_dict
from inferpath.storage.store import Store

EXPECTED = {
    "slow_tokenizer": ("tokenization", "ttft"),
    "slow_retrieval": ("retrieval", "ttft"),
    "extra_network_hop": ("network_hop", "ttft"),
    "oversized_batch": ("batching", "e2e"),
    "kv_cache_pressure": ("gpu_memory", "ttft"),
    "gpu_saturation": ("gpu_compute", "ttft"),
    "cold_start": ("cold_start", "ttft"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_fault_is_named_as_the_top_cause(store_url: str, name: str) -> None:
    cause, measure = EXPECTED[name]
    with Store.open(store_url) as store:
        windows = load_scenario(store, SCENARIOS[name])
        verdict = diagnose(store, **windows)
    assert not verdict.healthy
    assert verdict.top_cause == cause, verdict.summary
    assert verdict.measure == measure
    assert verdict.causes[0].share > 0.7
    assert all(c.share >= MIN_CAUSE_SHARE for c in verdict.causes)
    assert [c.share for c in verdict.causes] == sorted((c.share for c in verdict.causes), reverse=True)
    assert verdict.current_window == (windows["window_start"], windows["window_end"])
    assert verdict.current_requests == verdict.baseline_requests == 600
    top = verdict.causes[0]
    assert top.would_help and top.would_not_help and len(top.evidence) >= 2
    assert all(e.current_window == verdict.current_window for e in top.evidence)
    assert verdict_to_dict(verdict)["top_cause"] == cause


def test_cpu_faults_say_gpus_will_not_help_with_the_utilization(store_url: str) -> None:
    with Store.open(store_url) as store:
        verdict = diagnose(store, **load_scenario(store, SCENARIOS["slow_tokenizer"]))
    text = verdict.causes[0].would_not_help[0]
    assert text.startswith("adding GPUs will not help: the time is spent before the request reaches the engine")
    assert "(GPU utilization 55%)" in text
    tokenize = next(e for e in verdict.causes[0].evidence if e.measure == "tokenize_ns")
    assert tokenize.text.startswith("tokenize p99") and tokenize.current > 5 * tokenize.baseline


def test_kv_pressure_evidence_carries_usage_and_preemptions(store_url: str) -> None:
    with Store.open(store_url) as store:
        verdict = diagnose(store, **load_scenario(store, SCENARIOS["kv_cache_pressure"]))
    evidence = {e.measure: e for e in verdict.causes[0].evidence}
    assert evidence["kv_cache_usage_ratio"].current >= 0.9 > evidence["kv_cache_usage_ratio"].baseline
    assert evidence["preemptions_total"].current > 100 and not evidence["preemptions_total"].baseline
    assert evidence["queue_depth"].current > 10 * evidence["queue_depth"].baseline


def test_healthy_window_and_endpoint_filter(store_url: str) -> None:
    with Store.open(store_url) as store:
        windows = load_scenario(store, SCENARIOS["healthy"])
        verdict = diagnose(store, **windows)
        assert verdict.healthy and verdict.causes == []
        with pytest.raises(ValueError, match="requests with an E2E latency"):
            diagnose(store, **windows, endpoint="/v1/embeddings")
        with pytest.raises(ValueError, match="window_end must be after"):
            diagnose(store, **(windows | {"window_end": windows["window_start"]}))
