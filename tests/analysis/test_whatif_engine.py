"""The what-if's fast engine against the scheduler it shortcuts.

:func:`inferpath.analysis.whatif_engine.run_engine` skips runs of identical decode steps and
counts KV blocks per residue; :class:`ContinuousBatcher` with ``chunked_prefill=True`` plans
every step and touches every sequence. Driven with the same step-time law on the same
requests, both must give every request the same schedule, first token, finish and
preemption count.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from inferpath.analysis.continuous_batching import ContinuousBatcher, RequestMetrics, Sequence
from inferpath.analysis.whatif_engine import run_engine


@dataclass
class Config:
    num_kv_blocks: int
    block_size_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    batch_window_seconds: float = 0.0


def step_seconds(num_seqs: int, prefill_tokens: int) -> float:
    return 0.008 + 0.0009 * num_seqs + 0.00004 * prefill_tokens


def reference(arrivals, prompts, outputs, config: Config):
    """Every step planned by the scheduler, one after the other, on a virtual clock."""
    batcher = ContinuousBatcher(config, chunked_prefill=True)
    metrics: list[RequestMetrics | None] = [None] * len(arrivals)
    now, nxt, step, step_end = 0.0, 0, None, math.inf
    while True:
        arrival = arrivals[nxt] if nxt < len(arrivals) else math.inf
        wake = math.inf
        if step is None and batcher.waiting:
            hold = batcher.batch_window_wait_seconds(now)
            wake = now + hold if hold > 0 else math.inf
        event = min(step_end, wake)
        if arrival == math.inf and event == math.inf:
            break
        if arrival <= event:
            now = arrival
            if batcher.fits(prompts[nxt], outputs[nxt]):
                metrics[nxt] = RequestMetrics(str(nxt), prompts[nxt], outputs[nxt], now, 0)
                batcher.add(Sequence(metrics[nxt]))
            nxt += 1
            if step is not None:
                continue
        else:
            now = event
            if step is not None:
                batcher.finish_step(step, now)
        step = batcher.plan_step(now)
        step_end = now + step_seconds(len(step.sequences), step.prefill_tokens) if step else math.inf
    return metrics


def _trace(seed: int, n: int, rate: float, prompt_max: int, output_max: int):
    rng = random.Random(seed)
    t, arrivals = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        arrivals.append(t)
    return arrivals, [rng.randint(1, prompt_max) for _ in range(n)], [rng.randint(1, output_max) for _ in range(n)]


CASES = {
    # name: (trace seed, requests, rate/s, prompt max, output max, config)
    "light": (1, 300, 3.0, 300, 150, Config(4096, 16, 64, 2048)),
    "slot_bound": (2, 300, 6.0, 300, 180, Config(2048, 32, 4, 2048)),
    "kv_bound": (3, 300, 5.0, 300, 180, Config(48, 32, 64, 2048)),
    "chunked": (4, 200, 4.0, 400, 60, Config(512, 16, 8, 96)),
    "window": (5, 200, 8.0, 200, 40, Config(1024, 16, 16, 2048, batch_window_seconds=0.05)),
    "tight_and_rejecting": (6, 200, 6.0, 500, 200, Config(20, 32, 16, 256)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fast_engine_schedules_as_the_scheduler_does(case: str) -> None:
    seed, n, rate, prompt_max, output_max, config = CASES[case]
    arrivals, prompts, outputs = _trace(seed, n, rate, prompt_max, output_max)
    expected = reference(arrivals, prompts, outputs, config)
    run = run_engine(arrivals, prompts, outputs, config, step_seconds)
    for i, m in enumerate(expected):
        if m is None:
            assert run.rejected[i], i
            continue
        assert not run.rejected[i]
        assert run.preemptions[i] == m.num_preemptions, i
        for got, want in (
            (run.first_scheduled_s[i], m.first_scheduled_s),
            (run.first_token_s[i], m.first_token_s),
            (run.finished_s[i], m.finished_s),
        ):
            assert got == pytest.approx(want, abs=1e-6), (i, got, want)
    # the case exercises what it is named for
    preemptions = sum(run.preemptions)
    if case in ("kv_bound", "tight_and_rejecting"):
        assert preemptions > 20
    if case == "tight_and_rejecting":
        assert any(run.rejected)
    if case == "slot_bound":
        assert max(m.queue_seconds for m in expected if m) > 5.0 and preemptions == 0
