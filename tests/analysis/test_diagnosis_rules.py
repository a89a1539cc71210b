"""Each diagnosis rule on its own, and the pure core fed directly."""

from __future__ import annotations

import json
import random
from datetime import timedelta

import pytest
from fault_scenarios import MS, T0, budget_rows

from inferpath.analysis.causes import REGISTRY, Context, cause_of
from inferpath.analysis.diagnosis import (
    DEGRADED_RATIO,
    MIN_DEGRADATION_NS,
    InsufficientDataError,
    _held_at_opening,
    batch_grew,
    cold_start_rows,
    degradation,
    diagnose_from,
    queue_held,
)
from inferpath.analysis.engine_state import (
    EngineState,
    engine_state,
    engine_state_between_scrapes,
    sustained_peak,
)
from inferpath.analysis.objectives import DEFAULT_OBJECTIVES
from inferpath.analysis.signals import SignalWindows, WindowSignals
from inferpath.analysis.startup import ReplicaStartup
from inferpath.analysis.verdict import verdict_to_dict
from inferpath.vocabulary import CAUSES


def _signals(current: dict, baseline: dict, current_preemptions=None, baseline_preemptions=None) -> SignalWindows:
    return SignalWindows(
        current=WindowSignals.from_values(current, current_preemptions),
        baseline=WindowSignals.from_values(baseline, baseline_preemptions),
    )


def _engine(queue, running, kv, preemptions=None, limit=None) -> EngineState:
    window = WindowSignals.from_values(
        {"queue_depth": queue, "running_requests": running, "kv_cache_usage_ratio": kv}, preemptions
    )
    return engine_state(window, configured_limit=limit)


def test_a_batch_pinned_at_its_limit_with_requests_waiting_is_slot_bound() -> None:
    # vLLM with --max-num-seqs 4 under overload: running pinned at 4, KV nearly empty.
    state = _engine(queue=[0, 3, 9, 20, 35, 40], running=[2, 4, 4, 4, 4, 4], kv=[0.02, 0.05, 0.06, 0.06, 0.05, 0.06])
    assert (state.waiting_steps, state.slot_bound_steps, state.memory_bound_steps) == (5, 5, 0)
    assert state.bound == "slots" and not state.memory_pressure
    assert "at its limit of 4 (observed max) in 5" in state.text()


def test_waiting_with_free_slots_is_memory_bound_when_kv_is_full_or_sequences_were_preempted() -> None:
    full = _engine(queue=[5, 9, 12, 14], running=[3, 5, 4, 6], kv=[0.95, 0.97, 0.93, 0.99])
    assert full.bound == "memory" and full.memory_pressure
    # The live vLLM capture's burst: 56 waiting, 5 of 16 slots used, KV at 63%, 2 preemptions.
    preempted = _engine(queue=[0, 56, 52, 40], running=[1, 5, 6, 8], kv=[0.1, 0.63, 0.70, 0.66], preemptions=2)
    assert preempted.bound == "memory"
    # A configured limit reached while preempting is still a full batch at those steps.
    configured = _engine(queue=[5, 5], running=[8, 8], kv=[0.5, 0.5], preemptions=3, limit=8)
    assert configured.bound == "slots"


def test_a_queue_behind_one_sequence_that_fills_most_of_the_pool_is_memory_bound() -> None:
    # The emulated engine's KV pool of 160 blocks, as stored under a loaded CI run: one running
    # sequence held 87 % of it, and 3-9 requests waited while 63-85 % stood free. The next
    # one may be as large as the largest the window ran, so it did not fit.
    state = _engine(
        queue=[0, 0, 0, 5, 11, 9, 7, 3],
        running=[2, 0, 0, 1, 1, 1, 1, 1],
        kv=[0.925, 0.0, 0.0, 0.15, 0.869, 0.2, 0.206, 0.369],
    )
    assert (state.waiting_steps, state.memory_bound_steps, state.held_steps) == (5, 5, 0), state.text()
    assert state.bound == "memory"


def test_waiting_with_free_slots_and_kv_room_is_a_hold() -> None:
    held = _engine(queue=[1, 2, 1, 1, 0], running=[3, 2, 6, 3, 4], kv=[0.01] * 5)
    assert held.bound == "held" and held.held_steps == 3
    quiet = _engine(queue=[0, 0, 0], running=[1, 2, 1], kv=[0.01] * 3)
    assert quiet.bound is None and quiet.waiting_steps == 0 and "no request waited" in quiet.text()
    assert not engine_state(WindowSignals()).reported


def _two_engines(engine0: dict, engine1: dict) -> WindowSignals:
    """Per-series columns of two vLLM engines, labelled as the collectors store them."""
    sources = {
        "queue_depth": "vllm:num_requests_waiting",
        "running_requests": "vllm:num_requests_running",
        "kv_cache_usage_ratio": "vllm:kv_cache_usage_perc",
    }
    columns: dict = {name: {} for name in sources}
    for engine, values in (("0", engine0), ("1", engine1)):
        for name, column in values.items():
            attributes = (("engine", engine), ("inferpath.source_metric", sources[name]), ("model_name", "tiny"))
            columns[name][("vllm", (("service.name", "vllm"),), attributes)] = column
    return WindowSignals.from_series_columns(columns)


def test_a_late_scrape_read_at_several_steps_counts_once() -> None:
    # One scrape (14 waiting, 2 of 3 running) stayed the latest for five one-second steps.
    late = _engine(queue=[14, 14, 14, 14, 14, 9, 8], running=[2, 2, 2, 2, 2, 3, 3], kv=[0.1] * 7)
    assert (late.waiting_steps, late.slot_bound_steps, late.held_steps) == (3, 2, 1) and late.bound == "slots"
    # An idle engine reads the same in every scrape: each step counts.
    idle = _engine(queue=[0, 0, 0], running=[1, 1, 1], kv=[0.1] * 3)
    assert idle.steps == 3 and idle.waiting_steps == 0


S = 1_000_000_000


