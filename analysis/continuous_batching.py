"""The continuous-batching scheduler: paged KV blocks, admission, recompute preemption.

One engine model with two drivers: the demo's emulated engine (``inferpath.demo.engine``)
runs it in real time, sleeping for each step, and the what-if simulator
(:mod:`inferpath.analysis.whatif`) runs it on a virtual clock as fast as the CPU allows,
through :mod:`inferpath.analysis.whatif_engine`, which takes runs of identical steps at
once and is tested to schedule exactly as this class does. The scheduler decides WHAT each
step does; the driver decides how long a step takes (a measured profile in the demo, a fit
to the window's own spans in the what-if) and when it ends.

Two policies. ``chunked_prefill=False`` (the demo engine's), vLLM V0-style, prefill first:

1. Admission (FCFS): the head of the waiting queue is admitted while ``max_num_seqs`` allows,
   the step's prompt-token budget (``max_num_batched_tokens``) allows, and the free KV blocks
   cover its tokens plus a 1 % watermark (vLLM's default ``watermark``, which keeps freshly
   admitted sequences from being preempted at once). The queue head blocks the ones behind
   it, as in vLLM. With ``batch_window_seconds`` > 0 the head is held that long after its
   arrival (unless the queue already fills the batch), so that more requests join its prefill.
2. If anything was admitted, the step is a prefill over their prompt tokens in total (plus
   the tokens a preempted sequence had emitted, which it recomputes); each admitted sequence
   emits its first token at the end. Running sequences do not decode meanwhile.
3. Otherwise the step is one decode for the whole running batch, each sequence emitting one
   token. Before it every sequence must hold ``ceil(tokens_in_kv / block_size)`` blocks; when
   one more block is needed and none is free, the most recently admitted running sequence is
   preempted by recompute: its blocks are freed and it goes back to the front of the waiting
   queue, to be prefilled again later (tokens already emitted are not emitted again).

``chunked_prefill=True``, vLLM V1's scheduler (``vllm/v1/core/sched/scheduler.py``, FCFS, the
defaults of vLLM 0.x V1: chunked prefill on, no watermark, ``scheduler_reserve_full_isl``).
There are no prefill and decode steps, only steps that give each sequence new tokens to
compute, within a token budget of ``max_num_batched_tokens``:

1. The running sequences first, oldest admitted first: each gets what it still has to
   compute (1 token when decoding; the rest of its prompt, cut to the budget, when its
   prefill is chunked). KV blocks are taken for them; when none is left, the most recently
   admitted running sequence is preempted (blocks freed, back to the front of the queue,
   its computed tokens forgotten), repeatedly, until the blocks suffice or the sequence
   itself was the one preempted.
2. Then, only if nothing was preempted in this step, the queue head is admitted while the
   budget lasts, ``max_num_seqs`` allows and the free blocks hold its whole sequence so far
   (prompt plus tokens already emitted, which a preempted one recomputes); it gets as many
   tokens as the budget leaves (a chunk), and blocks for that chunk.
3. A sequence whose computed tokens reach its length at the end of the step emits a token.

Times are seconds on the driver's clock; :class:`RequestMetrics` derives vLLM's intervals
from them. The config is read at every step, so a driver may change it while running.
"""

from __future__ import annotations

import collections
import itertools
import math
from dataclasses import dataclass
from typing import Protocol

WATERMARK_RATIO = 0.01  # vLLM's default CacheConfig.watermark

WAITING, RUNNING, DONE = "waiting", "running", "done"


class BatchingConfig(Protocol):
    """What the scheduler reads of its driver's config, at every step."""

    num_kv_blocks: int
    block_size_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    batch_window_seconds: float


@dataclass
class RequestMetrics:
    """Lifecycle timestamps of one request, with vLLM's intervals derived from them.

    Timestamps are seconds on the driver's monotonic clock; ``arrival_wall_ns`` is the wall
    clock at arrival. Intervals follow vLLM's definitions (``docs/design/metrics.md``,
    "Interval calculations"; ``vllm/v1/metrics/stats.py``); preemptions do not reset them.
    """

    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrival_s: float
    arrival_wall_ns: int
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    completion_tokens: int = 0
    num_preemptions: int = 0

    @property
    def queue_seconds(self) -> float:
        """Queue interval: arrival -> first scheduled (time spent WAITING before any compute)."""
        return _span(self.arrival_s, self.first_scheduled_s)

    @property
    def prefill_seconds(self) -> float:
        """Prefill interval: first scheduled -> first output token."""
        return _span(self.first_scheduled_s, self.first_token_s)

    @property
    def decode_seconds(self) -> float:
        """Decode interval: first output token -> last output token."""
        return _span(self.first_token_s, self.finished_s)

    @property
    def inference_seconds(self) -> float:
        """Inference interval: first scheduled -> last output token (prefill + decode)."""
        return _span(self.first_scheduled_s, self.finished_s)

    @property
    def ttft_seconds(self) -> float:
        """Time to first token: arrival -> first output token."""
        return _span(self.arrival_s, self.first_token_s)

    @property
    def e2e_seconds(self) -> float:
        """End-to-end latency: arrival -> last output token (request finished)."""
        return _span(self.arrival_s, self.finished_s)

    @property
    def finished_wall_ns(self) -> int:
        """Wall-clock finish: arrival wall time plus the monotonic E2E (one clock for the span)."""
        return self.arrival_wall_ns + round(self.e2e_seconds * 1e9)


