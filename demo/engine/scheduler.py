"""The emulated engine: the continuous-batching scheduler driven in real time.

What each step does (admission, prefill first, decode, KV blocks, recompute preemption) is
decided by :class:`inferpath.analysis.continuous_batching.ContinuousBatcher`, the one engine
model that the what-if simulator (:mod:`inferpath.analysis.whatif`) also runs, on a virtual
clock. Here nothing runs on a GPU either: every engine step sleeps for the time that
SplitwiseSim's measured profile (see :mod:`.profile`) gives for that step.

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
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from inferpath.analysis.continuous_batching import ContinuousBatcher, Emitted, RequestMetrics, Sequence
from inferpath.demo.engine.profile import PerfProfile
from inferpath.demo.engine.specs import gpu_spec, model_spec

logger = logging.getLogger(__name__)

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
                f"more than the {gpu.memory_total_bytes / 2**30:.1f} GiB of {self.hardware}"
            )
        if self.served_model_name is None:
            self.served_model_name = self.model

    @property
    def kv_block_bytes(self) -> int:
        """Bytes of one KV block across the tensor-parallel group."""
        return model_spec(self.model).kv_bytes_per_token * self.block_size_tokens


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


_ABORT = object()


@dataclass(eq=False)
class _Sequence(Sequence):
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    token_seed: int = 0


class RequestStream:
    """Async iterator over the :class:`TokenEvent` of one submitted request.

    Iteration ends after the event with ``finished=True``; it raises :class:`RequestAborted`
    if the engine stops first. Closing it early (``aclose()``, or a client that went away)
    aborts the request and frees its KV blocks.
    """

    def __init__(self, engine: Engine, sequence: _Sequence) -> None:
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

    def __aiter__(self) -> RequestStream:
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
        self.batcher = ContinuousBatcher(config)
        self._by_id: dict[str, _Sequence] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._busy: collections.deque[tuple[float, float]] = collections.deque()
        self._step_started_s: float | None = None
        self._last_step_end_s = float("-inf")
        self._batch_size = 0
        self._first_request_s: float | None = None

    @property
    def num_preemptions_total(self) -> int:
        """Preemptions since start (vLLM's ``num_preemptions_total``)."""
        return self.batcher.num_preemptions_total

    @property
    def prompt_tokens_total(self) -> int:
        """Prompt tokens prefilled since start, recomputed ones included."""
        return self.batcher.prompt_tokens_total

    @property
    def generation_tokens_total(self) -> int:
        """Output tokens emitted since start."""
        return self.batcher.generation_tokens_total

    @property
    def num_requests_finished_total(self) -> int:
        """Requests finished since start."""
        return self.batcher.num_requests_finished_total

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
        need = self.batcher.blocks_for(prompt_tokens + max_tokens)
        if need > self.config.num_kv_blocks:
            raise ValueError(
                f"prompt_tokens + max_tokens: {prompt_tokens + max_tokens} tokens need {need} KV blocks, "
                f"the pool has {self.config.num_kv_blocks}"
            )
        rid = request_id or f"cmpl-{uuid.uuid4().hex[:16]}-0"
        if rid in self._by_id:
            raise ValueError(f"request_id: {rid!r} is already in flight")
        metrics = RequestMetrics(rid, prompt_tokens, max_tokens, self._clock(), time.time_ns())
        if self._first_request_s is None:
            self._first_request_s = metrics.arrival_s  # the cold period starts with the first request
        seq = _Sequence(metrics=metrics, token_seed=hash(rid) & 0xFFFF)
        self._by_id[rid] = seq
        self.batcher.add(seq)
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
        self.batcher.resize_kv_pool(num_kv_blocks)
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
        cold = (
            cfg.cold_seconds > 0
            and self._first_request_s is not None
            and self._clock() - self._first_request_s < cfg.cold_seconds
        )
        return cfg.time_scale * (cfg.cold_slowdown if cold else 1.0)

    # --- stats -----------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """The live snapshot (see :class:`EngineStats` for each field's definition)."""
        cfg = self.config
        used_blocks = self.batcher.used_blocks
        utilization = self._utilization_ratio()
        idle, busy_w = self._gpu.idle_watts, self.profile.power_ratio(max(self._batch_size, 1)) * self._gpu.tdp_watts
        memory = (self._model.weights_bytes + used_blocks * cfg.kv_block_bytes) // cfg.tensor_parallel
        return EngineStats(
            num_requests_waiting=len(self.batcher.waiting),
            num_requests_running=len(self.batcher.running),
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
        batcher = self.batcher
        while True:
            if not batcher.waiting and not batcher.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            # One clock reading for the plan and the window: read twice, a window that closed
            # between the reads left the head held with no timer to wake the loop.
            now = self._clock()
            step = batcher.plan_step(now)
            cfg = self.config
            if step is not None:
                if step.kind == "prefill":
                    seconds = self.profile.prefill_seconds(step.tokens) * cfg.prefill_slowdown
                else:
                    seconds = self.profile.decode_step_seconds(step.tokens) * cfg.decode_slowdown
                await self._step(seconds * self.step_multiplier(), len(step.sequences))
                self._emit(batcher.finish_step(step, self._clock()))
            elif (hold := batcher.batch_window_wait_seconds(now)) > 0:
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

    def _emit(self, emitted: list[Emitted]) -> None:
        now = self._clock()
        for token in emitted:
            seq = token.sequence
            assert isinstance(seq, _Sequence)
            if token.finished:
                self._by_id.pop(seq.metrics.request_id, None)
            token_id = (seq.token_seed + token.index * 7919) % _VOCAB_SIZE
            seq.events.put_nowait(
                TokenEvent(token.index, token_id, token.finished, now, seq.metrics if token.finished else None)
            )

    def _release(self, seq: _Sequence) -> None:
        self.batcher.release(seq)
        self._by_id.pop(seq.metrics.request_id, None)
