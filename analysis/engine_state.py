"""What held requests back inside the engine, read from its own gauges at the same moments.

A continuously batching engine (vLLM, SGLang, TGI, TRT-LLM) admits a waiting request into
the running batch as soon as it has both a free sequence slot and enough free KV-cache
blocks for it. So at any moment when requests wait in the engine's queue, exactly one of
three things is true, and the engine's gauges tell which:

- **slots**: the running batch is at its limit (``max-num-seqs`` in vLLM). The engine is at
  its compute capacity: more replicas or a larger batch limit help; a shorter batching
  window does not.
- **memory**: slots are free but the next request's KV blocks are not, or running sequences
  were preempted (vLLM preempts only when it runs out of blocks). The next request's need is
  not exported, so it is estimated from the sequences the window ran: a step is memory-bound
  when the free share of the pool is smaller than what one average sequence running at that
  step holds (:func:`kv_full_at`) or, below a configured batch limit, smaller than a large
  sequence of the window (:func:`sequence_share`, the largest usage per running sequence). A pool that two
  long prompts fill leaves 40 % free between them, yet the next long prompt does not fit.
- **held**: slots and KV blocks are free and the request still waits: the scheduler holds it
  (a batching window, or a per-step token budget). That is not a capacity problem.

The slot limit is the configured one where a source reports it, else the largest running
batch seen in the window and its baseline: an engine that queued while running stayed
below its own earlier peak was not out of slots; in a window with preemptions the observed
peak is what memory allowed, so waiting steps there count as memory-bound. Each aligned step (the signal grid of
:mod:`~inferpath.analysis.signals`, one scrape interval) that carries a new reading is one
observation (:func:`fresh_steps`: a late scrape looked up again at the next steps counts
once); the verdict quotes the counts, so the evidence can be checked against the raw scrapes.

An engine that exports no gauges but traces its requests alone (vLLM with
``--otlp-traces-endpoint`` and no scrape) still shows its queue and running batch in its
spans: :func:`engine_state_from_spans` counts them every second. A running batch at its own
peak while requests wait is the slots'; below it, a full KV cache and a scheduler's hold look
the same without KV usage, and those steps stay unclassified.

Several engines (replicas) are read one by one: each waiting engine against its own limit,
running batch and KV pool, and a step takes the class of the engine with the longest queue.
Summed over a fleet, a queue in front of a full engine beside a half-empty one would read
as a hold (two real vLLM servers of 4 slots each, round robin: waiting steps at 7 of 8
running were each a full engine's). ``slot_limit`` is then the fleet's (the sum of the
engines' limits, the capacity of the summed running batch).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from inferpath.analysis.percentiles import quantile
from inferpath.analysis.signals import Step, WindowSignals

KV_FULL_RATIO = 0.9
"""KV-cache usage at which a paged pool has no room left for a new sequence's prompt (vLLM's
scheduler also keeps a small watermark of blocks free, so usage rarely reads 1.0)."""
WAITING_MIN = 1.0
"""A step counts as *waiting* when at least one request is in the engine's queue."""


SEQUENCE_SHARE_QUANTILE = 1.0
"""Which sequence of the window a waiting request is assumed to be as large as: the largest
the window ran (the head of the queue can be any prompt; a long one waits when a short one
would not). A high quantile below 1 took, over the few steps of a short window, a value
between the two largest: in an emulated engine whose one running sequence held 87 % of a
160-block pool, steps with 80 % free and 5-9 requests waiting read as a scheduler's hold."""


def sequence_share(steps: Sequence[tuple[float | None, float | None, float | None]]) -> float | None:
    """KV share (ratio of the pool) of a large sequence of the window: the
    :data:`SEQUENCE_SHARE_QUANTILE` of ``usage / running`` over steps with both reported and a
    sequence running; ``None`` when there are none."""
    shares = [kv / run for _, run, kv in steps if run is not None and run >= 1 and kv is not None]
    return quantile(shares, SEQUENCE_SHARE_QUANTILE) if shares else None


def kv_full_at(running: float) -> float:
    """KV usage (ratio) at which one more sequence does not fit beside ``running`` ones: the
    free share is below what an average running sequence holds, ``usage / running``, i.e.
    usage ≥ running / (running + 1); capped at :data:`KV_FULL_RATIO`. Two sequences fill a
    pool at 67 %, sixteen only at 90 %."""
    if running < 1:
        return KV_FULL_RATIO
    return min(KV_FULL_RATIO, running / (running + 1.0))


