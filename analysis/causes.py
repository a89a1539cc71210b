"""The registry of causes: which stage's time each one claims, on what evidence, and the advice.

Each :class:`CauseRule` is one entry: its name (a :data:`~inferpath.vocabulary.CAUSES`
name), the stages whose time it may claim, a predicate over the :class:`Context` (the
engine's state and the request measures of the same windows), the evidence it quotes and
what would and would not help. A stage's time goes to the *first* rule in
:data:`REGISTRY` that lists the stage and whose predicate holds, so the order is the
troubleshooting order: memory before compute (a full KV pool wastes compute on preempted
sequences), capacity before batching (a batch at its limit is not a window to shorten), a
named scheduler hold before plain queueing. Adding a cause is one entry here and its test.

The rules, from the guidance the project is built on:

- ``gpu_memory``: KV cache near full, preempting, or without room for a large sequence of the
  window while requests wait, running below its limit.
- ``gpu_compute``: the running batch at its limit while requests wait (capacity), with or
  without GPU utilization; high utilization or a slower median decode step confirm it.
- ``batching``: requests held while the engine has free slots and KV room (a batching
  window, a per-step token budget, or a hold on every request: the median queue time rose
  with the tail's), unless the GPU was saturated for the same work (utilization ≥ 0.9, or a
  slower decode step while the batch did not grow: then compute's), and the
  slower decode of a batch that the hold made larger. A batch that grew with the traffic
  while no request was held is compute's: on a real engine (vLLM under a burst, no request
  waiting, 7 → 28 sequences per step) the steps grow with it.
- ``queueing``: queue time with no request waiting in the engine (the wait is upstream: a
  gateway or client queue), or when the engine exports no queue depth to tell (where its
  spans alone are the request, they are counted instead: a running batch at its peak while
  requests waited is compute's); and a hop's
  wait that grew with the backlog (below).
- CPU stages and hops (``tokenization``, ``retrieval``, ``network_hop``) claim their stage. A
  hop is the caller's CLIENT span less the callee's span: the wire, and the time the callee
  took to pick the request up. On real recordings the second dominated: a gateway whose
  event loop a synchronous tokenizer blocked accepted requests 2 s late, and vLLM's span
  starts only when its API server hands the request to the engine. So the hop's time above
  its floor (what nine requests in ten paid at least) waited at a busy door and goes to what
  kept the door busy: the engine's cause where the engine held requests (up to their queue
  time in the engine), then tokenization or retrieval (up to their time in the same
  requests). An excess that no door explains and that grew with the backlog (the requests
  that found more waiting ahead of them waited longer) waited in a queue before the engine: a
  client's connection pool, a concurrency limit (the demo gateway with a pool of 4
  connections to a real vLLM that never queued); it goes to ``queueing``, up to the waits on
  the hop's trip out (``engine_send_ns``: the call's start to the engine span's start; a
  first token that came back late waited in no queue before the engine). The floor, and the
  rest, stay ``network_hop`` (:func:`~inferpath.analysis.diagnosis.attribute`). Where the caller measured its own first
  and last token, a stream that reached it in one lump (first and last token a few ms apart
  while the engine decoded for seconds) was read late on the caller's side: the evidence
  counts those and the advice names the caller (a CPU-starved client, a buffering proxy). A
  caller that reads late sends late too: where it called the engine itself, its waits are not
  taken for a queue; behind a gateway they are its own hop's, not the gateway's wait (where
  the hop's trip out is measured; without it, the whole network stage with the caller's hop).
- ``unexplained``: gateway self time and time no stage span covers. Except in a tail band whose
  TTFT is the engine's own (no gateway, tokenizer, retrieval or network stage measured): there
  the rest lies inside the engine, between its arrival and its queue (input processing, and a
  new request waits for the step in flight: vLLM's steps grew from 4 to 33 ms under a burst),
  and it goes to the engine cause that would take queue time (memory, compute or batching).

``cold_start`` is not a stage rule: requests of a starting replica are charged to it whole
(:mod:`~inferpath.analysis.diagnosis`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from inferpath.analysis.engine_state import KV_FULL_RATIO, EngineState

GPU_SATURATED_RATIO = 0.90
"""Mean GPU utilization above which the GPU has no idle time left to absorb more work."""
GPU_HEADROOM_RATIO = 0.60
"""Utilization below which more GPUs cannot be the fix: the ones there are idle 40% of the time."""


@dataclass
class Context:
    """What the rules read about one diagnosis.

    ``engine``: the window's :class:`~inferpath.analysis.engine_state.EngineState`;
    ``gpu_utilization``: mean ratio, ``None`` when not exported; ``decode_slower``: the
    median decode step slowed against the baseline (``False`` without one); ``batch_grew``:
    the mean running batch grew by half against the baseline; ``queue_held``: the median
    queue time rose with the tail's (a hold on every request); ``has_baseline``;
    ``engine_only``: the tail band measured the engine's queue and no stage before the engine
    (its TTFT is the engine's own, so the unexplained rest is engine time; set by the
    attribution)."""

    engine: EngineState
    gpu_utilization: float | None = None
    decode_slower: bool = False
    batch_grew: bool = False
    queue_held: bool = False
    has_baseline: bool = False
    engine_only: bool = False

    @property
    def gpu_saturated(self) -> bool:
        """High, steady utilization, or a slower median decode step for the same work."""
        util = self.gpu_utilization
        return (util is not None and util >= GPU_SATURATED_RATIO) or self.decode_slower

    @property
    def saturated_for_same_work(self) -> bool:
        """High, steady utilization, or a slower median decode step while the running batch
        did not grow: a larger batch makes each step longer by itself (vLLM at a 32-token
        step budget: ITL p50 ×4 with 7 → 31 sequences per step, the queue held by the budget)."""
        util = self.gpu_utilization
        return (util is not None and util >= GPU_SATURATED_RATIO) or (self.decode_slower and not self.batch_grew)

    @property
    def gpus_idle(self) -> bool:
        """Utilization is reported and below :data:`GPU_HEADROOM_RATIO`."""
        return self.gpu_utilization is not None and self.gpu_utilization < GPU_HEADROOM_RATIO


ADD_CAPACITY = "add_capacity"
"""Action tags: advice that one cause gives and another would deny is dropped from the
denial (:func:`consistent_advice`), so one verdict never says both."""
RAISE_BATCH_LIMIT, SHRINK_BATCH_WINDOW, KV_ROOM = "raise_batch_limit", "shrink_batch_window", "kv_room"


@dataclass(frozen=True)
class Advice:
    """One line of advice and the action it is about (``None`` for no specific action)."""

    text: str
    action: str | None = None


@dataclass(frozen=True)
class CauseRule:
    """One registry entry (module docstring). ``claims(stage, context)`` says whether the
    rule takes that stage's time; ``would_help`` / ``would_not_help`` build the advice from
    the context."""

    name: str
    stages: frozenset[str]
    claims: Callable[[str, Context], bool]
    would_help: Callable[[Context], list[Advice]] = field(default=lambda _: [])
    would_not_help: Callable[[Context], list[Advice]] = field(default=lambda _: [])
    evidence_columns: tuple[str, ...] = ()


def _always(_stage: str, _context: Context) -> bool:
    return True


def _engine_rest(claims: Callable[[str, Context], bool]) -> Callable[[str, Context], bool]:
    """``claims`` extended to the ``rest`` stage: in an engine-only window the rest is the
    engine's wait before its queue, claimed as queue time is."""

    def claim(stage: str, c: Context) -> bool:
        if stage == "rest":
            return c.engine_only and claims("queue", c)
        return claims(stage, c)

    return claim


