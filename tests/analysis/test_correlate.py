"""As-of alignment of engine/GPU signals with per-step latency, and spike windows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fault_scenarios import SCENARIOS, T0, WINDOW, load_scenario

from inferpath.analysis.correlate import build_timeline, detect_spikes, fetch_timeline, pearson, spearman
from inferpath.analysis.signals import Series, WindowSignals
from inferpath.analysis.timeline_query import fetch_window_signals
from inferpath.storage.rows import unix_ns_from_datetime
from inferpath.storage.store import Store

S = 1_000_000_000


def test_asof_takes_the_latest_sample_within_the_lookback() -> None:
    series = Series(times_ns=[10 * S, 20 * S, 30 * S], values=[1.0, 2.0, 3.0])
    assert series.asof(25 * S, 60 * S) == 2.0
    assert series.asof(20 * S, 60 * S) == 2.0  # a sample at the instant counts
    assert series.asof(5 * S, 60 * S) is None  # nothing before
    assert series.asof(100 * S, 60 * S) is None  # stale


def test_counter_increase_survives_a_restart() -> None:
    series = Series(times_ns=[0, 10 * S, 20 * S, 30 * S, 40 * S], values=[5.0, 7.0, 9.0, 1.0, 4.0])
    # 7→9 (+2), restart to 1 (+1), 1→4 (+3), based on the sample at 10 s.
    assert series.counter_increase(10 * S, 40 * S, 300 * S) == 6.0
    assert series.counter_increase(41 * S, 50 * S, 300 * S) is None


def test_build_timeline_joins_requests_and_signals_per_step() -> None:
    rows = [
        {"timestamp": t * S, "ttft_ns": v, "e2e_ns": 2 * v, "itl_ns": None} for t, v in [(1, 100), (2, 300), (12, 1000)]
    ]
    gauges = {
        "queue_depth": {("a",): Series([0, 9 * S], [1.0, 2.0]), ("b",): Series([5 * S], [10.0])},
        "kv_cache_usage_ratio": {("a",): Series([0, 15 * S], [0.5, 0.9]), ("b",): Series([0], [0.7])},
    }
    counters = {("a",): Series([0, 10 * S, 20 * S], [0.0, 4.0, 6.0])}
    timeline = build_timeline(rows, gauges, counters, start_ns=0, end_ns=20 * S, step_seconds=10)
    assert timeline.step_start_ns == [0, 10 * S]
    assert timeline.columns["requests"] == [2.0, 1.0]
    assert timeline.columns["ttft_p99_seconds"][0] == pytest.approx(np.quantile([100e-9, 300e-9], 0.99))
    assert timeline.columns["ttft_avg_seconds"][0] == pytest.approx(200e-9)
    assert timeline.columns["itl_p99_seconds"] == [None, None]
    assert timeline.columns["queue_depth"] == [12.0, 12.0]  # summed over engines, as of each step end
    assert timeline.columns["kv_cache_usage_ratio"] == [0.7, 0.9]  # the fullest engine
    assert timeline.columns["preemptions_per_second"] == [0.4, 0.2]
    assert timeline.rows()[1]["queue_depth"] == 12.0
    with pytest.raises(ValueError, match="step_seconds"):
        build_timeline(rows, gauges, counters, start_ns=0, end_ns=20 * S, step_seconds=0)


def test_timeline_ttft_is_the_clients_where_measured() -> None:
    rows = [
        {"timestamp": 1 * S, "ttft_ns": 100, "client_ttft_ns": 400, "e2e_ns": 200, "client_e2e_ns": None},
        {"timestamp": 2 * S, "ttft_ns": 300, "e2e_ns": 500},
    ]
    timeline = build_timeline(rows, {}, {}, start_ns=0, end_ns=10 * S, step_seconds=10)
    assert timeline.columns["ttft_avg_seconds"] == [pytest.approx(350e-9)]  # 400 (client) and 300
    assert timeline.columns["e2e_p99_seconds"] == [pytest.approx(np.quantile([200e-9, 500e-9], 0.99))]


def test_pearson_ignores_missing_steps() -> None:
    assert pearson([1, 2, None, 3], [2, 4, 100, 6]) == pytest.approx(1.0)
    assert pearson([1, 2], [1, 2]) is None
    assert pearson([1, 1, 1], [1, 2, 3]) is None


def test_spearman_reads_any_monotone_relation_and_shares_tied_ranks() -> None:
    assert spearman([1, 2, 3, 4], [1, 8, 27, 1000]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties take their mean rank: [1, 2.5, 2.5, 4] against [1, 2, 3, 4]
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(pearson([1, 2.5, 2.5, 4], [1, 2, 3, 4]))
    assert spearman([5, 5, 5], [1, 2, 3]) is None


def test_detect_spikes_merges_adjacent_steps_and_keeps_spikes_out_of_the_baseline() -> None:
    values = [1.0, 1.1, 0.9, 1.0, 1.05, 1.0, 5.0, 6.0, 1.0, None, 1.0, 4.0, 1.0]
    times = [i * 10 * S for i in range(len(values))]
    spikes = detect_spikes(times, values, 10)
    assert [(w.start_ns, w.end_ns) for w in spikes] == [(60 * S, 80 * S), (110 * S, 120 * S)]
    assert spikes[0].peak == 6.0 and spikes[0].baseline == pytest.approx(1.0)
    assert spikes[1].ratio == pytest.approx(4.0)  # the baseline never absorbed 5.0 or 6.0
    assert detect_spikes(times[:3], values[:3], 10) == []  # too little history to judge
    with pytest.raises(ValueError, match="factor"):
        detect_spikes(times, values, 10, factor=1.0)


def test_fetch_timeline_and_window_signals_from_a_store(store_url: str) -> None:
    with Store.open(store_url) as store:
        windows = load_scenario(store, SCENARIOS["kv_cache_pressure"])
        timeline = fetch_timeline(store, start=windows["baseline_start"], end=windows["window_end"], step_seconds=30)
        current = fetch_window_signals(store, windows["window_start"], windows["window_end"])
        baseline = fetch_window_signals(store, windows["baseline_start"], windows["baseline_end"])
    steps = len(timeline.step_start_ns)
    assert steps == 2 * WINDOW.total_seconds() / 30
    half = steps // 2
    kv = timeline.columns["kv_cache_usage_ratio"]
    assert max(kv[:half]) < 0.6 and min(kv[half:]) > 0.85
    assert all(r == 30.0 for r in timeline.columns["requests"])  # one request per second
    preemption_rate = timeline.columns["preemptions_per_second"]
    assert sum(preemption_rate[half:]) > 0 == sum(preemption_rate[1:half])
    # Latency follows the queue: the two move together across the fault.
    assert pearson(timeline.columns["ttft_p99_seconds"], timeline.columns["queue_depth"]) > 0.5
    assert baseline.stat("kv_cache_usage_ratio", "p90") < 0.6 < 0.9 < current.stat("kv_cache_usage_ratio", "p90")
    assert current.preemptions == pytest.approx(120, abs=2) and baseline.preemptions == 0
    assert current.stat("gpu_memory_used_bytes") == 70e9
    assert isinstance(WindowSignals.from_values({"queue_depth": []}).gauges, dict)
    assert unix_ns_from_datetime(T0) == timeline.step_start_ns[0]
    assert not any(v is not None and math.isnan(v) for v in timeline.columns["ttft_p99_seconds"])