def _span(start: float | None, end: float | None) -> float:
    if start is None or end is None:
        return 0.0
    return max(0.0, end - start)


@dataclass(eq=False)
class Sequence:
    """One request inside the scheduler: where it is (``state``), the tokens it has emitted
    (``generated``), the KV blocks it holds, and its admission order (the youngest running
    sequence is preempted first). Drivers may subclass it to carry their own fields."""

    metrics: RequestMetrics
    state: str = WAITING
    generated: int = 0
    blocks: int = 0
    admit_order: int = 0
    computed: int = 0  # tokens whose KV is computed (chunked-prefill policy)
    decoding: bool = False  # emitted since its last admission: one token per step now (chunked-prefill policy)


@dataclass
class Step:
    """One engine step as the scheduler planned it: ``kind`` ``"prefill"`` (``tokens`` = the
    prompt and recomputed tokens in total) or ``"decode"`` (``tokens`` = the batch size), and
    the ``sequences`` that emit a token when it ends; or, with chunked prefill, ``"mixed"``:
    ``sequences`` scheduled with ``new_tokens`` each (``tokens`` in total, of which
    ``prefill_tokens`` are prompt or recomputed tokens and the rest one per decoding sequence)."""

    kind: str
    sequences: list[Sequence]
    tokens: int
    new_tokens: list[int] | None = None
    prefill_tokens: int = 0


@dataclass
class Emitted:
    """A token emitted at the end of a step: the sequence, the token's 0-based ``index`` and
    whether it was the sequence's last."""

    sequence: Sequence
    index: int
    finished: bool