def test_a_queue_between_scrapes_is_counted_from_the_spans_with_kv_from_the_latest_scrape() -> None:
    # Scrapes 15 s apart, as of each one-second step: none saw a request waiting.
    scraped = WindowSignals.from_values(
        {
            "queue_depth": [0] * 15 + [0] * 15,
            "running_requests": [1] * 15 + [2] * 15,
            "kv_cache_usage_ratio": [0.05] * 15 + [0.85] * 15,
        }
    )
    times = [(i + 1) * S - 1 for i in range(30)]
    # Requests as (arrival, scheduled, end): four run 2-8 s; two more arrive at 3 s and wait
    # until 8 s; in the second half three run 16-28 s and two wait from 18 s to 28 s.
    spans = [(2 * S, 2 * S, 8 * S)] * 4 + [(3 * S, 8 * S, 12 * S)] * 2
    spans += [(16 * S, 16 * S, 28 * S)] * 3 + [(18 * S, 28 * S, 29 * S)] * 2
    state = engine_state_between_scrapes(scraped, spans, times, scraped_waiting_steps=0)
    assert state.source == "spans and scrapes" and state.slot_limit == 4 and state.running_max == 4
    # 3-7 s: four running, the peak: the slots'. 18-27 s: three of four running with KV at
    # 85 % as of the latest scrape: no room beside three sequences (75 %): memory's.
    assert (state.waiting_steps, state.slot_bound_steps, state.memory_bound_steps, state.held_steps) == (15, 5, 10, 0)
    assert state.bound == "memory" and "its scrapes, further apart, showed requests waiting in 0 steps" in state.text()
    # The same queue with KV nearly empty in the second half: held with free slots and KV.
    roomy = WindowSignals.from_values(
        {"queue_depth": [0] * 30, "running_requests": [1] * 30, "kv_cache_usage_ratio": [0.05] * 30}
    )
    held = engine_state_between_scrapes(roomy, spans, times, scraped_waiting_steps=0)
    assert (held.slot_bound_steps, held.memory_bound_steps, held.held_steps) == (5, 0, 10) and held.bound == "held"


def test_a_running_batch_counted_from_spans_peaks_where_it_stays() -> None:
    # A batch pinned at 5 of 5 whose spans' ends lag the engine: one step reads 6, one 7.
    assert sustained_peak([4, 5, 5, 6, 5, 5, 7, 5, 5]) == 5
    assert sustained_peak([2, 6, 6, 3]) == 6 and sustained_peak([3]) == 3 and sustained_peak([]) == 0


def test_several_engines_are_read_one_by_one() -> None:
    # Two real vLLM servers of 4 slots each behind round robin: whenever one queued it was
    # full, while the other had a slot free. Summed, 7 of 8 running reads as a hold.
    full = {"queue_depth": [0, 3, 5, 2], "running_requests": [2, 4, 4, 4], "kv_cache_usage_ratio": [0.01] * 4}
    spare = {"queue_depth": [0, 0, 0, 0], "running_requests": [2, 3, 3, 4], "kv_cache_usage_ratio": [0.01] * 4}
    window = _two_engines(full, spare)
    assert len(window.engines) == 2 and [s[:2] for s in window.steps] == [(0, 4), (3, 7), (5, 7), (2, 8)]
    state = engine_state(window)
    assert (state.waiting_steps, state.slot_bound_steps, state.held_steps) == (3, 3, 0) and state.bound == "slots"
    assert state.engines == 2 and state.slot_limit == 8 and "limit (4 per engine, observed max) in 3" in state.text()
    # The same as one engine: a hold at 7 of an observed 8.
    summed = WindowSignals(steps=window.steps)
    assert engine_state(summed).bound == "held"
    # A queue where the engine has room is still a hold, engine by engine.
    held = dict(full, running_requests=[4, 2, 3, 2])
    assert engine_state(_two_engines(held, spare)).bound == "held"


def test_an_engines_preemptions_are_its_own() -> None:
    # Engine 0 queues at its 4 slots with KV nearly empty; engine 1 preempted 3 sequences
    # and never queued. The fleet's total would make engine 0's queue a KV shortage.
    full = {"queue_depth": [0, 3, 5, 2], "running_requests": [2, 4, 4, 4], "kv_cache_usage_ratio": [0.01] * 4}
    preempting = {"queue_depth": [0, 0, 0, 0], "running_requests": [3, 2, 3, 3], "kv_cache_usage_ratio": [0.9] * 4}
    window = _two_engines(full, preempting)

    def counter(engine: str) -> tuple:
        attributes = (
            ("engine", engine),
            ("inferpath.source_metric", "vllm:num_preemptions_total"),
            ("model_name", "tiny"),
        )
        return ("vllm", (("service.name", "vllm"),), attributes)

    window.set_preemptions({counter("0"): 0.0, counter("1"): 3.0})
    assert window.preemptions == 3.0 and sorted(window.engine_preemptions.values()) == [0.0, 3.0]
    assert engine_state(window).bound == "slots"
    # Where the counters cannot be told apart, the fleet's total is all there is.
    window.set_preemptions({("vllm", (), ()): 3.0})
    assert window.engine_preemptions == {} and engine_state(window).bound == "memory"


def _context(bound_state: EngineState, **flags) -> Context:
    return Context(engine=bound_state, **flags)


SLOTS = _engine([5, 6], [4, 4], [0.1, 0.1])
MEMORY = _engine([5, 6], [3, 2], [0.95, 0.96], preemptions=4)
HELD = _engine([1, 1, 0, 1], [2, 3, 5, 3], [0.1] * 4)
IDLE = _engine([0, 0], [2, 3], [0.1, 0.1])
NONE = engine_state(WindowSignals())


@pytest.mark.parametrize(
    ("stage", "state", "flags", "cause"),
    [
        ("tokenize", MEMORY, {}, "tokenization"),
        ("retrieval", SLOTS, {}, "retrieval"),
        ("network", SLOTS, {}, "network_hop"),
        ("queue", MEMORY, {}, "gpu_memory"),
        ("queue", SLOTS, {}, "gpu_compute"),  # no GPU utilization needed
        ("queue", HELD, {}, "batching"),
        ("queue", HELD, {"gpu_utilization": 0.99}, "gpu_compute"),
        # held, and each step slower for the same batch: the GPU had no room for them either
        ("queue", HELD, {"decode_slower": True}, "gpu_compute"),
        # held while steps grew with a larger batch (vLLM at its step token budget): the hold's
        ("queue", HELD, {"decode_slower": True, "batch_grew": True}, "batching"),
        ("queue", NONE, {"decode_slower": True, "batch_grew": True}, "gpu_compute"),
        ("queue", IDLE, {}, "queueing"),  # nothing waits in the engine: the queue is upstream
        ("queue", NONE, {}, "queueing"),
        ("queue", NONE, {"queue_held": True}, "batching"),
        ("prefill", MEMORY, {}, "gpu_memory"),
        ("prefill", SLOTS, {}, "gpu_compute"),
        ("decode", HELD, {"batch_grew": True}, "batching"),  # the hold made the batch larger
        ("decode", NONE, {"batch_grew": True, "queue_held": True}, "batching"),
        # grown with the traffic, nothing held (real vLLM under a burst): the steps' compute
        ("decode", IDLE, {"batch_grew": True}, "gpu_compute"),
        ("decode", SLOTS, {"batch_grew": True}, "gpu_compute"),
        ("decode", IDLE, {}, "gpu_compute"),
        ("decode", MEMORY, {"batch_grew": True}, "gpu_memory"),
        ("gateway", SLOTS, {}, "unexplained"),
        ("rest", SLOTS, {}, "unexplained"),
    ],
)
def test_each_stage_goes_to_the_first_cause_of_the_registry_that_claims_it(stage, state, flags, cause) -> None:
    assert cause_of(stage, _context(state, **flags)) == cause
    assert cause in CAUSES


