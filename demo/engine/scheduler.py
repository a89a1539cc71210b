"""A continuous-batching scheduler with a paged KV-cache block pool and recompute preemption.

This is the emulated GPU engine's core. Nothing runs on a GPU: every engine step sleeps for
the time that SplitwiseSim's measured profile (see :mod:`.profile`) gives for that step, and
the scheduling around the steps follows vLLM's (V0-style, prefill first):

1. Admission (FCFS): the head of the waiting queue is admitted while ``max_num_seqs`` allows,
   the step's prompt-token budget (``max_num_batched_tokens``) allows, and the free KV blocks
   cover its tokens plus a 1 % watermark (vLLM's default ``watermark``, which keeps freshly
   admitted sequences from being preempted at once). The queue head blocks the ones behind
   it, as in vLLM.
2. If anything was admitted, one prefill step runs over their prompt tokens in total and
   each admitted sequence emits its first token; running sequences do not decode meanwhile.
3. Otherwise one decode step runs for the whole running batch, each sequence emitting one
   token. Before the step every sequence must hold ``ceil(tokens_in_kv / block_size)``
   blocks; when one more block is needed and none is free, the most recently admitted
   running sequence is preempted by recompute: its blocks are freed and it goes back to the
   front of the waiting queue, to be prefilled again over its prompt and the tokens it has
   already emitted (which are not emitted again).

Every step time is ``profile time x slowdown x time_scale``; ``time_scale`` < 1 runs the whole
emulation faster (all measured durations shrink with it) and the slowdown factors are the
knobs of the fault scenarios. The config is read at every step, so scenarios may change
those three fields while the engine runs.

Clock: per-request intervals use the monotonic clock (``time.perf_counter``); the wall-clock
arrival (``time.time_ns``) is kept only to place the request on a timeline.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from inferpath.demo.engine.profile import PerfProfile
from inferpath.demo.engine.specs import gpu_spec, model_spec

logger = logging.getLogger(__name__)

_WATERMARK_RATIO = 0.01  # vLLM's default CacheConfig.watermark
_VOCAB_SIZE = 32_000  # Llama-2's vocabulary; token ids are placeholders, not model output
_UTILIZATION_WINDOW_SECONDS = 1.0
_BACK_TO_BACK_SECONDS = 0.005


@dataclass
class EngineConfig:
    """Settings of the emulated engine.

    - ``model``, ``hardware``, ``tensor_parallel``: which SplitwiseSim profile rows to use
      (``llama2-70b``/``bloom-176b``; ``h100-80gb``/``a100-80gb``/``h100-80gb-pcap``; 2/4/8).
    - ``profile``: a preloaded :class:`PerfProfile`; ``None`` loads the one named above.
    - ``served_model_name``: the name in responses and the ``model_name`` metric label
      (defaults to ``model``).
    - ``num_kv_blocks`` x ``block_size_tokens``: the KV-cache pool of the whole
      tensor-parallel group (4096 x 16 tokens = 65,536 tokens, 20 GiB for Llama-2-70B).
    - ``max_num_seqs``: most sequences running at once (vLLM's default 256).
    - ``max_num_batched_tokens``: prompt-token budget of one prefill step (a single prompt
      larger than the budget is still admitted alone, so that it cannot starve).
    - ``time_scale``: multiplies every step time (1.0 = the measured speed).
    - ``prefill_slowdown``, ``decode_slowdown``: extra multipliers of prefill and decode steps
      (fault scenarios: a throttled or shared GPU).
    - ``batch_window_seconds``: how long the head of the waiting queue is held before it may
      be admitted, so that more requests join its prefill (a dynamic-batching delay like
      Triton's ``max_queue_delay_microseconds``; 0 = admit at once, vLLM's behaviour).
    - ``cold_seconds``, ``cold_slowdown``: for the first ``cold_seconds`` after its first
      request, every step is ``cold_slowdown`` times slower (a new replica capturing CUDA
      graphs and compiling kernels lazily, with cold allocator and prefix caches).

    Raises ``ValueError`` naming the field for a value out of range, or a KV pool that does
    not fit in GPU memory next to the weights.
    """

    model: str = "llama2-70b"
    hardware: str = "h100-80gb"
    tensor_parallel: int = 4
    profile: PerfProfile | None = None
    served_model_name: str | None = None
    num_kv_blocks: int = 4096
    block_size_tokens: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    time_scale: float = 1.0
    prefill_slowdown: float = 1.0
    decode_slowdown: float = 1.0
    batch_window_seconds: float = 0.0
    cold_seconds: float = 0.0
    cold_slowdown: float = 1.0

    def __post_init__(self) -> None:
        for name in ("tensor_parallel", "num_kv_blocks", "block_size_tokens", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        for name in ("time_scale", "prefill_slowdown", "decode_slowdown", "cold_slowdown"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
        for name in ("batch_window_seconds", "cold_seconds"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
        spec, gpu = model_spec(self.model), gpu_spec(self.hardware)
        per_gpu = (spec.weights_bytes + self.num_kv_blocks * self.kv_block_bytes) / self.tensor_parallel
        if per_gpu > gpu.memory_total_bytes:
            raise ValueError(
                f"num_kv_blocks: {self.num_kv_blocks} blocks plus {self.model} weights need "
                f"{per_gpu / 2**30:.1f} GiB per GPU at tensor_parallel={self.tensor_parallel}, "
                f"more than the {gpu.memory_total_bytes / 2**30:.1f} GiB of {self.hardware}")
        if self.served_model_name is None:
            self.served_model_name = self.model

    @property
    def kv_block_bytes(self) -> int:
        """Bytes of one KV block across the tensor-parallel group."""
        return model_spec(self.model).kv_bytes_per_token * self.block_size_tokens


@dataclass
class RequestMetrics:
    """Lifecycle timestamps of one request, with vLLM's intervals derived from them.

    Timestamps are ``time.perf_counter()`` seconds (monotonic); ``arrival_wall_ns`` is the wall
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


@dataclass(frozen=True)
class TokenEvent:
    """One output token.

    ``index``: 0-based output position; ``token_id``: a placeholder id (no model runs);
    ``emitted_s``: monotonic time of emission (seconds); ``metrics``: set on the last event.
    """

    index: int
    token_id: int
    finished: bool
    emitted_s: float
    metrics: RequestMetrics | None = None


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine, in vLLM's and dcgm-exporter's terms.

    ``kv_cache_usage_perc`` is vLLM's gauge of the same name: used blocks / total, 0-1.
    GPU fields describe ONE GPU of the tensor-parallel group (they all look alike here):
    ``gpu_utilization_ratio`` is the busy fraction of the last second of wall time (what
    NVML's utilization rate measures: time a kernel ran over the sample period);
    ``gpu_memory_used_bytes`` = (weights + used KV blocks x block bytes) / tensor_parallel.
    A real vLLM pre-allocates its whole KV pool at start, so its GPU memory stays flat; the
    emulator reports blocks in use instead so that KV pressure is visible on GPU panels.
    ``gpu_power_watts`` = idle + (profile power ratio x TDP - idle) x utilization.
    """

    num_requests_waiting: int
    num_requests_running: int
    kv_cache_usage_perc: float
    num_preemptions_total: int
    batch_size: int
    gpu_utilization_ratio: float
    gpu_memory_used_bytes: int
    gpu_memory_total_bytes: int
    gpu_power_watts: float
    prompt_tokens_total: int
    generation_tokens_total: int
    num_requests_finished_total: int


class RequestAborted(RuntimeError):
    """Raised by a :class:`RequestStream` when the engine stopped before the request finished."""


_WAITING, _RUNNING, _DONE = "waiting", "running", "done"
_ABORT = object()


@dataclass(eq=False)
class _Sequence:
    metrics: RequestMetrics
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    state: str = _WAITING
    generated: int = 0
    blocks: int = 0
    admit_order: int = 0
    token_seed: int = 0


class RequestStream:
    """Async iterator over the :class:`TokenEvent` of one submitted request.

    Iteration ends after the event with ``finished=True``; it raises :class:`RequestAborted`
    if the engine stops first. Closing it early (``aclose()``, or a client that went away)
    aborts the request and frees its KV blocks.
    """

    def __init__(self, engine: "Engine", sequence: _Sequence) -> None:
        self._engine = engine
        self._sequence = sequence
        self._done = False

    @property
    def request_id(self) -> str:
        """The engine's id of this request (``cmpl-<hex>-0`` like vLLM's completions)."""
        return self._sequence.metrics.request_id

    @property
    def metrics(self) -> RequestMetrics:
        """The request's lifecycle timestamps so far."""
        return self._sequence.metrics

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> TokenEvent:
        if self._done:
            raise StopAsyncIteration
        event = await self._sequence.events.get()
        if event is _ABORT:
            self._done = True
            raise RequestAborted(f"request {self.request_id}: engine stopped before it finished")
        if event.finished:
            self._done = True
        return event

    async def aclose(self) -> None:
        """Stop listening; an unfinished request is aborted."""
        if not self._done:
            self._done = True
            self._engine.abort(self.request_id)


class Engine:
    """The emulated engine: submit requests, run the scheduling loop, read live stats.

    Use inside a running asyncio loop: ``engine.start()``, ``engine.submit(...)``, and
    ``await engine.stop()`` at the end. ``clock`` is the monotonic clock (seconds).
    """

    def __init__(self, config: EngineConfig, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.config = config
        self.profile = config.profile or PerfProfile.load(config.model, config.hardware, config.tensor_parallel)
        self._model = model_spec(config.model)
        self._gpu = gpu_spec(config.hardware)
        self._clock = clock
        self._waiting: collections.deque[_Sequence] = collections.deque()
        self._running: list[_Sequence] = []
        self._by_id: dict[str, _Sequence] = {}
        self._free_blocks = config.num_kv_blocks
        self._admit_counter = itertools.count(1)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._busy: collections.deque[tuple[float, float]] = collections.deque()
        self._step_started_s: float | None = None
        self._last_step_end_s = float("-inf")
        self._batch_size = 0
        self._first_request_s: float | None = None
        self.num_preemptions_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_requests_finished_total = 0

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        """Start the scheduling loop on the running event loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="emulated-engine")

    async def stop(self) -> None:
        """Stop the loop; every unfinished request's stream raises :class:`RequestAborted`."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for seq in list(self._by_id.values()):
            self._release(seq)
            seq.events.put_nowait(_ABORT)

    # --- requests --------------------------------------------------------------------
    def submit(self, prompt_tokens: int, max_tokens: int, *, request_id: str | None = None) -> RequestStream:
        """Queue a request; returns the stream of its ``max_tokens`` token events.

        The engine always generates exactly ``max_tokens`` tokens (like ``ignore_eos``).
        Raises ``ValueError`` naming the field when a count is < 1, or when the request could
        never fit in the KV pool (vLLM rejects such prompts up front too).
        """
        for name, value in (("prompt_tokens", prompt_tokens), ("max_tokens", max_tokens)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        need = self._blocks_for(prompt_tokens + max_tokens)
        if need > self.config.num_kv_blocks:
            raise ValueError(
                f"prompt_tokens + max_tokens: {prompt_tokens + max_tokens} tokens need {need} KV blocks, "
                f"the pool has {self.config.num_kv_blocks}")
        rid = request_id or f"cmpl-{uuid.uuid4().hex[:16]}-0"
        if rid in self._by_id:
            raise ValueError(f"request_id: {rid!r} is already in flight")
        metrics = RequestMetrics(rid, prompt_tokens, max_tokens, self._clock(), time.time_ns())
        if self._first_request_s is None:
            self._first_request_s = metrics.arrival_s  # the cold period starts with the first request
        seq = _Sequence(metrics=metrics, token_seed=hash(rid) & 0xFFFF)
        self._by_id[rid] = seq
        self._waiting.append(seq)
        self._wake.set()
        return RequestStream(self, seq)

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is and free its blocks; False if it is not in flight."""
        seq = self._by_id.get(request_id)
        if seq is None:
            return False
        self._release(seq)
        return True

    def resize_kv_pool(self, num_kv_blocks: int) -> None:
        """Change the KV pool to ``num_kv_blocks`` blocks while running (another tenant took
        GPU memory, or it was given back). Shrinking below the blocks in use preempts the
        youngest running sequences, as running out of blocks at a decode step does. Raises
        ``ValueError`` naming the field for a count < 1."""
        if not isinstance(num_kv_blocks, int) or isinstance(num_kv_blocks, bool) or num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks: must be an integer >= 1, got {num_kv_blocks!r}")
        self._free_blocks += num_kv_blocks - self.config.num_kv_blocks
        self.config.num_kv_blocks = num_kv_blocks
        while self._free_blocks < 0 and self._running:
            self._preempt(max(self._running, key=lambda s: s.admit_order))
        self._wake.set()

    RECONFIGURABLE = ("time_scale", "prefill_slowdown", "decode_slowdown", "batch_window_seconds", "num_kv_blocks")

    def reconfigure(self, **values: float | int) -> dict[str, float | int]:
        """Change fault knobs of the running engine (:data:`RECONFIGURABLE`; the loop reads the
        config at every step); returns the values now in force. Raises ``ValueError`` naming
        the field for an unknown knob or a value out of range, before changing anything."""
        for name, value in values.items():
            if name not in self.RECONFIGURABLE:
                raise ValueError(f"{name}: not a reconfigurable knob (one of {', '.join(self.RECONFIGURABLE)})")
            if name == "num_kv_blocks":
                continue
            low_ok = value >= 0 if name == "batch_window_seconds" else value > 0
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or not low_ok:
                raise ValueError(f"{name}: out of range, got {value!r}")
        if "num_kv_blocks" in values:
            self.resize_kv_pool(values["num_kv_blocks"])  # type: ignore[arg-type]
        for name, value in values.items():
            if name != "num_kv_blocks":
                setattr(self.config, name, float(value))
        self._wake.set()  # a shorter window or a larger pool may let the queue head in now
        return {name: getattr(self.config, name) for name in self.RECONFIGURABLE}

    def step_multiplier(self) -> float:
        """``time_scale`` times the cold-start slowdown while the engine is still cold
        (within ``cold_seconds`` of its first request)."""
        cfg = self.config
        cold = (cfg.cold_seconds > 0 and self._first_request_s is not None
                and self._clock() - self._first_request_s < cfg.cold_seconds)
        return cfg.time_scale * (cfg.cold_slowdown if cold else 1.0)

    def _batch_window_wait_seconds(self) -> float:
        window = self.config.batch_window_seconds
        if window <= 0 or not self._waiting:
            return 0.0
        return max(0.0, self._waiting[0].metrics.arrival_s + window - self._clock())

    # --- stats -----------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """The live snapshot (see :class:`EngineStats` for each field's definition)."""
        cfg = self.config
        used_blocks = cfg.num_kv_blocks - self._free_blocks
        utilization = self._utilization_ratio()
        idle, busy_w = self._gpu.idle_watts, self.profile.power_ratio(max(self._batch_size, 1)) * self._gpu.tdp_watts
        memory = (self._model.weights_bytes + used_blocks * cfg.kv_block_bytes) // cfg.tensor_parallel
        return EngineStats(
            num_requests_waiting=len(self._waiting),
            num_requests_running=len(self._running),
            kv_cache_usage_perc=used_blocks / cfg.num_kv_blocks,
            num_preemptions_total=self.num_preemptions_total,
            batch_size=self._batch_size if self._step_started_s is not None else 0,
            gpu_utilization_ratio=utilization,
            gpu_memory_used_bytes=memory,
            gpu_memory_total_bytes=self._gpu.memory_total_bytes,
            gpu_power_watts=idle + max(0.0, busy_w - idle) * utilization,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            num_requests_finished_total=self.num_requests_finished_total,
        )

    @property
    def gpu(self):
        """The :class:`~.specs.GpuSpec` being emulated."""
        return self._gpu

    def _utilization_ratio(self) -> float:
        now = self._clock()
        window_start = now - _UTILIZATION_WINDOW_SECONDS
        busy = 0.0
        intervals = list(self._busy)
        if self._step_started_s is not None:
            intervals.append((self._step_started_s, now))
        for start, end in intervals:
            busy += max(0.0, min(end, now) - max(start, window_start))
        return min(1.0, busy / _UTILIZATION_WINDOW_SECONDS)

    # --- the loop --------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            if not self._waiting and not self._running:
                self._wake.clear()
                await self._wake.wait()
                continue
            admitted = self._admit()
            cfg = self.config
            if admitted:
                tokens = sum(s.metrics.prompt_tokens + s.generated for s in admitted)
                self.prompt_tokens_total += tokens
                step = self.profile.prefill_seconds(tokens) * cfg.prefill_slowdown * self.step_multiplier()
                await self._step(step, len(admitted))
                self._emit([s for s in admitted if s.state == _RUNNING])
            elif self._running:
                self._reserve_decode_blocks()
                batch = list(self._running)
                if not batch:
                    continue
                step = self.profile.decode_step_seconds(len(batch)) * cfg.decode_slowdown * self.step_multiplier()
                await self._step(step, len(batch))
                self._emit([s for s in batch if s.state == _RUNNING])
            elif (hold := self._batch_window_wait_seconds()) > 0:
                # Nothing runs while the batching window of the queue head is open.
                await asyncio.sleep(hold)
            else:
                # The queue head cannot be admitted with nothing running: only possible if the
                # config shrank under us; wait for a change rather than spin.
                self._wake.clear()
                await self._wake.wait()

    async def _step(self, seconds: float, batch_size: int) -> None:
        # Back-to-back steps are laid on a deadline timeline so that the event loop's wake-up
        # latency (about a millisecond) does not accumulate into every step; after an idle
        # gap the timeline restarts at "now".
        now = self._clock()
        start = self._last_step_end_s if 0 <= now - self._last_step_end_s < _BACK_TO_BACK_SECONDS else now
        end = start + seconds
        self._step_started_s, self._batch_size = start, batch_size
        try:
            await asyncio.sleep(max(0.0, end - now))
        finally:
            self._step_started_s = None
            self._last_step_end_s = end
            self._busy.append((start, end))
            while self._busy and self._busy[0][1] < end - _UTILIZATION_WINDOW_SECONDS:
                self._busy.popleft()

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size_tokens)

    def _admit(self) -> list[_Sequence]:
        cfg = self.config
        watermark = math.ceil(_WATERMARK_RATIO * cfg.num_kv_blocks)
        budget = cfg.max_num_batched_tokens
        admitted: list[_Sequence] = []
        now = self._clock()
        if self._batch_window_wait_seconds() > 0 and len(self._waiting) < cfg.max_num_seqs:
            return admitted
        while self._waiting and len(self._running) < cfg.max_num_seqs:
            seq = self._waiting[0]
            tokens = seq.metrics.prompt_tokens + seq.generated
            need = self._blocks_for(tokens)
            reserve = watermark if self._running else 0
            if need + reserve > self._free_blocks or (admitted and tokens > budget):
                break
            self._waiting.popleft()
            self._free_blocks -= need
            seq.blocks, seq.state, seq.admit_order = need, _RUNNING, next(self._admit_counter)
            if seq.metrics.first_scheduled_s is None:
                seq.metrics.first_scheduled_s = now
            self._running.append(seq)
            budget -= tokens
            admitted.append(seq)
        return admitted

    def _reserve_decode_blocks(self) -> None:
        # Oldest first, so that when blocks run out the youngest gives way (vLLM's policy).
        for seq in list(self._running):
            if seq.state != _RUNNING:
                continue
            need = self._blocks_for(seq.metrics.prompt_tokens + seq.generated)
            while seq.state == _RUNNING and seq.blocks < need:
                if self._free_blocks > 0:
                    self._free_blocks -= 1
                    seq.blocks += 1
                else:
                    self._preempt(max(self._running, key=lambda s: s.admit_order))

    def _preempt(self, seq: _Sequence) -> None:
        self._free_blocks += seq.blocks
        seq.blocks, seq.state = 0, _WAITING
        self._running.remove(seq)
        self._waiting.appendleft(seq)
        seq.metrics.num_preemptions += 1
        self.num_preemptions_total += 1
        logger.debug("preempted %s after %d tokens", seq.metrics.request_id, seq.generated)

    def _emit(self, sequences: list[_Sequence]) -> None:
        now = self._clock()
        for seq in sequences:
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
                self._release(seq)
            token_id = (seq.token_seed + index * 7919) % _VOCAB_SIZE
            seq.events.put_nowait(TokenEvent(index, token_id, finished, now, metrics if finished else None))

    def _release(self, seq: _Sequence) -> None:
        if seq.state == _RUNNING:
            self._running.remove(seq)
        elif seq.state == _WAITING:
            try:
                self._waiting.remove(seq)
            except ValueError:
                pass
        self._free_blocks += seq.blocks
        seq.blocks, seq.state = 0, _DONE
        self._by_id.pop(seq.metrics.request_id, None)