class ContinuousBatcher:
    """The scheduling state of one engine: the waiting queue, the running batch and the KV
    block pool (module docstring for the policy). Single-threaded; the driver calls
    :meth:`add`, :meth:`plan_step`, :meth:`finish_step` and :meth:`release`."""

    def __init__(self, config: BatchingConfig, *, chunked_prefill: bool = False) -> None:
        self.config = config
        self.chunked_prefill = chunked_prefill
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self.free_blocks = config.num_kv_blocks
        self._admit_counter = itertools.count(1)
        self.num_preemptions_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_requests_finished_total = 0

    @property
    def used_blocks(self) -> int:
        """KV blocks held by running sequences."""
        return self.config.num_kv_blocks - self.free_blocks

    def blocks_for(self, tokens: int) -> int:
        """KV blocks that ``tokens`` tokens occupy: ``ceil(tokens / block_size_tokens)``."""
        return -(-tokens // self.config.block_size_tokens)

    def fits(self, prompt_tokens: int, max_tokens: int) -> bool:
        """Whether a request could ever fit the pool (vLLM rejects one that cannot, up front)."""
        return self.blocks_for(prompt_tokens + max_tokens) <= self.config.num_kv_blocks

    def add(self, seq: Sequence) -> None:
        """Queue an arrived sequence at the back of the waiting queue."""
        seq.state = WAITING
        self.waiting.append(seq)

    def release(self, seq: Sequence) -> None:
        """Drop ``seq`` wherever it is (finished or aborted) and free its blocks."""
        if seq.state == RUNNING:
            self.running.remove(seq)
        elif seq.state == WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self.free_blocks += seq.blocks
        seq.blocks, seq.state = 0, DONE

    def resize_kv_pool(self, num_kv_blocks: int) -> None:
        """Change the pool to ``num_kv_blocks`` blocks; shrinking below the blocks in use
        preempts the youngest running sequences. The config's ``num_kv_blocks`` is set too."""
        self.free_blocks += num_kv_blocks - self.config.num_kv_blocks
        self.config.num_kv_blocks = num_kv_blocks
        while self.free_blocks < 0 and self.running:
            self.preempt(max(self.running, key=lambda s: s.admit_order))

    def batch_window_wait_seconds(self, now: float) -> float:
        """How much longer the queue head is held by the batching window (0 = not held)."""
        window = self.config.batch_window_seconds
        if window <= 0 or not self.waiting:
            return 0.0
        return max(0.0, self.waiting[0].metrics.arrival_s + window - now)

    def plan_step(self, now: float) -> Step | None:
        """Admit what may run and return the next step, or ``None`` when nothing can run now
        (idle, the batching window holds the head, or the head cannot fit an empty engine)."""
        if self.chunked_prefill:
            return self._plan_chunked(now)
        admitted = self._admit(now)
        if admitted:
            tokens = sum(s.metrics.prompt_tokens + s.generated for s in admitted)
            self.prompt_tokens_total += tokens
            return Step("prefill", admitted, tokens)
        if self.running:
            self._reserve_decode_blocks()
            if self.running:
                return Step("decode", list(self.running), len(self.running))
            return self.plan_step(now)  # the last one gave way to itself: re-admit it
        return None

    def finish_step(self, step: Step, now: float) -> list[Emitted]:
        """End ``step`` at ``now``: every sequence of it still running emits one token;
        finished ones are released. Returns what was emitted, in batch order."""
        out: list[Emitted] = []
        counts = step.new_tokens
        for k, seq in enumerate(step.sequences):
            if seq.state != RUNNING:
                continue  # preempted or aborted while the step ran
            if counts is not None:
                seq.computed += counts[k]
                if seq.computed < seq.metrics.prompt_tokens + seq.generated:
                    continue  # a chunk of a longer prefill: no token yet
                seq.decoding = True
            index = seq.generated
            seq.generated += 1
            self.generation_tokens_total += 1
            metrics = seq.metrics
            metrics.completion_tokens = seq.generated
            if metrics.first_token_s is None:
                metrics.first_token_s = now
            finished = seq.generated >= metrics.max_tokens
            if finished:
                metrics.finished_s = now
                self.num_requests_finished_total += 1
                self.release(seq)
            out.append(Emitted(seq, index, finished))
        return out

    def preempt(self, seq: Sequence) -> None:
        """Preempt ``seq`` by recompute: free its blocks, put it at the front of the queue."""
        self.free_blocks += seq.blocks
        seq.blocks, seq.state, seq.computed, seq.decoding = 0, WAITING, 0, False
        self.running.remove(seq)
        self.waiting.appendleft(seq)
        seq.metrics.num_preemptions += 1
        self.num_preemptions_total += 1

    def _plan_chunked(self, now: float) -> Step | None:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        running = self.running
        scheduled: list[Sequence] = []
        counts: list[int] = []
        prefill_tokens = 0
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            length = seq.metrics.prompt_tokens + seq.generated
            n = min(length - seq.computed, budget)
            need = self.blocks_for(seq.computed + n) - seq.blocks
            while need > self.free_blocks:
                victim = running[-1]
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.state != RUNNING:
                break
            if need > 0:
                self.free_blocks -= need
                seq.blocks += need
            if not seq.decoding:  # a chunk of its prompt (or of its recompute), not one decode token
                prefill_tokens += n
                self.prompt_tokens_total += n
            scheduled.append(seq)
            counts.append(n)
            budget -= n
            i += 1
        held = self.batch_window_wait_seconds(now) > 0 and len(self.waiting) < cfg.max_num_seqs
        if not preempted and not held:
            while self.waiting and budget > 0 and len(running) < cfg.max_num_seqs:
                seq = self.waiting[0]
                length = seq.metrics.prompt_tokens + seq.generated
                if self.blocks_for(length) > self.free_blocks:
                    break  # the whole sequence so far must fit (vLLM's scheduler_reserve_full_isl)
                n = min(length, budget)
                need = self.blocks_for(n)
                self.waiting.popleft()
                self.free_blocks -= need
                seq.blocks, seq.state, seq.computed = need, RUNNING, 0
                seq.admit_order = next(self._admit_counter)
                if seq.metrics.first_scheduled_s is None:
                    seq.metrics.first_scheduled_s = now
                running.append(seq)
                scheduled.append(seq)
                counts.append(n)
                prefill_tokens += n
                self.prompt_tokens_total += n
                budget -= n
        if not scheduled:
            return None
        tokens = sum(counts)
        return Step("mixed", scheduled, tokens, counts, prefill_tokens)

    def _admit(self, now: float) -> list[Sequence]:
        cfg = self.config
        watermark = math.ceil(WATERMARK_RATIO * cfg.num_kv_blocks)
        budget = cfg.max_num_batched_tokens
        admitted: list[Sequence] = []
        if self.batch_window_wait_seconds(now) > 0 and len(self.waiting) < cfg.max_num_seqs:
            return admitted
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            tokens = seq.metrics.prompt_tokens + seq.generated
            need = self.blocks_for(tokens)
            reserve = watermark if self.running else 0
            if need + reserve > self.free_blocks or (admitted and tokens > budget):
                break
            self.waiting.popleft()
            self.free_blocks -= need
            seq.blocks, seq.state, seq.admit_order = need, RUNNING, next(self._admit_counter)
            if seq.metrics.first_scheduled_s is None:
                seq.metrics.first_scheduled_s = now
            self.running.append(seq)
            budget -= tokens
            admitted.append(seq)
        return admitted

    def _reserve_decode_blocks(self) -> None:
        # Oldest first, so that when blocks run out the youngest gives way (vLLM's policy).
        for seq in list(self.running):
            if seq.state != RUNNING:
                continue
            need = self.blocks_for(seq.metrics.prompt_tokens + seq.generated)
            while seq.state == RUNNING and seq.blocks < need:
                if self.free_blocks > 0:
                    self.free_blocks -= 1
                    seq.blocks += 1
                else:
                    self.preempt(max(self.running, key=lambda s: s.admit_order))


__all__ = [
    "BatchingConfig",
    "ContinuousBatcher",
    "DONE",
    "Emitted",
    "RequestMetrics",
    "RUNNING",
    "Sequence",
    "Step",
    "WAITING",
    "WATERMARK_RATIO",
]