def _memory(stage: str, c: Context) -> bool:
    if not c.engine.memory_pressure:
        return False
    # Queue time is memory's only when memory (not slots) held the queue; prefill and decode
    # grow under preemption (preempted sequences are recomputed and re-queued).
    return stage != "queue" or c.engine.bound in ("memory", None)


def _compute(stage: str, c: Context) -> bool:
    if stage == "queue":
        if c.engine.bound == "slots":
            return True
        if c.engine.bound == "held":  # requests held with free slots and KV room: compute's
            return c.saturated_for_same_work  # only when the GPU had no room for them either
        return c.gpu_saturated and c.engine.bound is None
    if stage == "decode":  # a batch that a hold made larger is the batching rule's
        return not (c.batch_grew and _held(c))
    return True  # prefill: the GPU's own pass over the prompt


def _held(c: Context) -> bool:
    """The engine held requests back with free slots and KV room (or, where it reports no
    queue depth, the median queue time rose with the tail's)."""
    return c.engine.bound == "held" or (c.engine.bound is None and c.queue_held)


def _batching(stage: str, c: Context) -> bool:
    if stage == "queue":
        return _held(c)
    # decode: more sequences per step because requests were held to join the batch. A batch
    # that grew with the traffic while no request waited is load on the engine (compute).
    return c.batch_grew and _held(c)


