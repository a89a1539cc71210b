"""The issue's cases 1, 2, 4 and 5 on a real chDB store in simulated time."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
from alert_scenarios import (
    T0,
    healthy_ttft,
    insert_requests,
    insert_signals,
    request,
    signal_rows,
    simulate,
    traffic,
)

from inferpath.alerts.evaluator import AlertEvaluator
from inferpath.alerts.queries import evaluate_rule
from inferpath.alerts.rules import load_rule_file, parse_rule_text
from inferpath.vocabulary import NS_PER_SECOND

DIVERGENCE = parse_rule_text("""
evaluation_interval: 15s
rules:
  - name: TTFTTailDivergence
    kind: tail_divergence
    endpoint_class: interactive
    measure: ttft
    ratio_threshold: 4
    min_samples: 200
    window: 10m
    for: 0s
""")


def _evaluate(store, rule_file, at):
    return evaluate_rule(store, rule_file.rules[0], at)


def test_case1_divergence_fires_on_pooled_replicas(store) -> None:
    # Replica A: 1,000 at 100 ms; replica B: 950 at 100 ms and 50 at 3,000 ms.
    rows = [request(T0 + timedelta(milliseconds=i * 200), 0.1, replica="a") for i in range(1000)]
    rows += [
        request(T0 + timedelta(milliseconds=i * 200 + 100), 3.0 if i % 19 == 0 and i < 950 else 0.1, replica="b")
        for i in range(1000)
    ]
    assert sum(1 for r in rows if r.ttft_ns == 3_000_000_000) == 50
    insert_requests(store, rows)
    (sample,) = _evaluate(store, DIVERGENCE, T0 + timedelta(minutes=10))
    assert sample.evidence["samples"] == 2000
    assert math.isclose(sample.evidence["mean_seconds"], 0.1725, rel_tol=1e-9)
    assert math.isclose(sample.evidence["quantile_seconds"], 3.0, rel_tol=1e-9)
    assert set(sample.evidence) == set(DIVERGENCE.rules[0].evidence_keys)
    assert sample.active and sample.confidence == "ok"
    evaluator = AlertEvaluator(DIVERGENCE, store, notifiers=[], diagnose=False)
    assert [t.change for t in evaluator.evaluate_once(T0 + timedelta(minutes=10))] == ["firing"]


def test_case1_true_p99_over_windows_does_not_fire(store) -> None:
    # Window 1: 1,000 at 100 ms; window 2: 10 at 5,000 ms. Averaging the two windows' p99s
    # would say 2,550 ms; the p99 of all rows is 100 ms.
    rows = [request(T0 + timedelta(milliseconds=i * 300), 0.1) for i in range(1000)]
    rows += [request(T0 + timedelta(minutes=5, seconds=i), 5.0) for i in range(10)]
    insert_requests(store, rows)
    window_p99s = [np.percentile([0.1] * 1000, 99), np.percentile([5.0] * 10, 99)]
    assert math.isclose(float(np.mean(window_p99s)), 2.55)  # the false alarm we must not raise
    (sample,) = _evaluate(store, DIVERGENCE, T0 + timedelta(minutes=10))
    assert sample.evidence["samples"] == 1010
    assert math.isclose(sample.evidence["quantile_seconds"], 0.1, rel_tol=1e-9)
    assert math.isclose(
        sample.evidence["quantile_seconds"], float(np.percentile([0.1] * 1000 + [5.0] * 10, 99)), rel_tol=1e-9
    )
    assert not sample.active
    evaluator = AlertEvaluator(DIVERGENCE, store, notifiers=[], diagnose=False)
    assert evaluator.evaluate_once(T0 + timedelta(minutes=10)) == []


def test_ttft_is_judged_as_the_end_user_saw_it(store) -> None:
    # The engine answers in 50 ms, the calling client waits 2 s for its first token (a slow
    # hop): a TTFT rule reads the client's measure where the row has one, as the diagnosis does.
    rows = [request(T0 + timedelta(seconds=i), 0.05) for i in range(300)]
    for row in rows[:150]:
        row.client_ttft_ns = 2 * NS_PER_SECOND
    insert_requests(store, rows)
    rule = parse_rule_text("""