@dataclass(frozen=True)
class EngineState:
    """The engine's state over one window, from aligned steps.

    ``steps``: steps with a queue depth; ``waiting_steps``: of those, steps with a request
    waiting; ``slot_bound_steps`` / ``memory_bound_steps`` / ``held_steps``: waiting steps
    split by what held the queue (module docstring; they add up to ``waiting_steps`` when
    running is reported, else all are 0); ``slot_limit``: running-batch limit used (requests);
    ``limit_source``: ``"configured"`` or ``"observed max"``; ``running_max`` /
    ``queue_max``: largest values seen; ``kv_waiting_p90``: p90 of KV usage over waiting
    steps (ratio, ``None`` when not reported); ``preemptions``: counter increase over the
    window (``None`` when not reported); ``engines``: engines read one by one (1 when the
    window's series could not be told apart per engine), ``engine_limits`` their limits."""

    steps: int
    waiting_steps: int
    slot_bound_steps: int
    memory_bound_steps: int
    held_steps: int
    slot_limit: float | None
    limit_source: str
    running_max: float | None
    queue_max: float | None
    kv_waiting_p90: float | None
    kv_max: float | None
    preemptions: float | None
    engines: int = 1
    engine_limits: tuple[float, ...] = ()
    source: str = "gauges"
    """``"gauges"``: the engine's own queue depth, running batch and KV usage; ``"spans"``:
    queue and running batch counted from its request spans (:func:`engine_state_from_spans`);
    ``"spans and scrapes"``: counted from its spans, with KV usage and preemptions from its
    scrapes (:func:`engine_state_between_scrapes`)."""
    scraped_waiting_steps: int | None = None
    """With ``"spans and scrapes"``: the waiting steps the scrapes themselves showed."""

    @property
    def reported(self) -> bool:
        """The engine reported its queue depth in this window."""
        return self.steps > 0

    @property
    def waiting_share(self) -> float:
        """Share (ratio) of steps with requests waiting in the engine."""
        return self.waiting_steps / self.steps if self.steps else 0.0

    @property
    def bound(self) -> str | None:
        """What held the queue in most waiting steps: ``"slots"``, ``"memory"``, ``"held"``,
        or ``None`` when nothing waited or running was not reported. Memory wins a tie with
        slots: a batch at its limit *and* a full KV pool need KV room first (more slots
        would only preempt more)."""
        counts = {"memory": self.memory_bound_steps, "slots": self.slot_bound_steps, "held": self.held_steps}
        if not self.waiting_steps or not any(counts.values()):
            return None
        return max(counts, key=lambda k: counts[k])

    @property
    def memory_pressure(self) -> bool:
        """Any preemption in the window, any waiting step held by a full KV pool, or KV usage
        near full while requests waited."""
        return bool(
            (self.preemptions or 0) > 0
            or self.memory_bound_steps > 0
            or (self.kv_waiting_p90 is not None and self.kv_waiting_p90 >= KV_FULL_RATIO)
        )

    def text(self) -> str:
        """The counts in words, e.g. ``requests waited in 41 of 60 steps; what held them: the
        KV cache (…) in 0, the running batch at its limit of 4 (…) in 39, nothing (free slots
        and KV) in 2``. Each waiting step counts once, the KV cache first: a step with a full
        batch *and* no KV room is the KV cache's (:attr:`bound`)."""
        if not self.reported:
            return "the engine reported no queue depth"
        if not self.waiting_steps:
            return f"no request waited in the engine in {self.steps} steps"
        if self.source == "spans":
            limit = "n/a" if self.slot_limit is None else f"{self.slot_limit:.0f}"
            return (
                f"counted from the engine's request spans (it exported no queue depth): requests waited in the "
                f"engine in {self.waiting_steps} of {self.steps} one-second steps (queue max "
                f"{self.queue_max or 0:.0f}), with its running batch at its peak of {limit} in "
                f"{self.slot_bound_steps} of them; KV-cache usage is not known"
            )
        if self.engines == 1:
            limit = "n/a" if self.slot_limit is None else f"{self.slot_limit:.0f}"
            where, batch = "the engine", f"running batch at its limit of {limit} ({self.limit_source})"
            if self.source == "spans and scrapes":
                where = (
                    f"the engine (counted from its request spans at each step: its scrapes, further apart, showed "
                    f"requests waiting in {self.scraped_waiting_steps} steps; KV usage as of its latest scrape)"
                )
        else:
            limits = sorted({f"{v:.0f}" for v in self.engine_limits}, key=float) or ["n/a"]
            where = f"{self.engines} engines"
            batch = f"an engine's running batch at its limit ({'/'.join(limits)} per engine, {self.limit_source})"
        return (
            f"requests waited in {where} in {self.waiting_steps} of {self.steps} steps (queue max "
            f"{self.queue_max or 0:.0f}); what held them, each step counted once and the KV cache first: "
            f"the KV cache without room for the next sequence (full, preempting, or less free than a large "
            f"sequence of the window takes) in {self.memory_bound_steps}, {batch} in "
            f"{self.slot_bound_steps}, nothing (free slots and KV) in {self.held_steps}"
        )


