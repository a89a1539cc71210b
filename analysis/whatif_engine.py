"""The what-if's engine: vLLM V1's chunked-prefill scheduling on a virtual clock, fast.

The policy is :class:`inferpath.analysis.continuous_batching.ContinuousBatcher` with
``chunked_prefill=True`` (its module docstring says what a step does); this module runs the
same policy without touching every running sequence at every step, so that an hour of
traffic replays in seconds. ``tests/analysis/test_whatif_engine.py`` checks that both give
the same per-request times on traces with and without KV pressure, chunked prompts, slot
limits and a batching window.

How it avoids the per-token work:

- A decoding sequence computes one token per step, so its progress is a function of the
  step counter: admitted or resumed at step ``k0`` with ``c0`` tokens computed and ``g0``
  emitted, at step ``k`` it has ``c0 + k - k0 - 1`` computed. It finishes at a known step,
  kept in a heap, and it needs a new KV block exactly when its computed tokens are a multiple
  of the block size, i.e. at the steps ``k ≡ k0 + 1 - c0 (mod block size)``: decoders are
  counted per residue, so the blocks a step takes are one lookup.
- Steps that only decode (no prompt tokens, nothing admitted, nothing preempted) repeat
  unchanged until a sequence finishes, the free blocks run short, an arrival could be
  admitted or a batching window ends; the run of identical steps is taken at once.
- Only a step that preempts walks the running sequences one by one, in vLLM's order.

Times are seconds on the virtual clock; the step time is the driver's
``step_seconds(num_seqs, prefill_tokens)``.
"""

from __future__ import annotations

import collections
import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from itertools import accumulate
from math import ceil

from inferpath.analysis.continuous_batching import BatchingConfig


@dataclass
class EngineSettings:
    """The configuration of each simulated engine, read by the scheduler at every step."""

    num_kv_blocks: int
    block_size_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    batch_window_seconds: float = 0.0


StepSeconds = Callable[[int, int], float]


@dataclass
class EngineRun:
    """What one engine did with its requests (lists in the order of the input):
    ``first_scheduled_s``, ``first_token_s``, ``finished_s`` (``None`` when it never got
    there: rejected, or still running at the horizon), ``preemptions`` per request,
    ``rejected`` (never fits the pool), ``steps`` run, KV usage as a ratio of the pool
    (time-weighted mean from the first arrival to the end of the last step, as the observed
    mean is taken over the scrapes of the same span, and maximum), ``busy_seconds``
    (time spent in steps), ``end_s`` (the end of the last step), ``prefill_tokens`` (prompt
    and recompute tokens computed) and ``max_batch`` (most sequences in one step)."""

    first_scheduled_s: list[float | None]
    first_token_s: list[float | None]
    finished_s: list[float | None]
    preemptions: list[int]
    rejected: list[bool]
    steps: int
    kv_usage_mean_ratio: float
    kv_usage_max_ratio: float
    busy_seconds: float
    end_s: float
    prefill_tokens: int = 0
    max_batch: int = 0


class _Seq:
    __slots__ = (
        "i",
        "prompt",
        "max_tokens",
        "cached",
        "generated",
        "computed",
        "blocks",
        "order",
        "k0",
        "c0",
        "g0",
        "decoding",
        "epoch",
    )

    def __init__(self, i: int, prompt: int, max_tokens: int, cached: int = 0) -> None:
        self.i, self.prompt, self.max_tokens, self.cached = i, prompt, max_tokens, cached
        self.generated = self.computed = self.blocks = 0
        self.order = self.k0 = self.c0 = self.g0 = 0
        self.decoding = False
        self.epoch = 0