rules:
  - {name: TTFTOverSLO, kind: quantile_over_slo, measure: ttft, quantile: 0.99, slo_seconds: 1, window: 10m, min_samples: 100}
""").rules[0]
    (sample,) = evaluate_rule(store, rule, T0 + timedelta(minutes=10))
    assert sample.active and math.isclose(sample.evidence["quantile_seconds"], 2.0, rel_tol=1e-9)
    assert sample.evidence["samples"] == 300
    # Without the client's measure the same rows are the engine's 50 ms: nothing to fire on.
    for row in rows:
        row.client_ttft_ns = None
        row.trace_id = f"{int(row.trace_id, 16) + 10**6:032x}"
    store.command("TRUNCATE TABLE inferpath_requests")
    insert_requests(store, rows)
    (sample,) = evaluate_rule(store, rule, T0 + timedelta(minutes=10))
    assert not sample.active and math.isclose(sample.evidence["quantile_seconds"], 0.05, rel_tol=1e-9)


def test_case2_too_few_samples_is_low_confidence(store) -> None:
    # The same divergence as case 1, but only 150 requests: below min_samples (200).
    rows = [request(T0 + timedelta(seconds=i), 3.0 if i % 20 == 0 else 0.1) for i in range(150)]
    insert_requests(store, rows)
    evaluator = AlertEvaluator(DIVERGENCE, store, notifiers=[], diagnose=False)
    assert evaluator.evaluate_once(T0 + timedelta(minutes=10)) == []
    (status,) = evaluator.last_statuses
    (sample,) = status.samples
    assert status.health == "ok"
    assert sample.confidence == "low" and not sample.active and sample.value is None
    assert sample.evidence["samples"] == 150
    assert "150 samples < min_samples 200" in sample.reason


def test_case4_healthy_ten_minutes_nothing_fires(store) -> None:
    # Ten minutes of healthy traffic on both classes with the shipped rule pack.
    minutes = 10
    insert_requests(store, traffic(T0 - timedelta(minutes=10), (minutes + 10) * 60, 4.0, healthy_ttft, seed=3))
    insert_requests(
        store,
        traffic(
            T0 - timedelta(minutes=10),
            (minutes + 10) * 60,
            1.0,
            lambda rng, t: 1.5 * rng.lognormvariate(0.0, 0.4),
            seed=4,
            endpoint_class="bulk",
            endpoint="/v1/batch",
        ),
    )
    gauges, sums = signal_rows(T0 - timedelta(minutes=10), (minutes + 10) * 60)
    insert_signals(store, gauges, sums)
    rules = load_rule_file("default")
    evaluator = AlertEvaluator(rules, store, notifiers=[], diagnose=False)
    transitions = simulate(evaluator, T0, minutes * 60, rules.evaluation_interval)
    assert evaluator.evaluations_total == 40
    assert transitions == []
    statuses = {s.rule: s for s in evaluator.last_statuses}
    assert all(s.health == "ok" for s in statuses.values())
    # Healthy is "evaluated and quiet", not "not evaluated": every rule had enough data.
    assert all(sample.confidence == "ok" for s in statuses.values() for sample in s.samples), statuses


def test_case5_unknown_gpu_utilization_never_fires(store) -> None:
    rules = parse_rule_text("""
rules:
  - name: LatencyWhileGPUsIdle
    kind: idle_gpu_latency
    measure: ttft
    slo_seconds: 1
    idle_threshold: 0.3
    min_samples: 100
    window: 5m
""")
    slow = traffic(T0, 300, 2.0, lambda rng, t: 2.0 * rng.lognormvariate(0.0, 0.2))
    insert_requests(store, slow)
    at = T0 + timedelta(minutes=5)
    # No utilization rows at all (device without the field), then NaN samples (NVML "not supported").
    (sample,) = _evaluate(store, rules, at)
    assert sample.confidence == "unknown" and not sample.active
    gauges, _ = signal_rows(T0, 300, gpu_utilization_ratio=None, kv_cache_usage_ratio=None)
    insert_signals(store, gauges, [])
    (sample,) = _evaluate(store, rules, at)
    assert sample.confidence == "unknown" and not sample.active
    assert sample.evidence["utilization_samples"] == 0
    assert AlertEvaluator(rules, store, notifiers=[], diagnose=False).evaluate_once(at) == []
    # Control: the same latency with GPUs reported 10% busy does fire.
    gauges, _ = signal_rows(T0, 300, gpu_utilization_ratio=0.1, kv_cache_usage_ratio=None)
    insert_signals(store, gauges, [])
    (sample,) = _evaluate(store, rules, at)
    assert sample.active and math.isclose(sample.evidence["gpu_utilization_ratio"], 0.1, abs_tol=0.01)


def test_signal_rules_queue_growth_and_kv_pressure(store) -> None:
    rules = parse_rule_text("""