def _held_by(run: float, kv: float | None, limit: float, configured: bool, share: float | None, preempted: bool) -> str:
    """What held a waiting step: ``"memory"``, ``"slots"`` or ``"held"`` (module docstring),
    from its running batch ``run``, KV usage ``kv`` (ratio, ``None`` when not reported), the
    slot ``limit`` (``configured`` or the observed peak), the KV ``share`` of a large sequence
    of the window (:func:`sequence_share`) and whether the engine ``preempted`` in the window."""
    below_limit = not configured or run < limit
    no_room = kv is not None and share is not None and 1.0 - kv < share
    if (kv is not None and kv >= kv_full_at(run)) or ((preempted or no_room) and below_limit):
        # Preempted sequences mean the pool ran out of blocks; no room for a sequence as large
        # as the window's own means the next one did not fit. A peak observed then is what
        # memory allowed, not a batch limit; a configured limit reached is the slots'.
        return "memory"
    return "slots" if run >= limit else "held"


def fresh_steps(per_engine: Mapping[object, Sequence[Step]]) -> list[int]:
    """Indices of the aligned steps to count: every step but a waiting one whose every engine
    reads exactly what it read at the step before. That one holds the same scrape, looked up
    again "as of" a later time (a scrape that came late, every few seconds on a busy host):
    counted once, a reading taken between a request's end and the next admission (a batch
    pinned at its limit that reads one below it) weighs what any other reading does, however
    long the next scrape took. (An idle engine reads the same in every scrape: idle steps
    all count, as the steps carry no scrape time to tell a repeat.)"""
    fresh: list[int] = []
    previous: tuple[Step | None, ...] | None = None
    for i in range(max((len(v) for v in per_engine.values()), default=0)):
        current = tuple(v[i] if i < len(v) else None for v in per_engine.values())
        waiting = any(step is not None and (step[0] or 0) >= WAITING_MIN for step in current)
        if current != previous or not waiting:
            fresh.append(i)
        previous = current
    return fresh


def sampled_sparsely(window: WindowSignals) -> bool:
    """The engine's readings change at fewer than half of the window's steps: its scrapes
    come further apart than the signal grid (a 15 s Prometheus interval on a grid of 1 s), or
    it sat unchanged. Either way a queue that came and went between two scrapes does not show
    in them, and its spans are worth reading (:func:`engine_state_between_scrapes`)."""
    steps = window.steps
    readings = 1 + sum(steps[i] != steps[i - 1] for i in range(1, len(steps)))
    return bool(steps) and 2 * readings < len(steps)