def run_engine(
    arrivals_s: Sequence[float],
    prompt_tokens: Sequence[int],
    max_tokens: Sequence[int],
    config: BatchingConfig,
    step_seconds: StepSeconds,
    *,
    horizon_s: float = math.inf,
    cached_tokens: Sequence[int] | None = None,
) -> EngineRun:
    """Run one engine of ``config`` over requests arriving at ``arrivals_s`` (seconds,
    ascending) with their prompt and output lengths (tokens), stepping with
    ``step_seconds(num_seqs, prefill_tokens)``; the clock stops at the first step boundary
    after ``horizon_s``. ``cached_tokens``: of each prompt, the tokens found in the prefix
    cache, not computed at admission (nor at a readmission after preemption: the prefix is
    still cached); their KV blocks are still taken. A request whose prompt and output can
    never fit the pool is rejected at arrival. Raises ``ValueError`` when arrivals are not in
    order."""
    n = len(arrivals_s)
    bs = config.block_size_tokens
    pool = config.num_kv_blocks
    max_seqs = config.max_num_seqs
    budget_full = max(config.max_num_batched_tokens, max_seqs)  # vLLM requires budget >= max_num_seqs
    window = config.batch_window_seconds
    first_sched: list[float | None] = [None] * n
    first_tok: list[float | None] = [None] * n
    finished: list[float | None] = [None] * n
    preempts = [0] * n
    rejected = [False] * n

    def blocks_for(tokens: int) -> int:
        return -(-tokens // bs)

    waiting: collections.deque[_Seq] = collections.deque()
    running: dict[int, _Seq] = {}  # admission order -> sequence, oldest first
    prefilling: list[_Seq] = []  # running sequences with prompt (or recompute) tokens still to compute
    per_residue = [0] * bs  # decoders needing a block at steps k with k % bs == residue
    decoders = 0
    finish_heap: list[tuple[int, int, int, _Seq]] = []  # (finish step, order, epoch, seq)
    free = pool
    order_counter = 0
    k = 0
    t = 0.0
    nxt = 0
    steps = 0
    kv_area = 0.0
    kv_max = 0
    busy = 0.0
    prev_arrival = -math.inf
    preempts_total = 0
    last_end = 0.0
    prefill_total = 0
    max_batch = 0

    def residue(seq: _Seq) -> int:
        return (seq.k0 + 1 - seq.c0) % bs

    def decoder_computed(seq: _Seq, step: int) -> int:
        return seq.c0 + step - seq.k0 - 1

    def preempt(seq: _Seq, step: int) -> None:
        nonlocal free, decoders, preempts_total
        del running[seq.order]
        if seq.decoding:
            computed = decoder_computed(seq, step)
            free += blocks_for(computed)
            seq.generated = seq.g0 + step - seq.k0 - 1
            per_residue[residue(seq)] -= 1
            decoders -= 1
            seq.decoding = False
            seq.epoch += 1  # its finish-heap entry is stale now
        else:
            free += seq.blocks
            prefilling.remove(seq)
        seq.blocks = seq.computed = 0
        preempts[seq.i] += 1
        preempts_total += 1
        waiting.appendleft(seq)

    while True:
        while nxt < n and arrivals_s[nxt] <= t:
            at = arrivals_s[nxt]
            if at < prev_arrival:
                raise ValueError(f"arrivals must be in ascending order (request {nxt})")
            prev_arrival = at
            if blocks_for(prompt_tokens[nxt] + max_tokens[nxt]) > pool:
                rejected[nxt] = True
            else:
                waiting.append(
                    _Seq(nxt, prompt_tokens[nxt], max_tokens[nxt], cached_tokens[nxt] if cached_tokens else 0)
                )
            nxt += 1
        if t > horizon_s:
            break
        if not running and not waiting:
            if nxt >= n:
                break
            t = arrivals_s[nxt]
            continue

        # --- 1. the running sequences, oldest first -----------------------------------
        budget = budget_full - decoders
        crossing = per_residue[k % bs]
        scheduled_prefill: list[tuple[_Seq, int]] = []
        preempted_before = preempts_total
        part = prefilling[0] if prefilling else None  # at most one, the newest running sequence
        part_n = part_need = 0
        if part is not None:
            part_n = min(part.prompt + part.generated - part.computed, budget)
            part_need = blocks_for(part.computed + part_n) - part.blocks if part_n > 0 else 0
        if crossing + part_need > free:
            # vLLM walks the running sequences oldest first and, when one lacks a block,
            # preempts the newest until it fits or it was the one preempted: the newest go,
            # as few as make the needs of those left fit the free blocks.
            need = crossing + part_need
            while need > free:
                victim = running[next(reversed(running))]
                if victim is part:
                    need -= part_need
                    part = None
                elif decoder_computed(victim, k) % bs == 0:
                    need -= 1  # it would have taken a block this step
                preempt(victim, k)
            crossing = need - (part_need if part is not None else 0)
        free -= crossing
        prefill_tokens = 0
        if part is not None and part_n > 0:
            free -= part_need
            part.blocks += part_need
            scheduled_prefill.append((part, part_n))
            prefill_tokens = part_n
            budget -= part_n

        # --- 2. admissions, unless this step preempted ----------------------------------
        preempted = preempts_total != preempted_before
        admitted = False
        held = window > 0 and waiting and len(waiting) < max_seqs and arrivals_s[waiting[0].i] + window > t
        if not preempted and not held:
            while waiting and budget > 0 and len(running) < max_seqs:
                seq = waiting[0]
                length = seq.prompt + seq.generated
                if -(-length // bs) > free:
                    break
                waiting.popleft()
                rest = length - seq.cached
                n_new = rest if rest < budget else budget
                need = -(-(seq.cached + n_new) // bs)
                free -= need
                order_counter += 1
                seq.order, seq.blocks, seq.computed = order_counter, need, seq.cached
                running[seq.order] = seq
                prefilling.append(seq)
                if first_sched[seq.i] is None:
                    first_sched[seq.i] = t
                scheduled_prefill.append((seq, n_new))
                prefill_tokens += n_new
                budget -= n_new
                admitted = True

        num_seqs = decoders + len(scheduled_prefill)
        if num_seqs == 0:
            # Nothing can run: the window holds the head, or the head cannot fit an empty
            # engine (only if the pool shrank below it). Wait for the window or an arrival.
            wake = arrivals_s[nxt] if nxt < n else math.inf
            if held:
                wake = min(wake, arrivals_s[waiting[0].i] + window)
            if wake == math.inf:
                break
            t = max(wake, t)
            continue
        d = step_seconds(num_seqs, prefill_tokens)

        # --- 3. identical decode-only steps run at once ----------------------------------
        m = 1
        if not scheduled_prefill and not preempted and not admitted:
            limit = math.inf
            while finish_heap and finish_heap[0][2] != finish_heap[0][3].epoch:
                heappop(finish_heap)
            if finish_heap:
                limit = finish_heap[0][0] - k + 1
            if d > 0 and nxt < n and (not waiting or held):
                # an arrival may be admitted at the first boundary at or after it
                limit = min(limit, max(1, ceil((arrivals_s[nxt] - t) / d)))
            if held and d > 0:
                limit = min(limit, max(1, ceil((arrivals_s[waiting[0].i] + window - t) / d)))
            if horizon_s < math.inf and d > 0:
                limit = min(limit, max(1, ceil((horizon_s - t) / d) + 1))
            if limit > 1 and decoders:
                # Free blocks must cover the crossings of steps k+1 .. k+m-1: whole cycles of
                # bs steps take one block per decoder, then the residues in step order.
                r0 = (k + 1) % bs
                cumulative = list(accumulate(per_residue[r0:] + per_residue[:r0]))
                cycles = free // decoders
                limit = min(limit, 1 + cycles * bs + bisect_right(cumulative, free - cycles * decoders))
            if 1 < limit < math.inf:
                m = int(limit)
                extra = m - 1
                r0 = (k + 1) % bs
                rest = extra % bs
                taken = (extra // bs) * decoders + (
                    sum(per_residue[r0 : r0 + rest])
                    if r0 + rest <= bs
                    else sum(per_residue[r0:]) + sum(per_residue[: r0 + rest - bs])
                )
                free -= taken
        used = pool - free
        kv_area += used * d * m
        kv_max = max(kv_max, used)
        t_end = t + d * m
        last_end = t_end
        busy += d * m
        steps += m
        prefill_total += prefill_tokens
        if num_seqs > max_batch:
            max_batch = num_seqs
        last = k + m - 1

        # --- 4. end of the last step: tokens, finishes -----------------------------------
        for seq, n_new in scheduled_prefill:
            if seq.order not in running:
                continue
            seq.computed += n_new
            length = seq.prompt + seq.generated
            if seq.computed < length:
                continue  # a chunk of a longer prompt
            prefilling.remove(seq)
            seq.generated += 1
            if first_tok[seq.i] is None:
                first_tok[seq.i] = t_end
            if seq.generated >= seq.max_tokens:
                finished[seq.i] = t_end
                free += seq.blocks
                del running[seq.order]
                continue
            seq.decoding = True
            seq.k0, seq.c0, seq.g0 = last, seq.computed, seq.generated
            per_residue[(last + 1 - seq.c0) % bs] += 1
            decoders += 1
            heappush(finish_heap, (last + seq.max_tokens - seq.g0, seq.order, seq.epoch, seq))
        while finish_heap and finish_heap[0][0] <= last:
            _, _, epoch, seq = heappop(finish_heap)
            if epoch != seq.epoch:
                continue
            finished[seq.i] = t_end
            free += -(-(seq.c0 + last - seq.k0) // bs)  # its computed tokens plus this step's
            per_residue[(seq.k0 + 1 - seq.c0) % bs] -= 1
            decoders -= 1
            seq.decoding = False
            seq.generated = seq.max_tokens
            del running[seq.order]
        k = last + 1
        t = t_end

    return EngineRun(
        first_sched,
        first_tok,
        finished,
        preempts,
        rejected,
        steps,
        kv_area / (last_end - arrivals_s[0]) / pool if n and last_end > arrivals_s[0] else 0.0,
        kv_max / pool,
        busy,
        last_end,
        prefill_total,
        max_batch,
    )


__all__ = ["EngineRun", "StepSeconds", "run_engine"]