def _window_text(c: Context) -> str:
    if c.engine.bound == "slots":
        return "shrinking the batch window will not help: the batch is full and requests wait for a free slot"
    return "shrinking the batch window will not help: the engine holds no request back; its steps are slower"


def _gpu_text(c: Context) -> str:
    return "" if c.gpu_utilization is None else f" (GPU utilization {c.gpu_utilization:.0%})"


def _compute_help(c: Context) -> list[Advice]:
    """Capacity first, except where the batch was full while the KV cache kept room and the
    GPU was not busy: a larger batch limit is then the cheaper step (vLLM with
    ``--max-num-seqs 4`` and its KV cache at 2 %)."""
    add = Advice("add replicas (or GPUs), and move bulk traffic to replicas of its own", ADD_CAPACITY)
    if c.engine.bound != "slots":
        return [add]
    kv, util = c.engine.kv_max, c.gpu_utilization
    if (
        kv is not None
        and kv < KV_FULL_RATIO
        and not c.engine.memory_pressure
        and not (util is not None and util >= GPU_SATURATED_RATIO)
    ):
        return [
            Advice(
                f"raise the engine's batch limit (max-num-seqs): the batch was full while the KV cache stayed at "
                f"or below {kv:.0%}",
                RAISE_BATCH_LIMIT,
            ),
            Advice("or add replicas (or GPUs), and move bulk traffic to replicas of its own", ADD_CAPACITY),
        ]
    return [add, Advice("or raise the engine's batch limit (max-num-seqs) where KV memory allows", RAISE_BATCH_LIMIT)]