def test_the_registry_names_only_known_causes_and_every_rule_gives_advice() -> None:
    from inferpath.dashboard.verdict import CAUSE_LABELS

    assert {rule.name for rule in REGISTRY} <= set(CAUSES)
    assert set(CAUSE_LABELS) == set(CAUSES)  # the dashboard words every cause, and no other
    for rule in REGISTRY:
        assert rule.would_help(_context(SLOTS)), rule.name


def test_degradation_needs_both_ratio_and_absolute_rise() -> None:
    base = [{"ttft_ns": 100 * MS} for _ in range(50)]
    assert degradation("ttft", [{"ttft_ns": 200 * MS}] * 50, base).degraded
    small = [{"ttft_ns": 2 * MS}] * 50
    tiny_rise = degradation("ttft", [{"ttft_ns": 2 * MS + MIN_DEGRADATION_NS // 2}] * 50, small)
    assert tiny_rise.ratio >= DEGRADED_RATIO and not tiny_rise.degraded
    assert not degradation("ttft", [{"ttft_ns": 140 * MS}] * 50, base).degraded
    missing = degradation("itl", [{"itl_ns": None}], base)
    assert missing.ratio is None and not missing.degraded


def test_batch_growth_and_a_hold_on_every_request() -> None:
    assert batch_grew(_signals({"running_requests": [40]}, {"running_requests": [8]}))
    assert not batch_grew(_signals({"running_requests": [10]}, {"running_requests": [8]}))
    held = [{"queue_ns": v * MS} for v in [500, 510, 505, 520, 515, 530, 490, 500, 505, 510]]
    bursty = [{"queue_ns": v * MS} for v in [1, 1, 2, 1, 1, 2, 1, 900, 1, 1]]
    assert queue_held(held) and not queue_held(bursty)
    assert not queue_held(held, held)  # the same hold in the baseline: nothing rose


def _replica_rows(replica: str, ttft_ms: list[float], start_s: float = 0.0) -> list[dict]:
    return [
        {
            "replica": replica,
            "timestamp": T0 + timedelta(seconds=start_s + i),
            "trace_id": f"{replica}{i}",
            "ttft_ns": int(v * MS),
            "e2e_ns": int(v * MS) + 100 * MS,
        }
        for i, v in enumerate(ttft_ms)
    ]


def test_a_replica_whose_first_requests_are_slower_than_its_steady_state_is_a_cold_start() -> None:
    rng = random.Random(1)
    slow_start = _replica_rows("b", [4000, 3500, 3000, 2500] + [rng.uniform(80, 120) for _ in range(30)])
    startup = ReplicaStartup("t", "engine", "b", T0 - timedelta(seconds=5), T0 - timedelta(seconds=1), 4.0)
    cold = cold_start_rows(slow_start, None, [startup])
    assert [r["trace_id"] for r in cold["b"]] == ["b0", "b1", "b2", "b3"]
    # A queue building up after readiness: the first requests are the fastest, not a cold start.
    queue_builds = _replica_rows("b", [80 + 40 * i for i in range(34)])
    assert cold_start_rows(queue_builds, None, [startup]) == {}
    # The same slow first requests from a replica that became ready 35 s before the window
    # and served the baseline after that: its first requests were there, not these.
    earlier = ReplicaStartup("t", "engine", "b", T0 - timedelta(seconds=40), T0 - timedelta(seconds=35), 5.0)
    assert [r["trace_id"] for r in cold_start_rows(slow_start, None, [earlier])["b"]] == ["b0", "b1", "b2", "b3"]
    served_before = _replica_rows("b", [100] * 20, start_s=-30)
    assert cold_start_rows(slow_start, served_before, [earlier]) == {}
    # A baseline that ended before the replica became ready (it restarted) leaves it starting.
    before_restart = _replica_rows("b", [100] * 10, start_s=-60)
    assert [r["trace_id"] for r in cold_start_rows(slow_start, before_restart, [earlier])["b"]] == [
        "b0",
        "b1",
        "b2",
        "b3",
    ]


def test_requests_that_arrived_before_their_replica_was_ready_are_charged_to_its_start() -> None:
    rows = _replica_rows("", [9000, 8000, 7000] + [100] * 30)  # vLLM sets no instance id
    startup = ReplicaStartup("t", "vllm", "", T0 - timedelta(seconds=30), T0 + timedelta(seconds=2.5), 32.5)
    assert [r["trace_id"] for r in cold_start_rows(rows, None, [startup])[""]] == ["0", "1", "2"]
    # A replica ready long before the window, its first requests fast: nothing to charge.
    early = ReplicaStartup("t", "vllm", "", T0 - timedelta(minutes=30), T0 - timedelta(minutes=29), 60.0)
    assert cold_start_rows(_replica_rows("", [100] * 33), None, [early]) == {}


def test_a_wall_that_queued_at_the_opening_holds_every_request_until_its_queue_is_gone() -> None:
    # A replica of 4 slots opens to a herd arriving over 1.4 s (a loaded host accepting it);
    # the first request ends 1.05 s after it began. From the fifth on the herd queues for a
    # slot, the last of it until 2.9 s; two later arrivals still find it queued, then the
    # traffic is steady and fast.
    def row(i: int, at_s: float, queue_s: float, ttft_s: float, e2e_s: float) -> dict:
        return {
            "replica": "",
            "trace_id": str(i),
            "timestamp": T0 + timedelta(seconds=at_s),
            "queue_ns": int(queue_s * 1e9),
            "ttft_ns": int(ttft_s * 1e9),
            "e2e_ns": int(e2e_s * 1e9),
        }

    herd = [row(i, 0.1 * i, 0.0, 0.05, 1.05) for i in range(4)]
    herd += [row(i, 0.1 * i, 0.3 + 0.1 * i, 0.35 + 0.1 * i, 1.4 + 0.1 * i) for i in range(4, 15)]
    drain = [row(15, 2.0, 0.8, 0.9, 1.9), row(16, 2.5, 0.4, 0.5, 1.5)]
    steady = [row(17 + i, 4.0 + 0.7 * i, 0.0, 0.05 + 0.01 * (i % 3), 0.9) for i in range(24)]
    startup = ReplicaStartup("t", "vllm", "", T0 - timedelta(seconds=30), T0 - timedelta(seconds=0.5), 29.5)
    rows = herd + drain + steady
    # Before the first request ended: 11 arrivals, 7 of them queued longer than it took.
    # The queue they formed lasted until 2.9 s: the two arrivals of the drain waited behind it.
    assert [r["trace_id"] for r in _held_at_opening(rows, "ttft_ns")] == [str(i) for i in range(4, 17)]
    assert [r["trace_id"] for r in cold_start_rows(rows, None, [startup])[""]] == [str(i) for i in range(4, 17)]
    # Slow first requests that never queued (slots to spare): the arrivals before the first
    # ended are the wall (11), the four after it the warm-up that followed.
    spare = [row(i, 0.1 * i, 0.0, 0.4 + 0.05 * i, 1.05) for i in range(15)] + steady
    assert [r["trace_id"] for r in cold_start_rows(spare, None, [startup])[""]] == [str(i) for i in range(15)]
    assert len(_held_at_opening(spare, "ttft_ns")) == 11


def test_diagnose_from_rows_alone_names_the_tokenizer(scenario_rows) -> None:
    current, baseline = scenario_rows("slow_tokenizer")
    verdict = diagnose_from(current, baseline)
    assert not verdict.healthy and verdict.measure == "ttft" and verdict.basis == "baseline"
    assert verdict.top_cause == "tokenization"
    assert verdict.causes[0].share > 0.8
    tokenize = next(e for e in verdict.causes[0].evidence if e.measure == "tokenize_ns")
    assert tokenize.baseline < 10 * MS and tokenize.current > 150 * MS
    assert tokenize.current_window == (current[0]["timestamp"], current[-1]["timestamp"])
    assert "before the request reaches the engine" in verdict.causes[0].would_not_help[0]


def test_healthy_without_a_baseline_and_insufficient_windows(scenario_rows) -> None:
    current, baseline = scenario_rows("healthy")
    verdict = diagnose_from(current)
    assert verdict.healthy and verdict.causes == [] and verdict.baseline is None
    assert verdict.summary.startswith("healthy") and all(r.met for r in verdict.objectives)
    with pytest.raises(InsufficientDataError, match="insufficient data: 5 requests") as refused:
        diagnose_from(current[:5], baseline)
    assert (refused.value.count, refused.value.needed) == (5, 20)
    thin_baseline = diagnose_from(current, baseline[:5])
    assert thin_baseline.healthy and "baseline ignored" in thin_baseline.notes[0]


def test_without_a_baseline_a_broken_objective_carries_its_budget() -> None:
    # The guidance's worked example: TTFT 900 ms against a 600 ms objective.
    rows = budget_rows(200, tokenize_ms=150, retrieval_ms=150, prefill_ms=560)
    verdict = diagnose_from(rows, objectives=DEFAULT_OBJECTIVES.with_limit("ttft", 0.6))
    assert not verdict.healthy and verdict.measure == "ttft" and verdict.basis == "objectives"
    assert "interactive TTFT p99" in verdict.summary and "over its 600 ms objective" in verdict.summary
    budget = verdict.budget
    assert budget is not None and budget.engine_fits
    assert {item.cause for item in budget.items} == {"tokenization", "retrieval"}
    assert 290 * MS <= budget.recoverable_ns <= 320 * MS
    assert "recover" not in budget.text() or "about" in budget.text()
    # The engine's own part (queue + prefill) is the largest share of the slow requests' time.
    assert verdict.top_cause == "gpu_compute"
    assert verdict.notes and "queue depth is not exported" in " ".join(verdict.notes)


def test_a_baseline_that_breaks_the_objectives_never_makes_the_window_healthy() -> None:
    slow = budget_rows(100, tokenize_ms=5, retrieval_ms=5, prefill_ms=1500)
    verdict = diagnose_from(slow, slow)  # unchanged, but both over the 1 s objective
    assert not verdict.healthy and verdict.baseline is not None and not verdict.baseline.meets_objectives
    assert verdict.basis == "objectives" and any("baseline itself breaks" in n for n in verdict.notes)


def test_advice_never_contradicts_itself_within_one_verdict(scenario_rows) -> None:
    for name in ("oversized_batch", "gpu_saturation", "kv_cache_pressure", "slow_tokenizer"):
        current, baseline = scenario_rows(name)
        signals = _signals(
            {"queue_depth": [3] * 10, "running_requests": [8] * 10},
            {"queue_depth": [0] * 10, "running_requests": [8] * 10},
        )
        data = verdict_to_dict(diagnose_from(current, baseline, signals))
        helps = " ".join(h for c in data["causes"] for h in c["would_help"]).lower()
        for cause in data["causes"]:
            for denial in cause["would_not_help"]:
                if denial.startswith("adding GPUs"):
                    assert "add replicas (or gpus)" not in helps, (name, denial)


def test_verdict_to_dict_is_json_ready(scenario_rows) -> None:
    current, baseline = scenario_rows("extra_network_hop")
    signals = _signals({"gpu_utilization_ratio": [0.21] * 10}, {"gpu_utilization_ratio": [0.2] * 10})
    verdict = diagnose_from(current, baseline, signals)
    data = json.loads(json.dumps(verdict_to_dict(verdict)))
    assert data["top_cause"] == "network_hop" and data["healthy"] is False
    cause = data["causes"][0]
    assert cause["cause"] == "network_hop"
    assert cause["would_not_help"][0].startswith("adding GPUs will not help")
    assert data["current_window"][0] == current[0]["timestamp"].isoformat()
    assert {d["measure"] for d in data["degradations"]} == {"ttft", "itl", "e2e"}
    assert data["baseline"]["meets_objectives"] is True and data["engine"]["bound"] is None
    assert {o["measure"] for o in data["objectives"]} == {"ttft", "itl"}
    assert all(0.0 <= c["share"] <= 1.0 for c in data["causes"])


def test_rows_with_only_a_client_measurement_get_a_verdict_not_a_refusal() -> None:
    # What OpenLLMetry or the GenAI instrumentations in a caller send: client spans, no server span.
    rng = random.Random(5)
    rows = []
    for i in range(40):
        ttft = int(rng.uniform(1.2, 2.5) * 1e9)
        rows.append(
            {
                "timestamp": T0 + timedelta(seconds=i),
                "trace_id": f"{i:032x}",
                "replica": "",
                "endpoint_class": "interactive",
                "ttft_ns": None,
                "e2e_ns": None,
                "client_ttft_ns": ttft,
                "client_e2e_ns": ttft + 300 * MS,
            }
        )
    verdict = diagnose_from(rows)
    assert not verdict.healthy and verdict.measure == "ttft"
    assert verdict.objectives[0].value_ns > 1e9 and verdict.objectives[0].requests == 40
    assert verdict.top_cause == "unexplained"
    assert any("queue depth is not exported" in note for note in verdict.notes)


def test_in_a_small_window_one_stalled_request_is_not_a_regression() -> None:
    base = [{"ttft_ns": (100 + i) * MS} for i in range(60)]
    one_stall = [{"ttft_ns": (100 + i) * MS} for i in range(59)] + [{"ttft_ns": 900 * MS}]
    assert degradation("ttft", one_stall, base).ratio > DEGRADED_RATIO
    assert not degradation("ttft", one_stall, base).degraded  # p99 is the stalled request
    slower = [{"ttft_ns": (300 + i) * MS} for i in range(60)]
    assert degradation("ttft", slower, base).degraded  # the whole tail moved
    # With 120 requests a p99 is two requests deep: two stalls at 900 ms are a regression.
    assert degradation("ttft", one_stall * 2, base * 2).degraded


def test_a_pool_is_full_when_one_more_average_sequence_does_not_fit() -> None:
    from inferpath.analysis.engine_state import kv_full_at

    assert kv_full_at(2) == pytest.approx(2 / 3) and kv_full_at(16) == 0.9 and kv_full_at(0) == 0.9
    # The demo's kv-pressure fault: two sequences hold 86% of a 160-block pool, no preemption yet.
    two_fill_it = _engine(queue=[3, 4, 5], running=[2, 2, 1], kv=[0.86, 0.85, 0.5])
    assert two_fill_it.bound == "memory" and two_fill_it.memory_bound_steps == 3
    assert cause_of("queue", _context(two_fill_it)) == "gpu_memory"
    # Sixteen sequences at 86%: there is room for a seventeenth.
    assert _engine(queue=[3, 4], running=[12, 13], kv=[0.86, 0.86]).memory_bound_steps == 0


def test_with_free_slots_a_pool_with_no_room_for_a_long_prompt_is_memory_bound() -> None:
    # The demo's kv-pressure fault as one full-suite run sampled it (160 blocks, prompts up to
    # ~2,000 tokens): one or two sequences hold 19-87 % of the pool while up to 9 requests wait.
    # By the average running sequence alone, 4 of the 6 waiting steps looked like a hold.
    state = _engine(
        queue=[0, 0, 0, 3, 9, 8, 7, 2, 1, 0],
        running=[2, 1, 0, 2, 1, 2, 1, 2, 1, 0],
        kv=[0.93, 0.86, 0.0, 0.39, 0.86, 0.66, 0.19, 0.63, 0.88, 0.0],
    )
    assert (state.waiting_steps, state.memory_bound_steps, state.held_steps) == (6, 6, 0)
    assert state.bound == "memory" and cause_of("queue", _context(state)) == "gpu_memory"
    # The same waits beside sequences that hold 1-2 % each: the pool had room, the queue was held.
    small = _engine(queue=[0, 3, 9, 8], running=[2, 2, 1, 2], kv=[0.03, 0.02, 0.01, 0.03], limit=8)
    assert small.bound == "held" and small.memory_bound_steps == 0


def test_the_rest_is_engine_time_only_where_the_ttft_is_the_engines_own() -> None:
    # vLLM's TTFT runs from its own arrival: the rest before its queue (input processing, the
    # step in flight) is the engine's, claimed as its queue time would be; behind a gateway
    # the rest is time no span covered.
    saturated = {"decode_slower": True}
    assert cause_of("rest", _context(IDLE, engine_only=True, **saturated)) == "gpu_compute"
    assert cause_of("rest", _context(MEMORY, engine_only=True)) == "gpu_memory"
    assert cause_of("rest", _context(IDLE, engine_only=False, **saturated)) == "unexplained"
    assert cause_of("rest", _context(IDLE, engine_only=True)) == "unexplained"  # nothing claims the queue
    advice = {rule.name: rule for rule in REGISTRY}["gpu_compute"]
    assert "holds no request back" in advice.would_not_help(_context(IDLE, **saturated))[0].text
    assert len(advice.would_help(_context(IDLE, **saturated))) == 1  # no batch limit to raise
    assert "wait for a free slot" in advice.would_not_help(_context(SLOTS))[0].text


def _hop_rows(hop_ms, queue_ms=lambda i: 20 + 20 * i, tokenize_ms=lambda i: 2, gap_s: float = 1.0) -> list[dict]:
    """100 requests ``gap_s`` apart behind a gateway (by default, the engine's queue grows to
    2 s); ``hop_ms(i)`` is the hop into the engine of request ``i``."""
    rows = []
    for i in range(100):
        stages = {
            "queue_ns": int(queue_ms(i) * MS),
            "prefill_ns": 30 * MS,
            "network_ns": int(hop_ms(i) * MS),
            "tokenize_ns": int(tokenize_ms(i) * MS),
        }
        ttft = sum(stages.values())
        rows.append(
            {
                "timestamp": T0 + timedelta(seconds=gap_s * i),
                "trace_id": f"{i:032x}",
                "replica": "r",
                "endpoint_class": "interactive",
                "ttft_ns": ttft,
                "e2e_ns": ttft + 400 * MS,
                "decode_ns": 400 * MS,
                **stages,
            }
        )
    return rows


def _shares(verdict) -> dict[str, float]:
    return {c.cause: round(c.share, 2) for c in verdict.causes}


def test_a_hop_into_a_held_engine_waited_at_its_door_and_the_wire_keeps_its_floor() -> None:
    saturated = SignalWindows(
        current=WindowSignals.from_values(
            {"queue_depth": [5, 20, 40], "running_requests": [4, 4, 4], "kv_cache_usage_ratio": [0.05] * 3}
        )
    )
    idle = SignalWindows(
        current=WindowSignals.from_values(
            {"queue_depth": [0, 0, 0], "running_requests": [1, 2, 1], "kv_cache_usage_ratio": [0.05] * 3}
        )
    )
    # vLLM's API server, starved beside a saturated engine: the tail's hop is 1.5 s, its p10 5 ms.
    door = _hop_rows(lambda i: 5 + 1500 * (i >= 80))
    verdict = diagnose_from(door, signals=saturated)
    assert verdict.top_cause == "gpu_compute" and "network_hop" not in _shares(verdict), _shares(verdict)
    assert "network" in verdict.causes[0].stages
    # The same hop into an engine that held nothing, behind a gateway doing no slow work, stays the hop's.
    door = _hop_rows(lambda i: 5 + 1500 * (i >= 80), queue_ms=lambda i: 5, tokenize_ms=lambda i: 0)
    verdict = diagnose_from(door, signals=idle)
    tail_ttft = sum(r["ttft_ns"] for r in door[90:]) / 10
    assert _shares(verdict).get("network_hop") == round(1505 * MS / tail_ttft, 2), (_shares(verdict), verdict.summary)
    # A gateway whose synchronous tokenizer (1 s on the same requests) blocks its event loop
    # takes them late: the hop's excess goes to the tokenizer, up to the tokenizer's own time.
    blocked = _hop_rows(
        lambda i: 5 + 1500 * (i >= 80), queue_ms=lambda i: 5, tokenize_ms=lambda i: 2 + 1000 * (i >= 80)
    )
    verdict = diagnose_from(blocked, signals=idle)
    tail = blocked[90:]
    tokenize, hop = (sum(r[c] for r in tail) for c in ("tokenize_ns", "network_ns"))
    total = sum(r["ttft_ns"] for r in tail)
    assert _shares(verdict)["tokenization"] == round(2 * tokenize / total, 2), _shares(verdict)
    assert _shares(verdict)["network_hop"] == round((hop - tokenize) / total, 2), _shares(verdict)
    # A wire every request pays (the demo's +250 ms proxy) keeps it beside a saturated engine.
    wire = _hop_rows(lambda i: 250 + (i % 7))
    verdict = diagnose_from(wire, signals=saturated)
    tail = wire[90:]
    hops = sorted(r["network_ns"] for r in wire)
    floor = hops[9] + 0.9 * (hops[10] - hops[9])  # the p10 of 100 values (type 7: rank 9.9)
    expected = sum(min(r["network_ns"], floor) for r in tail) / sum(r["ttft_ns"] for r in tail)
    assert abs(_shares(verdict)["network_hop"] - expected) <= 0.01 and expected > 0.1, _shares(verdict)


def _pool_waits(gap_s: float = 0.3, hold_s: float = 1.0, connections: int = 2) -> list[float]:
    """Seconds each of 100 requests ``gap_s`` apart waits for one of ``connections``, each
    held ``hold_s`` per call (first come, first served)."""
    free, waits = [0.0] * connections, []
    for i in range(100):
        arrival = gap_s * i
        start = max(arrival, min(free))
        free[free.index(min(free))] = start + hold_s
        waits.append(start - arrival)
    return waits


def test_a_hop_whose_waits_grew_with_the_backlog_is_a_queue_in_front_of_the_engine() -> None:
    idle = SignalWindows(
        current=WindowSignals.from_values(
            {"queue_depth": [0, 0, 0], "running_requests": [1, 2, 2], "kv_cache_usage_ratio": [0.05] * 3}
        )
    )
    # A pool of two connections, each held 1 s, for a request every 0.3 s: each waits for the
    # ones ahead of it (the demo gateway with a pool of 4 in front of a real vLLM: ρ 0.63).
    holds = [5 + 1000 * wait for wait in _pool_waits()]
    pooled = diagnose_from(_hop_rows(holds.__getitem__, lambda i: 5, gap_s=0.3), signals=idle)
    # (the hop's p10, its "wire", is a wait here too: it keeps the rest)
    assert pooled.top_cause == "queueing" and _shares(pooled)["queueing"] >= 0.85, _shares(pooled)
    queue = pooled.causes[0]
    assert "network" in queue.stages
    assert any(e.text.startswith("the calls waited in a queue before reaching the engine") for e in queue.evidence), (
        queue.evidence
    )
    # the engine's own queue is named as the engine's, beside the queue in front of it
    assert any(e.text.startswith("engine queue p99 5.0 ms") for e in queue.evidence), [e.text for e in queue.evidence]
    assert any("adding GPUs will not help" in a for a in queue.would_not_help), queue.would_not_help
    assert pooled.budget is not None and pooled.budget.items[0].action.startswith(
        "raise the limit in front of the engine"
    ), pooled.budget.text()
    # The same hop times in random order (a proxy whose hold comes and goes, not a backlog)
    # stay the hop's.
    random.Random(7).shuffle(holds)
    jitter = diagnose_from(_hop_rows(holds.__getitem__, lambda i: 5, gap_s=0.3), signals=idle)
    assert jitter.top_cause == "network_hop" and "queueing" not in _shares(jitter), _shares(jitter)


def test_a_stream_read_late_in_one_lump_points_at_the_callers_side() -> None:
    idle = SignalWindows(
        current=WindowSignals.from_values(
            {"queue_depth": [0, 0, 0], "running_requests": [1, 2, 1], "kv_cache_usage_ratio": [0.05] * 3}
        )
    )

    def lumped(rows: list[dict], wire_ms: float = 0.0) -> list[dict]:
        # The caller measured its own first and last token: in the slowest ten, both came
        # 2 ms apart although the engine decoded for 400 ms (a CPU-starved client).
        for i, row in enumerate(rows):
            row["network_ns"] += int(wire_ms * MS)
            row["ttft_ns"] += int(wire_ms * MS)
            row["client_ttft_ns"] = row["ttft_ns"]
            row["client_e2e_ns"] = row["ttft_ns"] + (2 * MS if i >= 90 else row["decode_ns"])
            row["e2e_ns"] = row["client_e2e_ns"]
        return rows

    def hop_advice(rows: list[dict]) -> tuple[list[str], list[str]]:
        verdict = diagnose_from(rows, signals=idle)
        assert verdict.top_cause == "network_hop", _shares(verdict)
        cause = verdict.causes[0]
        return cause.would_help, [e.text for e in cause.evidence]

    late = lumped(_hop_rows(lambda i: 5 + 1500 * (i >= 90), queue_ms=lambda i: 5, tokenize_ms=lambda i: 0))
    helps, evidence = hop_advice(late)
    assert "read late, in one lump" in helps[0], helps
    assert any(t.startswith("in 10 of the 10 slowest streamed requests") for t in evidence), evidence
    assert any(t.startswith("network p10 5.0 ms") for t in evidence), evidence
    # A wire every request pays (a 1 s proxy) keeps the hop's own advice first.
    helps, _ = hop_advice(
        lumped(_hop_rows(lambda i: 5 + 1500 * (i >= 90), queue_ms=lambda i: 5, tokenize_ms=lambda i: 0), wire_ms=1000)
    )
    assert "remove the extra hop" in helps[0] and "read late, in one lump" in helps[1], helps
    # Streams that flowed (first to last token as long as the engine's decode) say nothing of it.
    flowing = _hop_rows(lambda i: 5 + 1500 * (i >= 90), queue_ms=lambda i: 5, tokenize_ms=lambda i: 0)
    for row in flowing:
        row["client_ttft_ns"], row["client_e2e_ns"] = row["ttft_ns"], row["e2e_ns"]
    helps, evidence = hop_advice(flowing)
    assert not any("lump" in h for h in helps), helps
    assert any(t.startswith("in 0 of the 10 slowest streamed requests") for t in evidence), evidence


def test_a_queue_on_the_way_to_the_engine_is_told_from_a_late_read_by_the_hops_trip_out() -> None:
    idle = SignalWindows(
        current=WindowSignals.from_values(
            {"queue_depth": [0, 0, 0], "running_requests": [1, 2, 2], "kv_cache_usage_ratio": [0.05] * 3}
        )
    )
    waits = _pool_waits()
    hops = [5 + 1000 * wait for wait in waits]

    def rows(send_ms, gateway: bool, lumped: bool = True, hop=hops.__getitem__) -> list[dict]:
        # The caller read the slowest ten streams late, in one lump (the pool burst recorded on
        # real vLLM: 15 of its 30 slowest streams, while the calls waited 48 s for a connection).
        out = _hop_rows(hop, lambda i: 5, gap_s=0.3)
        slowest = set(sorted(range(100), key=lambda i: out[i]["ttft_ns"])[90:])
        for i, row in enumerate(out):
            row["engine_send_ns"] = None if send_ms is None else int(send_ms(i) * MS)
            row["gateway_ns"] = MS if gateway else None
            row["client_ttft_ns"] = row["ttft_ns"]
            late = lumped and i in slowest
            row["client_e2e_ns"] = row["ttft_ns"] + (2 * MS if late else row["decode_ns"])
        return out

    # Behind a gateway the waits before the engine's span are the gateway's (its connection
    # pool): the caller's late reads are its own hop's.
    pooled = diagnose_from(rows(hops.__getitem__, gateway=True), signals=idle)
    assert pooled.top_cause == "queueing" and _shares(pooled)["queueing"] >= 0.85, _shares(pooled)
    assert any("from the caller's send to the engine's span" in e.text for e in pooled.causes[0].evidence)
    # A caller that calls the engine itself and reads late sends late too: its own side.
    own = diagnose_from(rows(hops.__getitem__, gateway=False), signals=idle)
    assert own.top_cause == "network_hop" and "queueing" not in _shares(own), _shares(own)
    assert any("read late, in one lump" in h for h in own.causes[0].would_help), own.causes[0].would_help
    # The same hop times spent on the way back (each call reached the engine at once, the first
    # token came back late): no queue in front of the engine, whatever the hop's shape.
    back = diagnose_from(rows(lambda i: 5, gateway=True), signals=idle)
    assert back.top_cause == "network_hop" and "queueing" not in _shares(back), _shares(back)
    # Only the trip out's waits go to the queue; the rest of the hop stays the hop's.
    half = diagnose_from(rows(lambda i: 5 + hops[i] / 2, gateway=True), signals=idle)
    shares = _shares(half)
    assert half.top_cause in ("queueing", "network_hop") and 0.3 <= shares["queueing"] <= 0.6, shares
    assert shares["network_hop"] >= 0.3, shares
    # Without the trip out (rows stored before it), the whole network stage is read, the
    # caller's own hop with it: its late reads keep the hop's time, gateway or not.
    unknown = diagnose_from(rows(None, gateway=True), signals=idle)
    assert unknown.top_cause == "network_hop" and "queueing" not in _shares(unknown), _shares(unknown)
    # A window reaching back before the column (the trip out on half its rows) reads the
    # whole hop too, and a pool read promptly is still a queue.
    mixed = rows(hops.__getitem__, gateway=True, lumped=False)
    for row in mixed[:50]:
        row["engine_send_ns"] = None
    verdict = diagnose_from(mixed, signals=idle)
    assert verdict.top_cause == "queueing" and _shares(verdict)["queueing"] >= 0.85, _shares(verdict)
    # Against a healthy baseline whose calls waited as long on the way out (a small queue, up to
    # 450 ms), a slower way back (+1.5 s on twenty) is no queue in front of the engine: the trip
    # out did not grow (the queue took the current window's own waits, a fifth of the growth).
    small = [5 + 50 * (i % 10) for i in range(100)]
    baseline = rows(small.__getitem__, gateway=True, lumped=False, hop=small.__getitem__)
    current = rows(small.__getitem__, gateway=True, lumped=False, hop=lambda i: small[i] + 1500 * (i >= 80))
    grew_back = diagnose_from(current, baseline, signals=SignalWindows(current=idle.current, baseline=idle.current))
    assert grew_back.basis == "baseline" and grew_back.top_cause == "network_hop", _shares(grew_back)
    assert "queueing" not in _shares(grew_back), _shares(grew_back)


def test_a_verdict_on_a_tail_without_stages_before_the_engine_says_its_ttft_is_the_engines() -> None:
    # vLLM's spans alone: queue, prefill, decode, no hop.
    alone = diagnose_from(_hop_rows(lambda i: 0, tokenize_ms=lambda i: 0))
    assert any(n.startswith("the TTFT and E2E judged here are the engine's own") for n in alone.notes), alone.notes
    # A hop measured on most requests (the client's spans): the TTFT is the client's, even where
    # the hop's time went to a queue in front of the engine.
    waits = _pool_waits()
    hopped = _hop_rows(lambda i: 0 if i < 15 else 5 + 1000 * waits[i], lambda i: 5, tokenize_ms=lambda i: 0, gap_s=0.3)
    verdict = diagnose_from(hopped)
    assert not any(n.startswith("the TTFT and E2E judged here") for n in verdict.notes), verdict.notes


def test_failed_requests_are_counted_and_five_percent_of_them_is_not_healthy() -> None:
    rows = _hop_rows(lambda i: 2, queue_ms=lambda i: 5, tokenize_ms=lambda i: 0)  # 100 fast requests
    verdict = diagnose_from(rows, failed={"error (HTTP 502)": 4})
    assert verdict.healthy, verdict.summary  # 4 of 104: under 5 %
    assert verdict.notes[0].startswith("4 of 104 requests in the window failed: 4 error (HTTP 502)"), verdict.notes
    verdict = diagnose_from(rows, failed={"error (HTTP 502)": 5, "incomplete": 1})
    assert not verdict.healthy and verdict.causes == [], verdict.summary
    assert verdict.summary.startswith("degraded: 6% of requests failed: 5 error (HTTP 502), 1 incomplete")
    with pytest.raises(InsufficientDataError, match=r"\(5 more failed: 5 error \(HTTP 502\)\)"):
        diagnose_from(rows[:10], failed={"error (HTTP 502)": 5})
    # An outage: too few succeeded to judge their latency, but the window failed.
    verdict = diagnose_from(rows[:10], failed={"error (HTTP 503)": 80})
    assert not verdict.healthy and verdict.failed_share == pytest.approx(80 / 90), verdict.summary
    assert verdict.summary == (
        "degraded: 89% of requests failed: 80 error (HTTP 503); 10 succeeded, too few to judge their latency"
    )
    verdict = diagnose_from([], failed={"error (HTTP 503)": 30})
    assert not verdict.healthy and verdict.failed_share == 1.0 and verdict.causes == [], verdict.summary


def test_the_budget_moves_a_doors_wait_with_the_stage_that_kept_the_door_busy() -> None:
    idle = SignalWindows(
        current=WindowSignals.from_values(
            {"queue_depth": [0, 0, 0], "running_requests": [1, 2, 1], "kv_cache_usage_ratio": [0.05] * 3}
        )
    )
    # A synchronous tokenizer (1 s on the slowest) blocks the gateway's event loop, which then
    # takes those requests 1.5 s late: the hop's excess is the tokenizer's (the causes say so),
    # and so is what moving the tokenizer off the loop recovers (the budget must agree).
    blocked = _hop_rows(
        lambda i: 5 + 1500 * (i >= 80), queue_ms=lambda i: 5, tokenize_ms=lambda i: 2 + 1000 * (i >= 80)
    )
    verdict = diagnose_from(blocked, signals=idle)
    assert verdict.top_cause == "tokenization" and verdict.budget is not None, verdict.summary
    items = {item.cause: item.recoverable_ns for item in verdict.budget.items}
    tail = blocked[90:]
    tokenize, hop = (sum(r[c] for r in tail) / len(tail) for c in ("tokenize_ns", "network_ns"))
    assert set(items) == set(_shares(verdict)) - {"unexplained"}, (items, _shares(verdict))
    assert items["tokenization"] == pytest.approx(2 * tokenize, rel=0.01), items
    assert items.get("network_hop", 0.0) == pytest.approx(hop - tokenize, rel=0.01), items


def test_a_median_that_rose_by_half_and_50_ms_is_a_regression_though_the_p99_did_not() -> None:
    # A slow tokenizer on every request: p50 0.35 → 1.06 s while the p99, already high from a
    # busy machine's outliers, went 2.4 → 3.0 s (1.25×).
    base = [{"ttft_ns": 350 * MS}] * 95 + [{"ttft_ns": 2400 * MS}] * 5
    slow = [{"ttft_ns": 1060 * MS}] * 95 + [{"ttft_ns": 3000 * MS}] * 5
    found = degradation("ttft", slow, base)
    assert found.degraded and found.by == "p50" and found.ratio < DEGRADED_RATIO, found
    assert (found.baseline_p50_ns, found.current_p50_ns) == (350 * MS, 1060 * MS)
    # A median up by half but by 20 ms only (30 → 50 ms: more load, the same service) is not one.
    quick = [{"ttft_ns": 30 * MS}] * 95 + [{"ttft_ns": 900 * MS}] * 5
    busier = [{"ttft_ns": 50 * MS}] * 95 + [{"ttft_ns": 950 * MS}] * 5
    assert not degradation("ttft", busier, quick).degraded
    verdict = diagnose_from(
        [{**r, "timestamp": T0 + timedelta(seconds=i), "e2e_ns": r["ttft_ns"] + 400 * MS} for i, r in enumerate(slow)],
        [{**r, "timestamp": T0 + timedelta(seconds=i), "e2e_ns": r["ttft_ns"] + 400 * MS} for i, r in enumerate(base)],
        objectives=DEFAULT_OBJECTIVES.with_limit("ttft", 10.0),
    )
    assert not verdict.healthy and "TTFT p50 350 ms → 1060 ms (3.0× the baseline)" in verdict.summary, verdict.summary


def test_requests_that_failed_on_a_replica_still_loading_are_its_cold_start() -> None:
    # A gateway in front of a vLLM that is loading for 50 s: its calls fail at once (500),
    # then the engine is ready and every later request is fast.
    ready = T0 + timedelta(seconds=50)
    startup = ReplicaStartup("t", "vllm", "", T0 - timedelta(seconds=5), ready, 55.0)
    fast = _replica_rows("", [100] * 60, start_s=55.0)
    failed_times = [T0 + timedelta(seconds=i) for i in range(50)]
    verdict = diagnose_from(fast, failed={"error (HTTP 500)": 50}, failed_times=failed_times, startups=[startup])
    assert not verdict.healthy and verdict.top_cause == "cold_start", verdict.summary
    cause = verdict.causes[0]
    assert cause.share == 1.0 and cause.would_help and "keep warm replicas" in cause.would_help[0]
    assert any(
        "50 of the 50 failed requests arrived before a starting replica was ready" in e.text for e in cause.evidence
    )
    assert verdict.summary.endswith("top cause: cold_start (100% of the failed requests)"), verdict.summary
    # The same failures long after the replica was ready are not its start's.
    later = [ready + timedelta(seconds=10 + i) for i in range(50)]
    verdict = diagnose_from(fast, failed={"error (HTTP 500)": 50}, failed_times=later, startups=[startup])
    assert not verdict.healthy and verdict.causes == [], verdict.summary
    # Slow successful requests of another cause beside them: the failures lead, and the other
    # cause keeps its share of the slow requests' time.
    slow = [{**r, "timestamp": r["timestamp"] + timedelta(seconds=55)} for r in budget_rows(200, 900, 5, 40)]
    verdict = diagnose_from(slow, failed={"error (HTTP 503)": 50}, failed_times=failed_times, startups=[startup])
    assert [c.cause for c in verdict.causes] == ["cold_start", "tokenization"], verdict.summary
    assert "top cause: cold_start (100% of the failed requests); 20% of requests failed: 50 error" in verdict.summary
    assert verdict.budget is not None and verdict.budget.items[0].cause == "tokenization"


def test_the_budget_charges_requests_on_a_starting_replica_to_its_start_not_to_their_stages() -> None:
    # Requests that reached a gateway while its vLLM was loading waited out the start in their
    # hop (a caller retrying): the causes charge them to the cold start whole, and the budget
    # must not offer to co-locate the gateway for that time.
    ready = T0 + timedelta(seconds=20)
    startup = ReplicaStartup("t", "vllm", "", T0 - timedelta(seconds=5), ready, 25.0)
    waited = [
        {**r, "network_ns": r["ttft_ns"] - 50 * MS, "network_ttft_ns": r["ttft_ns"] - 50 * MS, "prefill_ns": 40 * MS}
        for r in _replica_rows("", [20000 - 1000 * i for i in range(20)])
    ]
    fast = [{**r, "prefill_ns": 40 * MS} for r in _replica_rows("", [100] * 180, start_s=21.0)]
    verdict = diagnose_from(waited + fast, startups=[startup])
    assert not verdict.healthy and verdict.top_cause == "cold_start", verdict.summary
    assert verdict.budget is not None, verdict.summary
    assert [item.cause for item in verdict.budget.items] == ["cold_start"], verdict.budget.text()
    assert verdict.budget.text().split(": ")[1].startswith("route to a replica only once it is ready")


def test_a_full_batch_with_kv_room_is_told_to_raise_its_limit_before_adding_replicas() -> None:
    from inferpath.analysis.causes import REGISTRY

    compute = next(rule for rule in REGISTRY if rule.name == "gpu_compute")
    # vLLM at --max-num-seqs 4 under overload, KV at 6 %: a larger batch first.
    roomy = compute.would_help(Context(engine=SLOTS))
    assert [a.action for a in roomy] == ["raise_batch_limit", "add_capacity"]
    assert "max-num-seqs" in roomy[0].text and "at or below 10%" in roomy[0].text
    # The same with the GPU busy, or with the KV cache short (a configured limit reached
    # while preempting): capacity first.
    busy = compute.would_help(Context(engine=SLOTS, gpu_utilization=0.97))
    preempting = _engine([5, 5], [8, 8], [0.5, 0.5], preemptions=3, limit=8)
    assert preempting.bound == "slots" and preempting.memory_pressure
    full = compute.would_help(Context(engine=preempting))
    assert [a.action for a in busy] == [a.action for a in full] == ["add_capacity", "raise_batch_limit"]
    # Not held by the slots: capacity alone.
    assert [a.action for a in compute.would_help(Context(engine=HELD))] == ["add_capacity"]