rules:
  - name: QueueDepthGrowing
    kind: queue_growing
    min_increase: 20
    min_depth: 10
    window: 5m
  - name: KVCachePressure
    kind: kv_pressure
    window: 5m
""")
    gauges, sums = signal_rows(
        T0, 300, queue_depth=lambda t: 0.1 * t, kv_cache_usage_ratio=0.95, preemptions_per_minute=6.0
    )
    insert_signals(store, gauges, sums)
    queue, kv = (evaluate_rule(store, rule, T0 + timedelta(minutes=5))[0] for rule in rules.rules)
    assert queue.active and math.isclose(queue.evidence["slope_per_second"], 0.1, rel_tol=0.05)
    assert kv.active and kv.evidence["preemptions"] == 30  # a 0.1/s counter stored as whole numbers, 300 s
    assert kv.evidence["kv_cache_usage_ratio"] > 0.9
    # The evidence a query reports is what its kind declares to annotation templates.
    for rule, sample in zip(rules.rules, (queue, kv)):
        assert set(sample.evidence) == set(rule.evidence_keys), rule.kind


def test_for_counts_evaluation_ticks_not_the_jitter_of_when_each_pass_started(store) -> None:
    """The loop's passes start a few milliseconds late, by varying amounts. Each evaluation is
    stamped with its tick (as Prometheus stamps rule evaluations), so ``for`` of two
    intervals fires at the second evaluation after the one that went pending."""
    rules = parse_rule_text("""
evaluation_interval: 1s
rules:
  - name: TTFTp99OverSLO
    kind: quantile_over_slo
    measure: ttft
    quantile: 0.99
    slo_seconds: 0.4
    min_samples: 5
    window: 1m
    for: 2s
""")
    insert_requests(store, [request(T0 + timedelta(seconds=i), 2.0) for i in range(30)])
    started = [T0 + timedelta(minutes=1, milliseconds=ms) for ms in (10, 1012, 2005, 3009)]
    evaluator = AlertEvaluator(rules, store, notifiers=[], diagnose=False, clock=iter(started).__next__)
    states = []
    for _ in started:
        evaluator.run_pass()
        states.append("firing" if evaluator.firing() else "pending" if evaluator.pending() else "inactive")
    # By the pass start times, the third pass is 1.995 s after the first: stamped with them,
    # the alert would still be pending there.
    assert states == ["pending", "pending", "firing", "firing"]
    (alert,) = evaluator.firing()
    assert alert.active_at == started[0] and alert.fired_at == started[0] + timedelta(seconds=2)


def test_an_alert_that_stops_reports_the_value_that_stopped_it(store) -> None:
    rules = parse_rule_text("""
rules:
  - {name: TTFTp99OverSLO, kind: quantile_over_slo, measure: ttft, quantile: 0.99, slo_seconds: 0.4, min_samples: 5, window: 1m, for: 5m}
""")
    insert_requests(store, [request(T0 + timedelta(seconds=i), 2.0) for i in range(30)])
    insert_requests(store, [request(T0 + timedelta(minutes=2, seconds=i), 0.1) for i in range(30)])
    evaluator = AlertEvaluator(rules, store, notifiers=[], diagnose=False)
    (pending,) = evaluator.evaluate_once(T0 + timedelta(minutes=1))
    (stopped,) = evaluator.evaluate_once(T0 + timedelta(minutes=3))
    assert (pending.change, pending.value) == ("pending", 2.0)
    assert stopped.change == "inactive" and math.isclose(stopped.value, 0.1) and "100.0 ms" in stopped.reason