REGISTRY: tuple[CauseRule, ...] = (
    CauseRule(
        "tokenization",
        frozenset({"tokenize"}),
        _always,
        lambda c: [Advice("use a fast (Rust) tokenizer, cache tokenized prompts and tokenize off the event loop")],
        lambda c: [
            Advice(
                "adding GPUs will not help: the time is spent before the request reaches the engine" + _gpu_text(c),
                ADD_CAPACITY,
            )
        ],
        ("tokenize_ns",),
    ),
    CauseRule(
        "retrieval",
        frozenset({"retrieval"}),
        _always,
        lambda c: [
            Advice(
                "cache retrieval results, shrink top-k or the index, give the retriever its own "
                "workers, or run it in parallel with the first model pass"
            )
        ],
        lambda c: [
            Advice(
                "adding GPUs will not help: the time is spent before the request reaches the engine" + _gpu_text(c),
                ADD_CAPACITY,
            )
        ],
        ("retrieval_ns",),
    ),
    CauseRule(
        "network_hop",
        frozenset({"network"}),
        _always,
        lambda c: [
            Advice(
                "remove the extra hop (a proxy, a load balancer) or bring the caller, any gateway and the model "
                "server closer together; keep connections alive"
            ),
            Advice(
                "or, where the caller and callee share a host, look at the callee's accept side: a hop also "
                "holds the time a busy server takes to pick the request up (an event loop blocked by a "
                "synchronous tokenizer, an engine's API server before its engine span)"
            ),
        ],
        lambda c: [Advice("adding GPUs will not help: the time is spent between the services", ADD_CAPACITY)],
        ("network_ns", "gateway_ns"),
    ),
    CauseRule(
        "gpu_memory",
        frozenset({"queue", "prefill", "decode", "rest"}),
        _engine_rest(_memory),
        lambda c: [
            Advice(
                "give the KV cache more room: more KV memory per replica, fewer concurrent "
                "sequences, a shorter max length, prefix caching or a quantized KV cache",
                KV_ROOM,
            ),
            Advice("or add replicas, so each holds fewer sequences' KV blocks", ADD_CAPACITY),
        ],
        lambda c: [
            Advice(
                "more compute alone (a faster GPU, a larger batch limit) will not help: "
                "sequences wait for KV blocks, not for compute",
                RAISE_BATCH_LIMIT,
            ),
            Advice(
                "shrinking the batch window will not help: requests wait for KV blocks, not for a batch to fill",
                SHRINK_BATCH_WINDOW,
            ),
        ],
        ("queue_ns",),
    ),
    CauseRule(
        "gpu_compute",
        frozenset({"queue", "prefill", "decode", "rest"}),
        _engine_rest(_compute),
        _compute_help,
        lambda c: [
            Advice(_window_text(c), SHRINK_BATCH_WINDOW),
            Advice(
                "tuning the tokenizer, retrieval or the network will not help: the engine is "
                "the bottleneck" + _gpu_text(c)
            ),
        ],
        ("queue_ns", "prefill_ns", "itl_ns"),
    ),
    CauseRule(
        "batching",
        frozenset({"queue", "decode", "rest"}),
        _engine_rest(_batching),
        lambda c: [
            Advice(
                "shorten or remove the batching window, or raise the engine's per-step token budget "
                "(vLLM's --max-num-batched-tokens) where prompts wait for it; cap the batch for "
                "interactive endpoints and serve bulk traffic from separate replicas",
                SHRINK_BATCH_WINDOW,
            )
        ],
        lambda c: [
            Advice(
                "adding GPUs will not help: the engine has free slots and KV room while requests wait" + _gpu_text(c),
                ADD_CAPACITY,
            )
        ],
        ("queue_ns", "itl_ns", "decode_ns"),
    ),
    CauseRule(
        "queueing",
        frozenset({"queue"}),
        _always,
        lambda c: [
            Advice(
                "find the queue in front of the engine (gateway workers, client pools, a "
                "rate limiter) and widen it, or rate-limit bulk traffic"
            )
            if c.engine.reported
            else Advice(
                "export the engine's queue depth and running batch (its /metrics) so capacity "
                "can be told from an upstream queue"
            )
        ],
        lambda c: (
            [Advice("faster tokenization or retrieval will not help: requests wait in a queue")]
            + (
                [Advice("adding GPUs will not help: no request waits in the engine", ADD_CAPACITY)]
                if c.engine.reported and not c.engine.waiting_steps
                else []
            )
        ),
        ("queue_ns",),
    ),
    CauseRule(
        "unexplained",
        frozenset({"gateway", "rest", "model", "postprocess", "other"}),
        _always,
        lambda c: [Advice("instrument the missing stages (inferpath.stage around the code the time is in)")],
        lambda c: [],
        (),
    ),
)
"""Every cause that can claim stage time, in the troubleshooting order (module docstring)."""

BY_NAME = {rule.name: rule for rule in REGISTRY}


def cause_of(stage: str, context: Context) -> str:
    """The name of the first rule in :data:`REGISTRY` that claims ``stage``'s time;
    ``unexplained`` when none lists the stage."""
    for rule in REGISTRY:
        if stage in rule.stages and rule.claims(stage, context):
            return rule.name
    return "unexplained"


COLD_START_HELP = [
    Advice(
        "keep warm replicas (a minimum replica count), preload weights, and route to a replica only once it is ready"
    )
]
COLD_START_NOT_HELP = [Advice("more steady-state capacity will not help requests that land on a starting replica")]


def consistent_advice(helps: list[list[Advice]], not_helps: list[list[Advice]]) -> list[list[Advice]]:
    """``not_helps`` with every item dropped whose action another cause recommends in ``helps``."""
    recommended = {a.action for items in helps for a in items if a.action}
    return [[a for a in items if a.action is None or a.action not in recommended] for items in not_helps]


__all__ = [
    "ADD_CAPACITY",
    "BY_NAME",
    "COLD_START_HELP",
    "COLD_START_NOT_HELP",
    "GPU_HEADROOM_RATIO",
    "GPU_SATURATED_RATIO",
    "KV_ROOM",
    "RAISE_BATCH_LIMIT",
    "REGISTRY",
    "SHRINK_BATCH_WINDOW",
    "Advice",
    "CauseRule",
    "Context",
    "cause_of",
    "consistent_advice",
]