def engine_state(
    window: WindowSignals, *, other: WindowSignals | None = None, configured_limit: float | None = None
) -> EngineState:
    """Classify ``window``'s waiting steps (module docstring), engine by engine where
    :attr:`~inferpath.analysis.signals.WindowSignals.engines` tells them apart. ``other``:
    the baseline's signals, whose running peak also bounds the observed slot limit;
    ``configured_limit``: one engine's configured batch limit (requests) when known."""
    per_engine: dict[object, list[Step]] = dict(window.engines) or {None: window.steps}
    other_engines: dict[object, list[Step]] = {}
    if other is not None:
        other_engines = dict(other.engines) if window.engines else {None: other.steps}
    fleet_preempted = (window.preemptions or 0) > 0
    limits: dict[object, float | None] = {}
    source = "configured" if configured_limit else "observed max"
    for key, engine_steps in per_engine.items():
        peak = max((s[1] for s in [*engine_steps, *other_engines.get(key, [])] if s[1] is not None), default=None)
        limits[key] = float(configured_limit) if configured_limit else peak
    large = {key: sequence_share(engine_steps) for key, engine_steps in per_engine.items()}
    counts = {"slots": 0, "memory": 0, "held": 0}
    waiting_steps = 0
    fresh = fresh_steps(per_engine)
    for i in fresh:
        queued = [(key, v[i]) for key, v in per_engine.items() if i < len(v) and (v[i][0] or 0) >= WAITING_MIN]
        if not queued:
            continue
        waiting_steps += 1
        key, (_, run, kv) = max(queued, key=lambda kv_: kv_[1][0] or 0)
        limit = limits[key]
        if run is None or limit is None:
            continue
        # An engine's own counter where it is told apart: another engine's preemptions say
        # nothing of this one's KV pool.
        preempted = window.engine_preemptions[key] > 0 if key in window.engine_preemptions else fleet_preempted
        counts[_held_by(run, kv, limit, source == "configured", large[key], preempted)] += 1
    running = [s[1] for s in window.steps if s[1] is not None]
    known = [v for v in limits.values() if v is not None]
    steps = [window.steps[i] for i in fresh if i < len(window.steps) and window.steps[i][0] is not None]
    kv_waiting = [s[2] for s in steps if s[0] >= WAITING_MIN and s[2] is not None]  # type: ignore[operator]
    kv_all = [s[2] for s in window.steps if s[2] is not None]
    return EngineState(
        steps=len(steps),
        waiting_steps=waiting_steps,
        slot_bound_steps=counts["slots"],
        memory_bound_steps=counts["memory"],
        held_steps=counts["held"],
        slot_limit=math.fsum(known) if known else None,
        limit_source=source,
        running_max=max(running, default=None),
        queue_max=max((s[0] for s in steps), default=None),  # type: ignore[type-var]
        kv_waiting_p90=quantile(kv_waiting, 0.9) if kv_waiting else None,
        kv_max=max(kv_all, default=None),
        preemptions=window.preemptions,
        engines=len(per_engine),
        engine_limits=tuple(known),
    )


def counted_from_spans(spans: Sequence[tuple[int, int, int]], times: Sequence[int]) -> list[tuple[int, int]]:
    """``(queued, running)`` at each of ``times`` (ns) from one engine's requests, one
    ``(arrival, scheduled, end)`` each (ns): queued from its arrival until it is scheduled,
    running from then until its last token."""
    arrivals = sorted(a for a, _, _ in spans)
    scheduled = sorted(s for _, s, _ in spans)
    finished = sorted(e for _, _, e in spans)
    return [
        (bisect_right(arrivals, t) - bisect_right(scheduled, t), bisect_right(scheduled, t) - bisect_right(finished, t))
        for t in times
    ]


def sustained_peak(running: Sequence[int]) -> int:
    """The largest running batch counted from request spans at two consecutive steps (0 for
    none; the largest at all with a single step). A span's first and last token are placed
    from the API server's times, which lag the engine's by up to a second on a busy host: a
    request that ended in the engine is still counted while its successor already runs, and a
    batch pinned at 5 of 5 read 6 at one step in 42. Such an overlap is shorter than a step;
    a batch at its limit stays there."""
    pairs = [min(a, b) for a, b in zip(running, running[1:])]
    return max(pairs, default=max(running, default=0))


def engine_state_between_scrapes(
    window: WindowSignals,
    spans: Sequence[tuple[int, int, int]],
    times: Sequence[int],
    *,
    scraped_waiting_steps: int,
    configured_limit: float | None = None,
) -> EngineState:
    """One engine's queue and running batch counted from its request spans at each step of
    the signal grid, each waiting step judged with the KV usage of the engine's latest scrape
    and its preemptions in the window: for scrapes too far apart to catch a queue that came
    and went between them (a 15 s Prometheus interval over a burst of seconds).

    ``spans``: one ``(arrival, scheduled, end)`` per request (ns, :func:`counted_from_spans`);
    ``times``: the as-of instant (ns) of each step of ``window.steps`` (as many);
    ``scraped_waiting_steps``: the waiting steps the scrapes themselves showed (quoted in the
    text). The slot limit is the configured one, else the spans' own running peak
    (:func:`sustained_peak`); the KV share of a large sequence (:func:`sequence_share`) is
    read from the scrapes' own steps, whose running batch and KV usage are of one moment.
    Source ``"spans and scrapes"``."""
    counted = counted_from_spans(spans, times)
    peak = sustained_peak([run for _, run in counted])
    limit = float(configured_limit) if configured_limit else float(peak)
    share = sequence_share(window.steps)
    preempted = (window.preemptions or 0) > 0
    counts = {"slots": 0, "memory": 0, "held": 0}
    kv_waiting: list[float] = []
    waiting = 0
    for (queued, run), (_, _, kv) in zip(counted, window.steps):
        if queued < WAITING_MIN:
            continue
        waiting += 1
        if kv is not None:
            kv_waiting.append(kv)
        if limit > 0:
            counts[_held_by(run, kv, limit, bool(configured_limit), share, preempted)] += 1
    kv_all = [s[2] for s in window.steps if s[2] is not None]
    return EngineState(
        steps=len(counted),
        waiting_steps=waiting,
        slot_bound_steps=counts["slots"],
        memory_bound_steps=counts["memory"],
        held_steps=counts["held"],
        slot_limit=limit if limit > 0 else None,
        limit_source="configured" if configured_limit else "observed max",
        running_max=float(peak),
        queue_max=float(max((q for q, _ in counted), default=0)),
        kv_waiting_p90=quantile(kv_waiting, 0.9) if kv_waiting else None,
        kv_max=max(kv_all, default=None),
        preemptions=window.preemptions,
        source="spans and scrapes",
        scraped_waiting_steps=scraped_waiting_steps,
    )


def engine_state_from_spans(
    intervals: Mapping[object, Sequence[tuple[int, int, int]]], step_ns: int = 1_000_000_000
) -> EngineState:
    """The engine's queue and running batch counted from its request spans, for an engine
    that exports no gauges: ``intervals`` per engine (replica), one ``(arrival, scheduled,
    end)`` per request (wall clock, ns: it waits in the queue from its arrival until it is
    scheduled, then runs until its last token). Read every ``step_ns`` from the first arrival
    to the last schedule, like a scrape; each engine's slot limit is its own running peak
    (:func:`sustained_peak`, observed max). A waiting step is slot-bound when the engine with the longest queue ran
    at that peak; the others stay unclassified (``memory_bound_steps`` and ``held_steps``
    are 0): without KV usage a full KV cache cannot be told from a scheduler's hold."""
    starts = [a for spans in intervals.values() for a, _, _ in spans]
    ends = [s for spans in intervals.values() for _, s, _ in spans]
    if not starts:
        return EngineState(0, 0, 0, 0, 0, None, "observed max", None, None, None, None, None, source="spans")
    times = range(min(starts), max(ends) + 1, step_ns)
    grids = {key: counted_from_spans(spans, times) for key, spans in intervals.items()}
    limits = {key: sustained_peak([run for _, run in grid]) for key, grid in grids.items()}
    waiting = slots = 0
    for i in range(len(times)):
        key, (queued, run) = max(((k, g[i]) for k, g in grids.items()), key=lambda item: item[1][0])
        if queued >= WAITING_MIN:
            waiting += 1
            slots += run >= limits[key] > 0
    return EngineState(
        steps=len(times),
        waiting_steps=waiting,
        slot_bound_steps=slots,
        memory_bound_steps=0,
        held_steps=0,
        slot_limit=float(sum(limits.values())),
        limit_source="observed max",
        running_max=float(max((sum(g[i][1] for g in grids.values()) for i in range(len(times))), default=0)),
        queue_max=float(max((sum(g[i][0] for g in grids.values()) for i in range(len(times))), default=0)),
        kv_waiting_p90=None,
        kv_max=None,
        preemptions=None,
        engines=len(grids),
        engine_limits=tuple(float(v) for v in limits.values()),
        source="spans",
    )


def steps_of(
    queue: Sequence[float | None], running: Sequence[float | None], kv: Sequence[float | None]
) -> list[tuple[float | None, float | None, float | None]]:
    """Aligned steps from three equal-length columns (tests, other sources)."""
    return list(zip(queue, running, kv))


__all__ = [
    "KV_FULL_RATIO",
    "SEQUENCE_SHARE_QUANTILE",
    "WAITING_MIN",
    "EngineState",
    "counted_from_spans",
    "engine_state",
    "engine_state_between_scrapes",
    "engine_state_from_spans",
    "fresh_steps",
    "kv_full_at",
    "sampled_sparsely",
    "sustained_peak",
    "sequence_share",
    "steps_of",
]
