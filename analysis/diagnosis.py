"""Name the bottleneck of any window: against latency objectives, and against a baseline when given.

The order an SRE would follow, and what each step looks at:

1. **Is the window healthy?** Every endpoint class meets its latency objectives
   (:mod:`~inferpath.analysis.objectives`, e.g. interactive TTFT p99 ≤ 1 s), its tail does
   not diverge from its average (p99 ≥ 5× mean), and, with a baseline that itself met the
   objectives, no measure regressed against it (p99 up by half and by 10 ms or more, or the
   median up by half and by 50 ms).
   A baseline that breaks the objectives is reported as such and never makes the window
   healthy.
2. **Which measure**: TTFT first (every stage before the first token lives in it), else E2E
   (an ITL objective or regression shows up as decode time).
3. **Where the time sits**: in the *tail band* (requests at or above the window's p90 of the
   measure) the mean of every stage is taken. Means add up (measure = stages + rest) where
   percentiles do not. Against a healthy baseline the causes share the *growth* of the tail's
   mean; otherwise they share the tail's time itself, which is what an always-slow endpoint
   needs to know.
4. **Why**: each stage's time goes to the first cause of the registry
   (:mod:`~inferpath.analysis.causes`) that claims it, from the engine's own state at the same
   moments (:mod:`~inferpath.analysis.engine_state`: when requests waited in the engine, was
   the batch at its limit, the KV cache full, or was there room?).
5. **Cold start**: requests that arrived before their replica was ready, or that a replica
   served measurably slower than its own steady state right after it started, are charged
   to ``cold_start`` whole (:func:`cold_start_rows`).

Causes below :data:`MIN_CAUSE_SHARE` are dropped; the rest come ordered by share, each with
its evidence and advice, and advice that another cause of the same verdict contradicts is
dropped (:func:`~inferpath.analysis.causes.consistent_advice`).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, cast

from inferpath.analysis.breakdown import REST, measure_stages, stage_columns
from inferpath.analysis.budget import ttft_budget
from inferpath.analysis.causes import (
    BY_NAME,
    COLD_START_HELP,
    COLD_START_NOT_HELP,
    Advice,
    Context,
    cause_of,
    consistent_advice,
)
from inferpath.analysis.correlate import spearman
from inferpath.analysis.engine_histograms import fetch_window_histograms
from inferpath.analysis.engine_state import (
    EngineState,
    engine_state,
    engine_state_between_scrapes,
    engine_state_from_spans,
    sampled_sparsely,
)
from inferpath.analysis.objectives import (
    DEFAULT_OBJECTIVES,
    ObjectiveResult,
    Objectives,
    TailResult,
    tail_diverges,
)
from inferpath.analysis.request_window import (
    WINDOW_COLUMNS,
    HistogramWindow,
    RowsWindow,
    StoredWindow,
    TailSums,
    as_window,
    failed_requests,
    prefetch_quantiles,
    prepare_attribution,
)
from inferpath.analysis.signals import SignalWindows, WindowSignals, alignment_grid, window_step_seconds
from inferpath.analysis.startup import ReplicaStartup, StoredStartups
from inferpath.analysis.timeline_query import StoredSignalWindows
from inferpath.analysis.verdict import (
    MIN_CAUSE_SHARE,
    MIN_REQUESTS,
    TAIL_QUANTILE,
    BaselineInfo,
    Cause,
    Degradation,
    Evidence,
    InsufficientDataError,
    Verdict,
    Window,
)
from inferpath.storage.rows import unix_ns_from_datetime
from inferpath.vocabulary import (
    DEFAULT_ENDPOINT_CLASS,
    ENGINE_SEND_COLUMN,
    GPU_UTILIZATION_RATIO,
    KV_CACHE_USAGE_RATIO,
    PREEMPTIONS_TOTAL,
    QUEUE_DEPTH,
    RUNNING_REQUESTS,
    UNCLASSIFIED,
    share_basis,
)

DEGRADED_RATIO = 1.5
"""A p99 must rise by half to count as a regression: run-to-run p99 noise over a few hundred
requests of an unchanged service stays within about ±30%."""
MIN_MEDIAN_DEGRADATION_NS = 50_000_000
"""A median that rose by half and by 50 ms is a regression even when the p99 did not rise by
half: every other request is that much slower (a tokenizer made 0.8 s slower on a real vLLM
behind the demo gateway: TTFT p50 0.35 → 1.06 s while the p99, already 2.4 s from the busy
machine's outliers, rose 1.43×). 50 ms, because a median moves a few ms with the load alone."""
MIN_DEGRADATION_NS = 10_000_000
"""...and by at least 10 ms, so a 2 ms → 4 ms ITL wobble is not a finding."""
SMALL_WINDOW_REQUESTS = 100
"""Below 100 values a p99 is the window's maximum (or next to it)."""
HOP_FLOOR_QUANTILE = 0.10
"""The wire's share of a hop is what nine requests in ten paid at least: its p10 over the
window. A delay on the wire (an extra proxy, a distant region) raises every request's hop;
the time a busy callee takes to pick a request up comes and goes with its load. Measured on
real vLLM behind the demo gateway: under saturation the hop's p10 stayed at 12-24 ms while
its tail band averaged 2.2-2.5 s (vLLM's API server before its engine span); the demo's
+250 ms proxy puts the p10 itself at ~250 ms."""
HOP_QUEUE_RHO = 0.5
"""A hop's wait above its floor is a queue in front of the engine when the requests that
waited longer are the ones that found more requests already waiting: Spearman's ρ between
each request's wait and that backlog at least this (a large correlation by Cohen's
convention). A wire's delay, or a proxy's fixed hold, does not grow with the backlog; a queue
does, whatever holds it (a client connection pool, a concurrency limit, too few workers).
Real vLLM behind the demo gateway with a pool of 4 (6) connections to it: ρ 0.65 (0.76),
the engine never queued. The margin is thin: behind the demo's proxy holding each request
1 s, on the same two busy cores, the proxy's own backlog gave ρ 0.53; there the caller read
most of the slow streams late, in one lump, and that evidence keeps the hop's
(:func:`_hop_doors`)."""
SEND_MEASURED_SHARE = 0.9
"""The hop's trip out (``engine_send_ns``) is read when nine rows in ten with a hop measured
it; otherwise (a window reaching back before schema 016, hops into no engine span) the whole
network stage is."""
HOP_QUEUE_MIN_WAITERS = 10
"""Fewer requests waiting above the floor cannot show that shape."""
UPSTREAM_QUEUE = "upstream_queue"
"""The budget's name for a hop's wait in a queue in front of the engine (:func:`_hop_doors`)."""
LUMP_STREAM_RATIO = 0.25
"""A streamed response reached its caller in one lump when the caller saw its first and last
token closer together than a quarter of the engine's own decode (first to last token): the
engine made the tokens over its decode, and they were read all at once, late. Seen on real
vLLM with the load client starved of CPU on the same two cores (first token 2-9 s after the
send, last token a few ms after it, the engine's decode 1-2 s)."""
LUMP_ADVICE = (
    "the tokens were read late, in one lump: look at the caller's side (an event loop or process "
    "starved of CPU reads its streams late, and sends late too) and at any proxy that buffers "
    "streamed responses"
)
"""The network_hop advice where most of the tail's streams were read in one lump; where it
comes first, the TTFT budget names the caller's side for the hop's time too."""
LUMP_MIN_DECODE_NS = 50_000_000
"""...counted only where the engine's decode took 50 ms at least, so that a short answer
delivered in one network read is not taken for one."""
LUMP_FIRST_FLOOR_SHARE = 0.10
"""The late read's advice comes before the hop's own when the hop's floor is under a tenth of
the time the hop takes in the tail (no wire delay that every request paid stands out)."""
FAILED_SHARE_MAX = 0.05
"""A window in which 5 % of the requests or more failed (``error`` or ``incomplete``) is not
healthy, whatever the latency of the rest: the default rule pack's ``ErrorRateHigh`` pages at
the same share."""
ENGINE_CAUSES = frozenset({"gpu_memory", "gpu_compute", "batching"})
"""Causes inside the engine: a hop into an engine that held requests gives them its excess
(:func:`_hop_doors`)."""
PRE_ENGINE_STAGES = ("gateway", "tokenize", "retrieval", "network")
"""Stages before the engine: a tail band with none measured has the engine's own TTFT."""
ENGINE_ONLY_NOTE = (
    "the TTFT and E2E judged here are the engine's own, from the request's arrival in the engine: no span "
    "of a caller or a gateway is in the window, so the time before it (the engine's API server, the "
    "network, the caller) is not seen; instrument the caller or the gateway to judge what users wait for"
)
"""The note of a degraded window whose requests carry only the engine's span (vLLM's own
tracing): its TTFT starts at the engine's arrival (vLLM's ``arrival_time``)."""
OPENING_STEPS = 3
"""A backlog held while an engine started reaches it as it opens: within its first two
readings (the scrape that found it ready and the next; retrying clients and a balancer's
queue send at once), which lie in the first three steps of the signal grid whatever its
phase against the scrapes."""
SPAN_COVERAGE_MIN = 0.8
"""Where the request spans hold fewer than this share of the first tokens the engine's own
TTFT histogram counted (and :data:`~inferpath.analysis.verdict.MIN_REQUESTS` fewer at least),
the spans miss requests: the histograms judge the window (:func:`diagnose`)."""
COUNTED_NOTE = (
    "judged from the engine's own latency histograms (TTFT, queue time, E2E: {counted} first tokens counted in "
    "the window, {spans} request spans{why}): quantiles are estimated inside the histograms' buckets and causes "
    "share the mean request's time (its growth, against a baseline), as the histograms hold no per-request split"
)
"""The note of a verdict judged from the engine's histograms (:func:`diagnose`)."""
ENGINE_STAGES = ("queue", "prefill", "decode")
"""Stages inside the engine; their evidence says so ("engine queue p99"), beside a queue in
front of the engine."""
BATCH_GROWTH_RATIO = 1.5
"""Running requests (batch size) up by half: each decode step now carries 1.5× the tokens."""
HELD_QUEUE_RATIO = 0.5
"""A hold on every request (a batching window, a fixed scheduling delay) raises the median
queue time by at least half as much as the p90; queueing behind bursts lengthens the slow end
far more than the median. Without a baseline: the median queue time is at least half the p90."""
MIN_HELD_QUEUE_NS = 10_000_000
"""...and the median must be (or rise by) 10 ms at least to be a hold rather than noise."""
COLD_START_LOOKBACK_SECONDS = 120.0
"""How far before a window a replica's readiness is still looked for: a replica that became
ready shortly before the window may still serve its first, slow requests inside it."""
COLD_RECOVERY_RUN = 3
"""A starting replica has warmed up once this many of its requests in a row are no slower
than its steady state (its later requests' p90)."""
COLD_MIN_SLOW = 3
"""...and its start is only called cold when at least this many requests before that were."""
COLD_PEER_RATIO = 2.0
"""A starting replica whose median is twice its warm peers' in the same window is still cold,
even when its own warm-up outlasts the window (so its later requests cannot show its steady state)."""

DIAGNOSIS_COLUMNS: tuple[str, ...] = WINDOW_COLUMNS
"""The request columns the rules read."""

Rows = Sequence[Mapping[str, Any]] | RowsWindow | StoredWindow
"""A window's requests: request-row dicts, or a :mod:`~inferpath.analysis.request_window` window."""
Signals = SignalWindows | StoredSignalWindows
"""The windows' engine/GPU signals, held or read from the store on first use."""


# ---------------------------------------------------------------------------- measures


def degradation(measure: str, current_rows: Rows, baseline_rows: Rows) -> Degradation:
    """Compare ``measure``'s exact p99 between windows; degraded when it rose by both
    :data:`DEGRADED_RATIO` and :data:`MIN_DEGRADATION_NS`. When either window holds fewer
    than :data:`SMALL_WINDOW_REQUESTS` values, its p99 is its slowest request or two, so the
    p90 must rise by :data:`DEGRADED_RATIO` too: one request stalled by the host is not a
    regression of the service."""
    current, baseline = as_window(current_rows), as_window(baseline_rows)
    column = f"{measure}_ns"
    cur, base = current.quantile(column, 0.99), baseline.quantile(column, 0.99)
    if cur is None or base is None:
        return Degradation(measure, base, cur, None, False)
    ratio = cur / base if base > 0 else math.inf
    degraded = ratio >= DEGRADED_RATIO and cur - base >= MIN_DEGRADATION_NS
    if degraded and min(current.measured(column), baseline.measured(column)) < SMALL_WINDOW_REQUESTS:
        cur90, base90 = current.quantile(column, 0.9), baseline.quantile(column, 0.9)
        degraded = cur90 is not None and base90 is not None and cur90 >= DEGRADED_RATIO * base90
    cur50, base50 = current.quantile(column, 0.5), baseline.quantile(column, 0.5)
    by = "p99"
    if not degraded and cur50 is not None and base50 is not None:
        if cur50 >= DEGRADED_RATIO * base50 and cur50 - base50 >= MIN_MEDIAN_DEGRADATION_NS:
            degraded, by = True, "p50"
    return Degradation(measure, base, cur, ratio, degraded, base50, cur50, by)


def judge_objectives(rows: Rows, objectives: Objectives) -> tuple[list[ObjectiveResult], list[TailResult]]:
    """Each objective of each endpoint class present in ``rows``, and each class's TTFT tail
    (E2E where no row has a TTFT) against its mean (:func:`~inferpath.analysis.objectives.tail_diverges`)."""
    window = as_window(rows)
    results: list[ObjectiveResult] = []
    tails: list[TailResult] = []
    measures = sorted({o.measure for objs in objectives.by_class.values() for o in objs} | {"ttft", "e2e"})
    levels = sorted({0.5, 0.9, 0.99, *(o.quantile for objs in objectives.by_class.values() for o in objs)})
    stats = window.class_stats(measures, levels)
    classes = sorted({name for per in stats.values() for name in per})
    for name in classes:
        for objective in objectives.for_class(name):
            got = stats[objective.measure].get(name)
            value = got.quantiles_ns.get(objective.quantile) if got else None
            results.append(
                ObjectiveResult(
                    name,
                    objective.measure,
                    objective.quantile,
                    objective.limit_ns,
                    value,
                    got.count if got else 0,
                    None if value is None else value <= objective.limit_ns,
                )
            )
        tail_measure = "ttft" if name in stats["ttft"] else "e2e"
        got = stats[tail_measure].get(name)
        if got is not None and got.count:
            p99 = got.quantiles_ns[0.99]
            limit = next(
                (o.limit_ns for o in objectives.for_class(name) if o.measure == tail_measure and o.quantile == 0.99),
                None,
            )
            tails.append(
                TailResult(
                    name,
                    tail_measure,
                    got.mean_ns,
                    p99,
                    p99 / got.mean_ns if got.mean_ns > 0 else math.inf,
                    tail_diverges(p99, got.mean_ns, limit),
                )
            )
    return results, tails


# ---------------------------------------------------------------------------- rules on measures


def decode_slower(current_rows: Rows, baseline_rows: Rows) -> bool:
    """The typical decode step got slower: median ITL rose by :data:`DEGRADED_RATIO` and by
    1 ms at least. A decode step is one GPU pass over the batch, so a slower median step for
    the same traffic means the GPU itself is slower or busier; a batching window leaves it
    unchanged. Where the running batch grew too (:func:`batch_grew`), the larger batch makes
    each step longer by itself: that is load on the engine, not a sign that the GPU could
    not take the requests it held (``causes.Context.saturated_for_same_work``)."""
    now, before = as_window(current_rows).quantile("itl_ns", 0.5), as_window(baseline_rows).quantile("itl_ns", 0.5)
    if now is None or before is None:
        return False
    return before > 0 and now >= DEGRADED_RATIO * before and now - before >= 1_000_000


def batch_grew(signals: Signals, counted: tuple[float | None, float | None] | None = None) -> bool:
    """Mean running requests grew by :data:`BATCH_GROWTH_RATIO` or more over the baseline:
    the gauges' means, or ``counted`` (current, baseline) where the running batch was counted
    from the engine's spans (:func:`_mean_running`)."""
    current, baseline = counted or (signals.current.stat(RUNNING_REQUESTS), signals.baseline.stat(RUNNING_REQUESTS))
    if current is None or baseline is None or baseline <= 0:
        return False
    return current >= BATCH_GROWTH_RATIO * baseline


def _mean_running(
    intervals: Mapping[Any, Sequence[tuple[int, int, int]]] | None, window: Window | None
) -> float | None:
    """Mean number of the engine's requests running over ``window`` (Little's law: their
    running time inside it over its length), from ``(arrival, scheduled, end)`` per request
    (:func:`_engine_intervals`); ``None`` without either."""
    if not intervals or window is None:
        return None
    lo, hi = unix_ns_from_datetime(window[0]), unix_ns_from_datetime(window[1])
    if hi <= lo:
        return None
    running = sum(
        max(0, min(end, hi) - max(scheduled, lo)) for spans in intervals.values() for _, scheduled, end in spans
    )
    return running / (hi - lo)


def queue_held(current_rows: Rows, baseline_rows: Rows | None = None) -> bool:
    """Queue time holds the typical request, not just the tail. With a baseline: the p50 of
    ``queue_ns`` rose by ≥ :data:`MIN_HELD_QUEUE_NS` and by ≥ :data:`HELD_QUEUE_RATIO` of the
    p90's rise. Without: the p50 is ≥ :data:`MIN_HELD_QUEUE_NS` and ≥ that ratio of the p90."""
    current = as_window(current_rows)
    if not current.measured("queue_ns"):
        return False
    p50, p90 = current.quantile("queue_ns", 0.5), current.quantile("queue_ns", 0.9)
    if p50 is None or p90 is None:
        return False
    if baseline_rows is not None:
        baseline = as_window(baseline_rows)
        base50, base90 = baseline.quantile("queue_ns", 0.5), baseline.quantile("queue_ns", 0.9)
        if base50 is None or base90 is None:
            return False
        p50, p90 = p50 - base50, p90 - base90
    return p50 >= MIN_HELD_QUEUE_NS and p50 >= HELD_QUEUE_RATIO * p90


# ---------------------------------------------------------------------------- cold start


def cold_start_rows(
    current_rows: Rows,
    baseline_rows: Rows | None = None,
    startups: Sequence[ReplicaStartup] = (),
    measure: str = "ttft",
) -> dict[str, list[Mapping[str, Any]]]:
    """Per starting replica, the requests its start made slow.

    A replica is *starting* when one of ``startups`` (its start-up spans) says it became
    ready during the window or up to :data:`COLD_START_LOOKBACK_SECONDS` before it, or when
    it serves in the window and not in the baseline (its start: its first request). Charged
    to its start are: (a) requests that arrived before it was ready (they waited for it), and
    those that reached it in one wall as it opened (:func:`_held_at_opening`: the same
    requests, seen from the engine's own spans);
    (b) its first requests after that, up to the first :data:`COLD_RECOVERY_RUN` in a row
    that are no slower than its steady state (the p90 of ``measure`` over the later half of
    its requests), when at least :data:`COLD_MIN_SLOW` of them were slower; or, when warm
    replicas serve the same window, its requests above their p90 when its median is
    :data:`COLD_PEER_RATIO` × theirs or more. A replica whose
    first requests are its fastest (a queue building up later) is not a cold start,
    however soon after readiness they came.

    A start-up that names no replica serving the window (vLLM sets no instance id by
    default) applies to every replica, as when one engine serves the window. A replica that
    became ready before the window and served the baseline after that had its first
    requests there: it is not starting in the window (a real vLLM, ready a minute before the
    window and 87 requests into its baseline, was otherwise charged 31 % of a slow
    retriever's tail). :func:`diagnose` asks the store the same of the time between
    readiness and the window (:class:`~inferpath.analysis.startup.StoredStartups`).
    """
    current = as_window(current_rows)
    startups = list(startups)
    if not startups and (baseline_rows is None or current.replicas() <= as_window(baseline_rows).replicas()):
        return {}  # no start-up and no new replica: nothing to read
    column = f"{measure}_ns" if current.measured(f"{measure}_ns") else "e2e_ns"
    spans = current.replica_spans()
    measured = [span for span in spans.values() if span is not None]
    if not measured:
        return {}
    first, last = min(s[0] for s in measured), max(s[1] for s in measured)
    ready: dict[Any, datetime] = {}
    lookback = timedelta(seconds=COLD_START_LOOKBACK_SECONDS)
    for startup in startups:
        if not first - lookback <= startup.ready_at <= last:
            continue
        targets = [startup.replica] if startup.replica in spans else list(spans)
        for replica in targets:
            ready[replica] = min(startup.ready_at, ready.get(replica, startup.ready_at))
    if baseline_rows is not None:
        baseline_spans = as_window(baseline_rows).replica_spans()
        for replica in list(ready):
            # Served between its readiness and the window (in the baseline): it warmed up there.
            span = baseline_spans.get(replica)
            if span is not None and span[1] >= ready[replica] and span[0] < first:
                del ready[replica]
        known = as_window(baseline_rows).replicas()
        for replica, span in spans.items():
            if replica and replica not in known and replica not in ready and span is not None:
                ready[replica] = span[0]
    if not ready:
        return {}
    out: dict[str, list[Mapping[str, Any]]] = {}
    rows = current.rows_of(ready)
    by_replica: dict[Any, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("replica") in ready and row.get(column) is not None:
            by_replica.setdefault(row.get("replica"), []).append(row)
    # Warm replicas serving the same window under the same balancing show what steady looks like.
    peers = current.quantiles_excluding(list(ready), column, (0.5, 0.9)) if set(spans) - set(ready) else None
    for replica, served in by_replica.items():
        served.sort(key=lambda r: r["timestamp"])
        at = ready[replica]
        waited = [r for r in served if r["timestamp"] < at]
        after = [r for r in served if r["timestamp"] >= at]
        held = _held_at_opening(after, column)
        after = [r for r in after if not any(r is h for h in held)]
        waited += held
        slow = _warm_up_rows(after, column)
        if not slow and peers is not None and after:
            slow = _slower_than_peers(after, column, peers)
        if waited or slow:
            out[str(replica)] = waited + slow
    return out


def _held_at_opening(rows: Sequence[Mapping[str, Any]], column: str) -> list[Mapping[str, Any]]:
    """The requests that reached a just-ready replica in one wall as it opened and were slower
    than its steady state (:func:`_steady_edge` of the requests after them), when
    :data:`COLD_MIN_SLOW` or more; else none. The wall: the requests whose span in the engine
    began before the first of them had finished (the engine had not served one yet), and,
    where one of those waited in the engine's queue longer than the first took in all (for
    a slot or KV room, not for the scheduler's next step), every request that arrived
    before that queue was gone (each found requests of the opening still queued ahead of
    it), when it was gone within the window.
    Requests held outside while it loaded (refused connections retried, a balancer's queue)
    arrive together when it opens: seen from the engine's own spans alone, they are the
    requests that waited for it to be ready. Real vLLM starts: 77 requests within 10 ms, and
    72 within 0.2 s (a client retrying every 0.2 s), both before the first request's last
    token; 194 over 1.4 s on a loaded host, while the first (33 tokens) finished in 1.3 s and
    the 20 slots took 4 s to clear the queue. The engine span begins at the row's start plus
    the trip out of the hop into it (``engine_send_ns``) where a caller's span is the row's
    start."""
    doors = sorted(
        (
            (unix_ns_from_datetime(r["timestamp"]) + (r.get(ENGINE_SEND_COLUMN) or 0), r)
            for r in rows
            if r.get("e2e_ns") is not None and r.get(column) is not None
        ),
        key=lambda item: item[0],
    )
    if not doors:
        return []
    first_at, first = doors[0]
    first_done = first_at + first["e2e_ns"] - (first.get(ENGINE_SEND_COLUMN) or 0)
    size = sum(at <= first_done for at, _ in doors)
    # Where the wall queued (the engine's slots or KV full before its first request ended),
    # the opening lasts until a request finds that queue gone.
    queued_until, formed = first_at, False
    for index, (at, row) in enumerate(doors):
        if formed and at > queued_until:  # every request before it had been scheduled
            size = max(size, index)
            break
        queue = row.get("queue_ns") or 0
        queued_until = max(queued_until, at + queue)
        # One of the wall waited longer than the first request took in all: for a slot.
        formed = formed or (index < size and queue > first_done - first_at)
    wall = [r for _, r in doors[:size]]
    edge = _steady_edge([float(r[column]) for _, r in doors[len(wall) :]])
    held = [r for r in wall if edge is None or r[column] > edge]
    return held if len(held) >= COLD_MIN_SLOW else []


def _steady_edge(values: Sequence[float]) -> float | None:
    """The p90 of the later half of ``values`` (time order): a replica's steady state, or
    ``None`` with fewer than ``max(COLD_RECOVERY_RUN, MIN_REQUESTS // 4)`` values there."""
    from inferpath.analysis.percentiles import quantile

    half = len(values) // 2
    if len(values) - half < max(COLD_RECOVERY_RUN, MIN_REQUESTS // 4):
        return None
    return quantile(values[half:], 0.9)


def _slower_than_peers(
    rows: Sequence[Mapping[str, Any]], column: str, peers: Sequence[float]
) -> list[Mapping[str, Any]]:
    """A starting replica whose median is :data:`COLD_PEER_RATIO` × its warm peers' median or
    more, in the same window: its requests above the peers' p90 (``peers``: their p50, p90)."""
    from inferpath.analysis.percentiles import quantile

    values = [float(r[column]) for r in rows]
    peer_median, peer_p90 = peers
    if peer_median <= 0 or quantile(values, 0.5) < COLD_PEER_RATIO * peer_median:
        return []
    slow = [r for r, v in zip(rows, values) if v > peer_p90]
    return slow if len(slow) >= COLD_MIN_SLOW else []


def _warm_up_rows(rows: Sequence[Mapping[str, Any]], column: str) -> list[Mapping[str, Any]]:
    """The slow requests of a warm-up at the start of ``rows`` (time order), per
    :func:`cold_start_rows` (b); empty when the replica started warm. The steady state is the
    later half of its requests (at least :data:`MIN_REQUESTS` // 4 of them)."""
    values = [float(r[column]) for r in rows]
    half = len(values) // 2
    reference = _steady_edge(values)
    if reference is None:
        return []
    run = 0
    for index, value in enumerate(values[: half + COLD_RECOVERY_RUN]):
        run = run + 1 if value <= reference else 0
        if run == COLD_RECOVERY_RUN:
            end = index + 1 - COLD_RECOVERY_RUN
            slow = [r for r, v in zip(rows[:end], values[:end]) if v > reference]
            return slow if len(slow) >= COLD_MIN_SLOW else []
    return []


# ---------------------------------------------------------------------------- the core


def diagnose_from(
    current_rows: Rows,
    baseline_rows: Rows | None = None,
    signals: Signals | None = None,
    *,
    objectives: Objectives = DEFAULT_OBJECTIVES,
    current_window: Window | None = None,
    baseline_window: Window | None = None,
    startups: Sequence[ReplicaStartup] = (),
    configured_batch_limit: float | None = None,
    failed: Mapping[str, int] | None = None,
    failed_times: Sequence[datetime] = (),
) -> Verdict:
    """Diagnose ``current_rows`` (request-row dicts, see :mod:`inferpath.analysis.breakdown`,
    or a :mod:`~inferpath.analysis.request_window` window) against ``objectives`` and, when
    given, ``baseline_rows`` (module docstring).

    ``failed``: the window's requests that did not end ``ok``, by what they ended with
    (:func:`~inferpath.analysis.request_window.failed_requests`); they are not in the rows,
    and :data:`FAILED_SHARE_MAX` of them or more makes the window unhealthy; ``failed_times``:
    when they arrived (aware datetimes), to tell failures on a replica still loading.

    ``signals``: the engine/GPU signals of both windows (``baseline`` empty without one);
    ``startups``: engine start-ups from start-up spans (:func:`.startup.fetch_startups`);
    ``configured_batch_limit``: the engine's batch limit (requests) when known, else the
    observed peak is used. Raises :class:`InsufficientDataError` when the window has fewer
    than :data:`MIN_REQUESTS` requests with an E2E latency. A baseline with too few is
    dropped with a note.
    """
    signals = signals or SignalWindows()
    current = as_window(current_rows)
    measured = current.measured("e2e_ns")
    failed = dict(failed or {})
    failed_count = sum(failed.values())
    failed_text = ", ".join(f"{count} {what}" for what, count in failed.items())
    if measured < MIN_REQUESTS <= measured + failed_count and failed_count / (failed_count + len(current)) >= (
        FAILED_SHARE_MAX
    ):
        return _failed_verdict(current, failed, failed_count, failed_text, failed_times, startups, current_window)
    if measured < MIN_REQUESTS:
        raise InsufficientDataError(
            f"insufficient data: {measured} requests with an E2E latency in the window, need {MIN_REQUESTS}"
            + (f" ({failed_count} more failed: {failed_text})" if failed_count else "")
            + "; widen the window or wait for more traffic",
            window="current",
            count=measured,
        )
    notes: list[str] = []
    baseline = as_window(baseline_rows) if baseline_rows is not None else None
    if baseline is not None and baseline.measured("e2e_ns") < MIN_REQUESTS:
        notes.append(
            f"baseline ignored: it has {baseline.measured('e2e_ns')} requests with an E2E latency, "
            f"need {MIN_REQUESTS}; judged on the objectives alone"
        )
        baseline, baseline_window = None, None
    window = current_window or _window_of(current)
    results, tails = judge_objectives(current, objectives)
    if isinstance(current, HistogramWindow):
        notes.append(
            f"the engine's histograms carry no endpoint class: judged against the {DEFAULT_ENDPOINT_CLASS} objectives"
        )
    elif any(not r.endpoint_class for r in results):
        notes.append(
            f"'{UNCLASSIFIED}': requests whose spans name no endpoint class (inferpath.endpoint_class; an "
            f"engine's own spans carry none), judged against the {DEFAULT_ENDPOINT_CLASS} objectives"
        )
    verdict = Verdict(
        healthy=True,
        summary="",
        measure=None,
        degradations=[],
        causes=[],
        current_window=window,
        baseline_window=None,
        current_requests=len(current),
        baseline_requests=0,
        objectives=results,
        tail=tails,
        notes=notes,
        failed=failed,
        source="histograms" if isinstance(current, HistogramWindow) else "spans",
    )
    failed_share = failed_count / (failed_count + len(current)) if failed_count else 0.0
    verdict.failed_share = failed_share
    failing = failed_share >= FAILED_SHARE_MAX
    if failed_count:
        notes.append(
            f"{failed_count} of {failed_count + len(current)} requests in the window failed: {failed_text}; "
            "the latency figures are those of the others"
        )
    without_ttft = len(current) - current.measured("ttft_ns")
    if without_ttft:
        reasons = current.missing_reasons()
        why = "; ".join(f"{text} ({count} requests)" for text, count in reasons)
        notes.append(
            f"{without_ttft} of {len(current)} requests have no TTFT"
            + (f": {why}" if why else " (their source sent no first-token timing)")
            + ("; judged on E2E" if not current.measured("ttft_ns") else "")
        )
    regressed: list[Degradation] = []
    baseline_ok = False
    if baseline is not None:
        base_results, _ = judge_objectives(baseline, objectives)
        baseline_ok = all(r.met is not False for r in base_results)
        verdict.baseline = BaselineInfo(
            baseline_window or _window_of(baseline), len(baseline), baseline_ok, base_results
        )
        verdict.baseline_window, verdict.baseline_requests = verdict.baseline.window, len(baseline)
        verdict.degradations = [degradation(m, current, baseline) for m in ("ttft", "itl", "e2e")]
        regressed = [d for d in verdict.degradations if d.degraded]
        if not baseline_ok:
            notes.append(
                "the baseline itself breaks the objectives: it is not used to call this window healthy, "
                "and causes share the window's own time"
            )
    broken = [r for r in results if r.met is False]
    diverged = [t for t in tails if t.diverged]
    if not broken and not diverged and not (baseline_ok and regressed):
        if failing:
            verdict.healthy = False
            verdict.causes = _failed_while_starting(failed_times, failed_count, startups)
            top = (
                f"; top cause: cold_start ({verdict.causes[0].share:.0%} of the failed requests)"
                if verdict.causes
                else ""
            )
            verdict.summary = (
                f"degraded: {failed_share:.0%} of requests failed: {failed_text}; "
                f"the latency of the others meets its objectives{top}"
            )
            return verdict
        verdict.summary = "healthy: " + _health_text(results, tails, verdict.degradations)
        return verdict
    verdict.healthy = False
    ttft_flagged = (
        any(r.measure == "ttft" for r in broken)
        or any(t.measure == "ttft" for t in diverged)
        or any(d.measure == "ttft" for d in regressed)
    )
    measure = "ttft" if ttft_flagged and current.measured("ttft_ns") else "e2e"
    verdict.measure = measure
    by_change = baseline is not None and baseline_ok and any(d.measure == measure and d.degraded for d in regressed)
    verdict.basis = "baseline" if by_change else "objectives"
    context = _context(current, baseline, signals, configured_batch_limit, current_window, verdict.baseline_window)
    verdict.engine = context.engine
    notes.extend(_missing_signal_notes(context, signals))
    if isinstance(current, HistogramWindow):
        counted_base = baseline if by_change and isinstance(baseline, HistogramWindow) else None
        verdict.causes = _attribute_counted(
            measure, current, counted_base, context, signals, (window, verdict.baseline_window)
        )
        tail_means = None
        notes.append(ENGINE_ONLY_NOTE)
    else:
        verdict.causes, tail_means = attribute(
            measure,
            current,
            baseline if by_change else None,
            context,
            signals,
            (window, verdict.baseline_window),
            startups,
            earlier_rows=baseline,
        )
    if tail_means is not None and tail_means[2]:
        notes.append(ENGINE_ONLY_NOTE)
    ttft_broken = [r for r in broken if r.measure == "ttft" and r.quantile == 0.99]
    if ttft_broken and tail_means is not None and measure == "ttft":
        worst = max(ttft_broken, key=lambda r: r.over_ns)
        hop = next((c for c in verdict.causes if c.cause == "network_hop"), None)
        read_late = hop is not None and hop.would_help[:1] == [LUMP_ADVICE]
        verdict.budget = ttft_budget(
            tail_means[0],
            tail_mean_ns=tail_means[1],
            p99_ns=worst.value_ns or 0.0,
            limit_ns=worst.limit_ns,
            actions={"network": "read the streams promptly on the caller's side (see network_hop)"}
            if read_late
            else None,
        )
    failed_cause = _failed_while_starting(failed_times, failed_count, startups) if failing else []
    if failed_cause:
        # A request that failed is worse than a slow one: when failures make the window
        # unhealthy and a replica's start explains them, the cold start leads (with its share
        # of the slow requests' time as well, when it has one).
        slow = next((c for c in verdict.causes if c.cause == "cold_start"), None)
        if slow is not None:
            verdict.causes.remove(slow)
            slow.evidence += [e for e in failed_cause[0].evidence if e.measure == "failed_requests"]
            failed_cause = [slow]
        verdict.causes.insert(0, failed_cause[0])
        verdict.summary = _degraded_summary(verdict, broken, diverged, regressed, failed=slow is None)
    else:
        verdict.summary = _degraded_summary(verdict, broken, diverged, regressed)
    if failing:
        verdict.summary += f"; {failed_share:.0%} of requests failed: {failed_text}"
    return verdict


def _failed_verdict(
    current: RowsWindow | StoredWindow,
    failed: dict[str, int],
    failed_count: int,
    failed_text: str,
    failed_times: Sequence[datetime],
    startups: Sequence[ReplicaStartup],
    current_window: Window | None,
) -> Verdict:
    """The verdict of a window where too few requests succeeded to judge their latency but
    enough failed to judge the window: degraded on its failures alone (an outage), with the
    cold start that explains them where one does."""
    total = failed_count + len(current)
    causes = _failed_while_starting(failed_times, failed_count, startups)
    top = f"; top cause: cold_start ({causes[0].share:.0%} of the failed requests)" if causes else ""
    verdict = Verdict(
        healthy=False,
        summary=(
            f"degraded: {failed_count / total:.0%} of requests failed: {failed_text}; "
            f"{len(current)} succeeded, too few to judge their latency{top}"
        ),
        measure=None,
        degradations=[],
        causes=causes,
        current_window=current_window or (_window_of(current) if len(current) else None),
        baseline_window=None,
        current_requests=len(current),
        baseline_requests=0,
        objectives=[],
        tail=[],
        notes=[f"{failed_count} of {total} requests in the window failed: {failed_text}"],
        failed=failed,
    )
    verdict.failed_share = failed_count / total
    return verdict


def _failed_while_starting(
    failed_times: Sequence[datetime], failed_count: int, startups: Sequence[ReplicaStartup]
) -> list[Cause]:
    """``[cold_start]`` when half the window's failed requests or more arrived before a replica
    starting in or just before the window was ready (its start-up spans), else ``[]``: a
    gateway that sends to a replica still loading gets errors, not a wait. ``share`` is then
    that cause's share of the failed requests, not of time."""
    if not failed_times or not failed_count:
        return []
    starting = [s for s in startups if s.ready_at is not None]
    early = [t for t in failed_times if any(t < s.ready_at for s in starting)]
    if 2 * len(early) < len(failed_times):
        return []
    cause = Cause(cause="cold_start", share=len(early) / len(failed_times), added_ns=0.0, stages=[])
    for startup in starting:
        cause.evidence.append(
            Evidence("loading_seconds", "total", "seconds", None, startup.loading_seconds, None, None, startup.text())
        )
    cause.evidence.append(
        Evidence(
            "failed_requests",
            "count",
            "count",
            None,
            float(len(early)),
            None,
            None,
            f"{len(early)} of the {len(failed_times)} failed requests arrived before a starting replica was ready "
            f"(last ready at {max(s.ready_at for s in starting).isoformat()})",
        )
    )
    cause.would_help = [a.text for a in COLD_START_HELP]
    cause.would_not_help = [a.text for a in COLD_START_NOT_HELP]
    return [cause]


def _window_of(rows: RowsWindow | StoredWindow) -> Window | None:
    spans = [span for span in rows.replica_spans().values() if span is not None]
    return (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None


def _context(
    current: RowsWindow | StoredWindow,
    baseline: RowsWindow | StoredWindow | None,
    signals: Signals,
    configured_batch_limit: float | None,
    window: Window | None = None,
    baseline_window: Window | None = None,
) -> Context:
    """What the rules read beside the rows. ``window``, ``baseline_window``: the windows
    the signals were fetched over (their grid), ``None`` when not known."""
    other = signals.baseline if baseline is not None else None
    state = engine_state(signals.current, other=other, configured_limit=configured_batch_limit)
    # The spans' queue, where the gauges cannot show it all (one more read of the rows).
    unseen = not state.reported or (len(signals.current.engines) <= 1 and sampled_sparsely(signals.current))
    intervals = _engine_intervals(current) if unseen and current.measured("queue_ns") else None
    if not state.reported and intervals:
        # No gauges: the engine's spans still say whether it queued at its running peak.
        counted = engine_state_from_spans(intervals)
        if 2 * counted.slot_bound_steps > counted.waiting_steps:
            state = counted
    elif intervals and len(intervals) == 1 and window is not None:
        # Scrapes further apart than the queue came and went: counted from the spans at each step
        # where they saw it wait in at least twice as many steps as the scrapes did.
        origin, step_ns, _ = alignment_grid(*window, window_step_seconds(*window))
        times = [origin + (i + 1) * step_ns - 1 for i in range(len(signals.current.steps))]
        between = engine_state_between_scrapes(
            signals.current,
            next(iter(intervals.values())),
            times,
            scraped_waiting_steps=state.waiting_steps,
            configured_limit=configured_batch_limit,
        )
        if between.waiting_steps >= max(1, 2 * state.waiting_steps):
            state = between
    running_means = None
    if state.source != "gauges" and baseline is not None:  # the running batch read where the queue was
        base_intervals = _engine_intervals(baseline) if baseline.measured("queue_ns") else None
        running_means = (_mean_running(intervals, window), _mean_running(base_intervals, baseline_window))
    return Context(
        engine=state,
        gpu_utilization=signals.current.stat(GPU_UTILIZATION_RATIO),
        decode_slower=baseline is not None and decode_slower(current, baseline),
        batch_grew=baseline is not None and batch_grew(signals, running_means),
        queue_held=queue_held(current, baseline),
        has_baseline=baseline is not None,
    )


_CALLER_COLUMNS = ("client_ttft_ns", "client_e2e_ns", "network_ns", "gateway_ns", ENGINE_SEND_COLUMN)
"""Columns a row has only where a caller's or gateway's span is in it."""


def _engine_intervals(window: RowsWindow | StoredWindow) -> dict[Any, list[tuple[int, int, int]]] | None:
    """Per replica, each request's ``(arrival, scheduled, end)`` in the engine (wall clock,
    ns), where every row with an engine queue time is the engine's own (its span is the
    request's root: no caller's or gateway's span, as vLLM traced alone): its first token
    at its start plus its TTFT, scheduled its prefill before that, queued its queue time
    before that, its last token its decode time after the first (the engine's own clock, as
    its queue and prefill times; its start plus its E2E where it has none). The span's end
    is the API server's: on a busy host it comes up to a second after the engine freed the
    slot and admitted the next request, and counted so, a batch pinned at 5 of 5 read 6 or 7
    running at a third of its steps. ``None`` when a row has a caller: its TTFT and E2E are
    the caller's, which place the engine's steps only as late as the caller read them."""
    out: dict[Any, list[tuple[int, int, int]]] = {}
    for row in window.rows_of(window.replicas()):
        queue, prefill, ttft, e2e = row.get("queue_ns"), row.get("prefill_ns"), row.get("ttft_ns"), row.get("e2e_ns")
        if queue is None:
            continue
        if any(row.get(c) is not None for c in _CALLER_COLUMNS) or prefill is None or ttft is None or e2e is None:
            return None
        start, decode = unix_ns_from_datetime(row["timestamp"]), row.get("decode_ns")
        scheduled = start + ttft - prefill
        end = start + ttft + decode if decode is not None else start + e2e
        out.setdefault(row.get("replica"), []).append((scheduled - queue, scheduled, end))
    return out


def _missing_signal_notes(context: Context, signals: Signals) -> list[str]:
    notes = []
    if context.engine.source == "spans":
        notes.append(
            "the engine's gauges are not exported (scrape its /metrics with inferpath collect): its queue and "
            "running batch were counted from its request spans; KV-cache usage and preemptions are not known"
        )
    elif not context.engine.reported:
        notes.append(
            "the engine's queue depth is not exported (scrape its /metrics with inferpath collect): "
            "engine capacity cannot be told from an upstream queue"
        )
    elif signals.current.stat(RUNNING_REQUESTS) is None:
        notes.append("the engine's running-batch size is not exported: a full batch cannot be told from a hold")
    if signals.current.stat(KV_CACHE_USAGE_RATIO) is None and context.engine.reported:
        notes.append("KV-cache usage is not exported")
    return notes


def attribute(
    measure: str,
    current_rows: Rows,
    baseline_rows: Rows | None,
    context: Context,
    signals: Signals,
    windows: tuple[Window | None, Window | None],
    startups: Sequence[ReplicaStartup] = (),
    *,
    earlier_rows: Rows | None = None,
) -> tuple[list[Cause], tuple[dict[str, float], float, bool] | None]:
    """Share the tail band's mean ``measure`` (its growth over ``baseline_rows`` when given)
    among causes (module docstring). Returns the causes and the tail band's mean stage
    times and mean total (ns) of the current window, and whether the tail's TTFT is the
    engine's own (it measured the engine's queue and no stage before the engine), or ``None``
    when it has no tail.
    ``earlier_rows``: the baseline window's rows even where the growth is not measured
    against them (a verdict on objectives): which replicas served before the window
    decides which ones start in it (:func:`cold_start_rows`)."""
    stages = measure_stages(measure)
    current = as_window(current_rows)
    baseline = as_window(baseline_rows) if baseline_rows is not None else None
    column = f"{measure}_ns"
    current_edge = current.quantile(column, TAIL_QUANTILE)
    baseline_edge = baseline.quantile(column, TAIL_QUANTILE) if baseline is not None else None
    if current_edge is None or (baseline is not None and baseline_edge is None):
        return [], None
    if baseline is not None:
        prepare_attribution(current, baseline, measure, current_edge, baseline_edge)  # type: ignore[arg-type]
    before = baseline_rows if baseline_rows is not None else earlier_rows
    cold_rows = cold_start_rows(current, as_window(before) if before is not None else None, startups, measure)
    cold = {str(r["trace_id"]) for rows in cold_rows.values() for r in rows if r.get("trace_id")}
    current_tail = current.tail_sums(measure, current_edge, cold)
    if not current_tail.count:
        return [], None
    n = current_tail.count
    # The budget's stage means: a request on a starting replica counts whole as cold_start,
    # as in the causes below (its stages, a retried hop's wait included, are the start's).
    stage_means = {s: current_tail.kept_stage_ns[s] / n for s in (*stages, REST)}
    if current_tail.excluded_total_ns:
        stage_means["cold_start"] = current_tail.excluded_total_ns / n
    # The tail's requests measured the engine's queue and no stage before the engine: their
    # TTFT is the engine's own, and the rest lies inside the engine (causes.py).
    engine_only = current_tail.stage_ns.get("queue", 0) > 0 and not any(
        current_tail.stage_ns.get(stage, 0) for stage in PRE_ENGINE_STAGES
    )
    tail_means = (stage_means, current_tail.total_ns / n, engine_only)
    context = replace(context, engine_only=engine_only)
    if baseline is not None:
        baseline_tail = baseline.tail_sums(measure, baseline_edge)  # type: ignore[arg-type]
        if not baseline_tail.count:
            return [], tail_means
        base_mean = {s: baseline_tail.stage_ns[s] / baseline_tail.count for s in (*stages, REST)}
        base_total = baseline_tail.total_ns / baseline_tail.count
    else:
        baseline_tail = None
        base_mean, base_total = dict.fromkeys((*stages, REST), 0.0), 0.0
    added: dict[str, float] = {}
    stages_of: dict[str, list[str]] = {}
    if current_tail.kept_count:
        doors = _hop_doors(measure, current, baseline, current_tail, base_mean, context) if "network" in stages else []
        # The budget (the tail's own time, not its growth) moves a door's wait to the stage
        # that kept the door busy: taking that stage off the path frees the door too.
        waits = doors
        if baseline is not None and "network" in stages:
            zero = dict.fromkeys(base_mean, 0.0)
            waits = _hop_doors(measure, current, None, current_tail, zero, context)
        for _, door_stage, ns in waits:
            tail_means[0][door_stage] = tail_means[0].get(door_stage, 0.0) + ns / n
            tail_means[0]["network"] -= ns / n
        for stage in (*stages, REST):
            kept = current_tail.kept_stage_ns[stage] - current_tail.kept_count * base_mean[stage]
            shares = [(cause_of(stage, context), kept)]
            if stage == "network" and doors:
                shares = [(shares[0][0], kept - sum(ns for _, _, ns in doors)), *((c, ns) for c, _, ns in doors)]
            for cause, ns in shares:
                added[cause] = added.get(cause, 0.0) + ns / n
                if stage not in stages_of.setdefault(cause, []):
                    stages_of[cause].append(stage)
    cold_count = current_tail.count - current_tail.kept_count
    if cold_count:  # a request on a starting replica is charged to the cold start as a whole
        added["cold_start"] = (current_tail.excluded_total_ns - cold_count * base_total) / n
    total_added = current_tail.total_ns / n - base_total
    if total_added <= 0:
        return [], tail_means
    causes = [
        Cause(
            cause=name,
            share=min(1.0, value / total_added),
            added_ns=value,
            stages=[
                s
                for s in stages_of.get(name, [])
                if _grew(s, current_tail, baseline_tail) and current_tail.stage_ns[s] > 0
            ],
        )
        for name, value in added.items()
        if value / total_added >= MIN_CAUSE_SHARE
    ]
    causes.sort(key=lambda c: -c.share)
    if baseline is not None:
        prefetch_quantiles(current, baseline, [c for cause in causes for c in _evidence_columns(cause.cause)])
    advice = [
        _explain(item, measure, current, baseline, context, signals, windows, startups, cold_rows) for item in causes
    ]
    fixed = consistent_advice([helps for helps, _ in advice], [not_helps for _, not_helps in advice])
    for item, (helps, _), not_help in zip(causes, advice, fixed):
        item.would_help = [a.text for a in helps]
        item.would_not_help = [a.text for a in not_help]
    return causes, tail_means


def _attribute_counted(
    measure: str,
    current: HistogramWindow,
    baseline: HistogramWindow | None,
    context: Context,
    signals: Signals,
    windows: tuple[Window | None, Window | None],
) -> list[Cause]:
    """Causes of a window judged from the engine's histograms (:func:`diagnose`): the mean
    ``measure`` (its growth over ``baseline`` when given) split into the engine's queue time,
    the rest of its TTFT (the prompt's prefill, the wait for the step in flight) and, for E2E,
    the decode after the first token, each stage going to the cause that claims it
    (:func:`~inferpath.analysis.causes.cause_of`). Without a queue-time histogram the whole
    TTFT is the rest. An engine whose counters began in the window and that opened to a
    backlog it then cleared (:func:`_opened_to_backlog`) is a cold start, charged the whole
    time: no start-up span tells it when the engine is not traced."""
    ttft, e2e = current.mean_ns("ttft_ns"), current.mean_ns("e2e_ns")

    def parts(window: HistogramWindow | None) -> dict[str, float]:
        if window is None:
            return {}
        first, waited, whole = window.mean_ns("ttft_ns"), window.mean_ns("queue_ns") or 0.0, window.mean_ns("e2e_ns")
        split = {"queue": min(waited, first or 0.0), "prefill": max(0.0, (first or 0.0) - waited)}
        if measure == "e2e" and whole is not None:
            split["decode"] = max(0.0, whole - (first or 0.0))
        return split

    if (ttft if measure == "ttft" else e2e) is None:
        return []
    now, before = parts(current), parts(baseline)
    total_added = sum(now.values()) - sum(before.values())
    if total_added <= 0:
        return []
    first = current.histograms.get("ttft_ns")
    opening = None
    if first is not None and first.began_ns is not None and windows[0] is not None:
        # The steps from the one holding the new counters' first scrape: an engine restarted
        # under the same name reads its old process's last gauges before it (as of).
        origin, step_ns, _ = alignment_grid(*windows[0], window_step_seconds(*windows[0]))
        opened = max(0, -(-(first.began_ns - origin + 1) // step_ns) - 1)
        opening = _opened_to_backlog(signals.current.steps[opened:])
    if opening is not None:
        # Every request that waited in the window waited in the wall it opened to: the
        # start's, whole, as the spans' rule charges the requests held at an opening.
        queue_max, drained, kept_up = opening
        started = Cause("cold_start", share=1.0, added_ns=total_added, stages=[s for s, v in now.items() if v > 0])
        started.evidence.append(
            Evidence(
                QUEUE_DEPTH,
                "max",
                "requests",
                None,
                queue_max,
                windows[1],
                windows[0],
                f"the engine's counters began in the window and its first readings found {queue_max:.0f} requests "
                f"waiting: a backlog held while it started reached it as it opened; its queue drained in {drained} "
                f"steps and stayed empty for the {kept_up} after (no span of a start-up: the engine is not traced)",
            )
        )
        started.would_help = [a.text for a in COLD_START_HELP]
        started.would_not_help = [a.text for a in COLD_START_NOT_HELP]
        return [started]
    context = replace(context, engine_only=True)
    added: dict[str, float] = {}
    stages_of: dict[str, list[str]] = {}
    for stage, value in now.items():
        cause = cause_of(stage, context)
        added[cause] = added.get(cause, 0.0) + value - before.get(stage, 0.0)
        if value > before.get(stage, 0.0):
            stages_of.setdefault(cause, []).append(stage)
    causes = [
        Cause(cause=name, share=min(1.0, value / total_added), added_ns=value, stages=stages_of.get(name, []))
        for name, value in added.items()
        if value / total_added >= MIN_CAUSE_SHARE
    ]
    causes.sort(key=lambda c: -c.share)
    mean_of = f"the mean {measure.upper()}"
    advice = [
        _explain(
            item,
            measure,
            current,  # type: ignore[arg-type]
            baseline,  # type: ignore[arg-type]
            context,
            signals,
            windows,
            (),
            {},
            band=f"{mean_of} of the requests the engine counted",
        )
        for item in causes
    ]
    fixed = consistent_advice([helps for helps, _ in advice], [not_helps for _, not_helps in advice])
    for item, (helps, _), not_help in zip(causes, advice, fixed):
        item.would_help = [a.text for a in helps]
        item.would_not_help = [a.text for a in not_help]
    return causes


def _opened_to_backlog(steps: Sequence[tuple[float | None, ...]]) -> tuple[float, int, int] | None:
    """The engine met a backlog as it opened (engine steps of a window in which its counters
    began): requests waited in its first :data:`OPENING_STEPS` steps, its queue
    then drained and stayed empty at least as long as the backlog took to drain (it kept up
    once it had cleared what waited for it) and to the window's end. Returns the queue's
    largest depth in that wall, the steps it took to drain and the steps it stayed empty;
    ``None`` otherwise. A queue that builds later, or stays, is the engine's own capacity."""
    queue = [s[0] for s in steps if s[0] is not None]
    if not any(q >= 1 for q in queue[:OPENING_STEPS]):
        return None
    drained = next((i for i, q in enumerate(queue) if i >= 1 and q < 1 and queue[i - 1] >= 1), None)
    if drained is None:
        return None
    after = queue[drained:]
    if any(q >= 1 for q in after) or len(after) < drained:
        return None
    return max(queue[:drained]), drained, len(after)


def _hop_doors(
    measure: str,
    current: RowsWindow | StoredWindow,
    baseline: RowsWindow | StoredWindow | None,
    current_tail: TailSums,
    base_mean: Mapping[str, float],
    context: Context,
) -> list[tuple[str, str, float]]:
    """The parts of the ``network`` stage (ns, summed over the tail band's kept rows; growth
    over the baseline's tail when one is given) that the requests waited at a busy callee's
    door rather than on the wire, as ``(cause, the stage that kept the door busy, ns)``: the hop above its
    :data:`HOP_FLOOR_QUANTILE` floor goes, in this order, to

    - the engine's cause when the engine held requests at the same moments (the queue's cause
      is one of :data:`ENGINE_CAUSES`), up to the same requests' queue time in the engine;
    - the CPU stages before the engine that took time of the same requests (tokenization,
      retrieval: a gateway whose workers or event loop they keep busy takes the next request
      late), the larger first, each up to its own time;
    - ``queueing`` (budget stage :data:`UPSTREAM_QUEUE`), when the waits before the engine's
      span grew with the backlog (:func:`hop_queue`): what is left, up to the tail's waits on
      the trip out of the hop into the engine (``engine_send_ns``, where measured; their growth
      over the baseline's with one; the way back, a first token read late, is not a queue in
      front of the engine). Not where the caller read its streams late and made that hop
      itself: a CPU-starved caller sends late too, and queues on its own side (``network_hop``
      says so). Behind a gateway the caller's late reads are its own hop's, not the gateway's
      wait for the engine; where the trip out is not measured (the whole network stage is
      read, the caller's hop with it), they keep every hop's.

    Each door's wait is a sign of a congestion that its own stage shows first, so none takes
    more than that stage's time. What no door explains stays the hop's, whatever its shape."""
    count = current_tail.kept_count
    hop_ns = current_tail.kept_stage_ns["network"]

    def added(stage: str) -> float:
        return max(0.0, current_tail.kept_stage_ns[stage] - count * base_mean[stage])

    doors: list[tuple[str, str, float]] = []
    if cause_of("queue", context) in ENGINE_CAUSES:
        doors.append((cause_of("queue", context), "queue", added("queue")))
    cpu = [(cause_of(stage, context), stage, added(stage)) for stage in ("tokenize", "retrieval") if stage in base_mean]
    doors += sorted(cpu, key=lambda door: -door[2])
    doors = [door for door in doors if door[2] > 0]
    floor = _hop_floor(measure, current) if hop_ns > 0 else None
    if floor is None:
        return []
    wire = min(hop_ns, count * floor)
    if baseline is not None:
        wire -= count * min(base_mean["network"], _hop_floor(measure, baseline) or 0.0)
    left = min(max(0.0, hop_ns - count * base_mean["network"] - max(0.0, wire)), added("network"))
    out = []
    for cause, stage, cap in doors:
        taken = min(left, cap)
        if taken > 0:
            out.append((cause, stage, taken))
            left -= taken
    queue = hop_queue(measure, current) if left > 0 else None
    # The caller's late reads speak for the hops it makes itself: all of them where the waits
    # are read on the whole network stage, the one into the engine where no gateway is between.
    if queue is not None and queue.queued and not ((queue.callers_own or not queue.send) and _read_late(current)):
        waited = queue.tail_wait_ns
        if waited is not None and baseline is not None:
            # growth, as ``left`` is: less what the baseline's tail waited on the same trip
            base = hop_queue(measure, baseline)
            if base is not None and base.tail_wait_ns is not None and base.tail_rows:
                waited -= queue.tail_rows * base.tail_wait_ns / base.tail_rows
        taken = left if waited is None else min(left, waited)
        if taken > 0:
            out.append(("queueing", UPSTREAM_QUEUE, taken))
    return out


@dataclass(frozen=True)
class HopQueue:
    """How a hop's waits above its floor behaved: ``waiters`` requests waited above the floor
    (``floor_ns``), ``rho`` is Spearman's ρ between each one's wait and the number of requests
    already waiting when it arrived (``None`` where undefined), ``backlog_max`` the most
    waiting at once. ``queued``: the shape of a queue (:data:`HOP_QUEUE_RHO`).

    ``send``: the waits are those of the trip out of the hop into the engine
    (``engine_send_ns``, measured on nine rows in ten with a hop at least), else of the whole
    network stage. ``tail_wait_ns``: with ``send``, the sum of the waits above the floor over
    the measure's tail band (ns; requests on a starting replica included), else ``None``;
    ``tail_rows``: the tail band's rows that measured it. ``callers_own``: no gateway stands
    between the calling client and the engine (the hop is the caller's own)."""

    waiters: int
    floor_ns: float
    rho: float | None
    backlog_max: int
    send: bool = False
    tail_wait_ns: float | None = None
    tail_rows: int = 0
    callers_own: bool = True

    @property
    def queued(self) -> bool:
        return self.waiters >= HOP_QUEUE_MIN_WAITERS and self.rho is not None and self.rho >= HOP_QUEUE_RHO

    def text(self) -> str:
        rho = "n/a" if self.rho is None else f"{self.rho:.2f}"
        where = (
            "(from the caller's send to the engine's span)"
            if self.send
            else "(the hop from the caller to the engine's span)"
        )
        return (
            f"the calls waited in a queue before reaching the engine {where}: {self.waiters} requests waited "
            f"longer than the floor ({_ms(self.floor_ns)}, what nine in ten waited at least), and those that found "
            f"more requests already waiting waited longer (Spearman ρ {rho}; up to {self.backlog_max} waiting at "
            "once); a wire's delay does not grow with the backlog"
        )


def hop_queue(measure: str, current: RowsWindow | StoredWindow) -> HopQueue | None:
    """The :class:`HopQueue` of the window's hop into the engine, ``None`` without a hop.

    The waits are read on the hop's trip out (``engine_send_ns``: the caller's start to the
    engine span's start) where the rows measured it, else on the whole hop (the network
    stage of ``measure``). Each request that paid more than that column's
    :data:`HOP_FLOOR_QUANTILE` floor waited from ``engine arrival − (value − floor)`` to its
    engine arrival, placed at ``timestamp + TTFT − queue − prefill`` (the caller's TTFT where
    measured; wall clock, ns). Its backlog is the number of the others waiting at the moment
    it began to."""
    column = next((c for c in stage_columns(measure, "network") if current.measured(c)), None)
    if column is None:
        return None
    # Rows stored before the column, or hops into no engine span, leave it NULL: the trip out
    # is read where (nearly) every row with a hop measured it.
    send = current.measured(ENGINE_SEND_COLUMN) >= SEND_MEASURED_SHARE * current.measured(column) > 0
    if send:
        column = ENGINE_SEND_COLUMN
        floor = current.quantile(ENGINE_SEND_COLUMN, HOP_FLOOR_QUANTILE)
    else:
        floor = _hop_floor(measure, current)
    if floor is None:
        return None
    waits: list[tuple[float, float]] = []  # (start, engine arrival), ns
    for row in current.rows_at_or_above(column, floor):
        hop, ttft = row.get(column), row.get("ttft_ns")
        if hop is None or ttft is None or hop <= floor:
            continue
        arrival = (
            unix_ns_from_datetime(row["timestamp"]) + ttft - (row.get("queue_ns") or 0) - (row.get("prefill_ns") or 0)
        )
        waits.append((arrival - (hop - floor), arrival))
    starts, arrivals = sorted(w[0] for w in waits), sorted(w[1] for w in waits)
    # waiting at t: begun at or before t and not yet arrived (the request itself excluded)
    backlog = [bisect_right(starts, s) - bisect_right(arrivals, s) - 1 for s, _ in waits]
    rho = spearman([float(b) for b in backlog], [a - s for s, a in waits]) if len(waits) >= 3 else None
    tail_wait, tail_rows = None, 0
    if send and (edge := current.quantile(f"{measure}_ns", TAIL_QUANTILE)) is not None:
        sends = [
            row[ENGINE_SEND_COLUMN]
            for row in current.rows_at_or_above(f"{measure}_ns", edge)
            if row.get(ENGINE_SEND_COLUMN) is not None
        ]
        tail_wait, tail_rows = float(sum(max(0.0, v - floor) for v in sends)), len(sends)
    return HopQueue(
        len(waits),
        floor,
        rho,
        max(backlog, default=0) + (1 if waits else 0),
        send=send,
        tail_wait_ns=tail_wait,
        tail_rows=tail_rows,
        callers_own=not current.measured("gateway_ns"),
    )


def _read_late(current: RowsWindow | StoredWindow) -> bool:
    """Half the tail's streamed requests or more reached the caller in one lump (:func:`_lump_streams`)."""
    lumps = _lump_streams(current)
    return lumps is not None and 2 * lumps[0] >= lumps[1]


def _hop_floor(measure: str, window: RowsWindow | StoredWindow) -> float | None:
    """:data:`HOP_FLOOR_QUANTILE` of the network stage's time in ``measure`` over the window's
    rows that measured it (the TTFT phase where a row has it); ``None`` without a hop."""
    for column in stage_columns(measure, "network"):
        if window.measured(column):
            return window.quantile(column, HOP_FLOOR_QUANTILE)
    return None


def _grew(stage: str, current_tail: TailSums, baseline_tail: TailSums | None) -> bool:
    if baseline_tail is None:
        return True
    return current_tail.stage_ns[stage] / current_tail.count > baseline_tail.stage_ns[stage] / baseline_tail.count


def _evidence_columns(cause: str) -> tuple[str, ...]:
    rule = BY_NAME.get(cause)
    return rule.evidence_columns if rule else ()


# ---------------------------------------------------------------------------- evidence and advice


def _ms(ns: float | None) -> str:
    return (
        "n/a"
        if ns is None
        else f"{ns / 1e9:.2f} s"
        if ns >= 1e10
        else (f"{ns / 1e6:.0f} ms" if ns >= 1e7 else f"{ns / 1e6:.1f} ms")
    )


def _count(value: float | None) -> str:
    """A count as people write it: ``223``, or ``2.5`` for a mean."""
    return "n/a" if value is None else f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _explain(
    cause: Cause,
    measure: str,
    current: RowsWindow | StoredWindow,
    baseline: RowsWindow | StoredWindow | None,
    context: Context,
    signals: Signals,
    windows: tuple[Window | None, Window | None],
    startups: Sequence[ReplicaStartup],
    cold_rows: Mapping[str, list[Mapping[str, Any]]],
    *,
    band: str | None = None,
) -> tuple[list[Advice], list[Advice]]:
    """Fill ``cause.evidence``; return its advice, (would help, would not help) as
    :class:`Advice`, which the caller makes consistent across causes. ``band``: what the
    cause's time is of, in words (default: the slowest 10%)."""
    current_window, baseline_window = windows
    state: EngineState = context.engine

    def evidence(name: str, statistic: str, unit: str, base: float | None, cur: float | None, text: str) -> None:
        cause.evidence.append(Evidence(name, statistic, unit, base, cur, baseline_window, current_window, text))

    def stage_p99(column: str) -> None:
        b = baseline.quantile(column, 0.99) if baseline is not None else None
        c = current.quantile(column, 0.99)
        if c is None and b is None:
            return
        name = column.removesuffix("_ns")
        if name in ENGINE_STAGES:  # not the queue in front of the engine, nor the caller's
            name = f"engine {name}"
        evidence(
            column,
            "p99",
            "ns",
            b,
            c,
            f"{name} p99 {_ms(b)} → {_ms(c)}" if baseline is not None else f"{name} p99 {_ms(c)}",
        )

    def signal(name: str, which: str, unit: str = "ratio") -> None:
        b = signals.baseline.stat(name, which) if baseline is not None else None
        c = signals.current.stat(name, which)
        if b is None and c is None:
            return
        fmt = _percent if unit == "ratio" else _count
        evidence(
            name,
            which,
            unit,
            b,
            c,
            f"{name} {which} {fmt(b)} → {fmt(c)}" if baseline is not None else f"{name} {which} {fmt(c)}",
        )

    if band is None:
        slowest = f"the slowest {1 - TAIL_QUANTILE:.0%}"
        basis = "of the increase" if baseline is not None else f"of {slowest}'s {measure.upper()}"
        statistic, text = "mean of tail band", f"per request in {slowest} ({cause.share:.0%} {basis})"
    else:
        statistic = "mean"
        text = f"of {band} ({cause.share:.0%} of {'its increase' if baseline is not None else 'it'})"
    evidence(
        f"{measure}_ns",
        statistic,
        "ns",
        None,
        cause.added_ns,
        f"{cause.cause} {'added' if baseline is not None else 'takes'} {_ms(cause.added_ns)} {text}",
    )
    rule = BY_NAME.get(cause.cause)
    helps: list[Advice] = list(rule.would_help(context)) if rule else []
    not_helps: list[Advice] = list(rule.would_not_help(context)) if rule else []
    for column in _evidence_columns(cause.cause):
        stage_p99(column)
    if cause.cause in ("gpu_memory", "gpu_compute", "batching", "queueing"):
        evidence("engine_waiting_steps", "count", "count", None, float(state.waiting_steps), state.text())
        signal(QUEUE_DEPTH, "max", "requests")
        signal(RUNNING_REQUESTS, "max", "requests")
        signal(KV_CACHE_USAGE_RATIO, "p90")
        signal(GPU_UTILIZATION_RATIO, "mean")
    if cause.cause == "gpu_memory":
        before = signals.baseline.preemptions if baseline is not None else None
        after = signals.current.preemptions
        evidence(
            PREEMPTIONS_TOTAL,
            "total",
            "count",
            before,
            after,
            f"preemptions {before or 0:.0f} → {after or 0:.0f}"
            if baseline is not None
            else f"{after or 0:.0f} preemptions in the window",
        )
    if cause.cause == "gpu_compute" and baseline is not None:
        b50, c50 = baseline.quantile("itl_ns", 0.5), current.quantile("itl_ns", 0.5)
        evidence("itl_ns", "p50", "ns", b50, c50, f"median decode step (ITL p50) {_ms(b50)} → {_ms(c50)}")
    if cause.cause == "batching" and "queue" in cause.stages:
        b50 = baseline.quantile("queue_ns", 0.5) if baseline is not None else None
        c50 = current.quantile("queue_ns", 0.5)
        held_all = (
            "every request waits before its prefill" if context.queue_held else "the typical request did not wait"
        )
        evidence(
            "queue_ns",
            "p50",
            "ns",
            b50,
            c50,
            f"{held_all}: queue p50 " + (f"{_ms(b50)} → {_ms(c50)}" if baseline is not None else _ms(c50)),
        )
    floor = _hop_floor(measure, current) if cause.cause == "network_hop" else None
    if floor is not None:
        evidence(
            "network_ns",
            "p10",
            "ns",
            None,
            floor,
            f"network p10 {_ms(floor)}: what nine requests in ten paid at least (the wire, and any proxy on it)",
        )
    if cause.cause == "network_hop" and measure == "ttft":
        lumps = _lump_streams(current)
        if lumps is not None:
            late, measured = lumps
            evidence(
                "lump_streams",
                "count",
                "count",
                None,
                float(late),
                f"in {late} of the {measured} slowest streamed requests the first token reached the caller "
                f"with the rest of the stream (client first-to-last token under {LUMP_STREAM_RATIO:.0%} of the "
                "engine's decode): the engine made the tokens on time and they were read late",
            )
            if _read_late(current):
                # First when no delay on the wire stands out (the floor is a small part of the
                # tail's hop); after the hop's own advice when every request paid one.
                helps.insert(
                    0 if floor is None or floor < LUMP_FIRST_FLOOR_SHARE * cause.added_ns else 1,
                    Advice(LUMP_ADVICE),
                )
    if cause.cause == "queueing" and "network" in cause.stages:
        queue = hop_queue(measure, current)
        if queue is not None:
            text = queue.text()
            if state.reported and not state.waiting_steps and state.running_max:
                cap = f"{state.running_max:.0f}"
                text += (
                    f"; the engine ran at most {cap} at once and none waited in it: what held the calls was in "
                    f"front of it, letting about {cap} through at a time (a connection pool, a concurrency limit)"
                )
            evidence("network_ns", "spearman rho", "ratio", None, queue.rho, text)
    if cause.cause == "cold_start":
        helps, not_helps = list(COLD_START_HELP), list(COLD_START_NOT_HELP)
        serving = {str(r) for r in current.replicas()}
        for startup in startups:
            if startup.replica in serving or not startup.replica:
                evidence("loading_seconds", "total", "seconds", None, startup.loading_seconds, startup.text())
        for replica, rows in cold_rows.items():
            p99 = RowsWindow(rows).quantile(f"{measure}_ns", 0.99)
            evidence(
                f"{measure}_ns",
                "p99",
                "ns",
                None,
                p99,
                f"replica {replica or '(unnamed)'}: {len(rows)} requests slowed by its start "
                f"(waiting for it to be ready, or before it warmed up), {measure.upper()} p99 {_ms(p99)}",
            )
    return helps, not_helps


def _lump_streams(current: RowsWindow | StoredWindow) -> tuple[int, int] | None:
    """Of the TTFT tail band's requests whose caller measured a streamed first and last token
    and whose engine measured its decode (≥ :data:`LUMP_MIN_DECODE_NS`): how many reached the
    caller in one lump (:data:`LUMP_STREAM_RATIO`), and how many were measured; ``None`` when
    none were."""
    edge = current.quantile("ttft_ns", TAIL_QUANTILE)
    if edge is None:
        return None
    late = measured = 0
    for row in current.rows_at_or_above("ttft_ns", edge):
        first, last, decode = row.get("client_ttft_ns"), row.get("client_e2e_ns"), row.get("decode_ns")
        if first is None or last is None or decode is None or decode < LUMP_MIN_DECODE_NS:
            continue
        measured += 1
        late += last - first < LUMP_STREAM_RATIO * decode
    return (late, measured) if measured else None


def _health_text(
    results: Sequence[ObjectiveResult], tails: Sequence[TailResult], degradations: Sequence[Degradation]
) -> str:
    parts = [
        f"{r.endpoint_class or UNCLASSIFIED} {r.measure.upper()} p{r.quantile * 100:g} {_ms(r.value_ns)} "
        f"≤ {_ms(r.limit_ns)}"
        for r in results
        if r.met
    ]
    parts += [_degradation_text(d) for d in degradations if d.ratio]
    return "; ".join(parts) or "objectives hold"


def _degradation_text(d: Degradation) -> str:
    name = d.measure.upper()
    if d.ratio is None:
        return f"{name} not measured in both windows"
    if d.by == "p50" and d.baseline_p50_ns and d.current_p50_ns is not None:
        return (
            f"{name} p50 {_ms(d.baseline_p50_ns)} → {_ms(d.current_p50_ns)} "
            f"({d.current_p50_ns / d.baseline_p50_ns:.1f}× the baseline)"
        )
    return f"{name} p99 {_ms(d.baseline_p99_ns)} → {_ms(d.current_p99_ns)} ({d.ratio:.1f}× the baseline)"


def _degraded_summary(
    verdict: Verdict,
    broken: Sequence[ObjectiveResult],
    diverged: Sequence[TailResult],
    regressed: Sequence[Degradation],
    *,
    failed: bool = False,
) -> str:
    """``failed``: the top cause's share is of the failed requests, not of time."""
    parts = [
        f"{r.endpoint_class or UNCLASSIFIED} {r.measure.upper()} p{r.quantile * 100:g} {_ms(r.value_ns)} "
        f"over its {_ms(r.limit_ns)} objective"
        for r in broken
    ]
    parts += [f"{t.measure.upper()} p99 {t.ratio:.1f}× the mean ({t.endpoint_class or UNCLASSIFIED})" for t in diverged]
    parts += [_degradation_text(d) for d in regressed]
    top = verdict.causes[0] if verdict.causes else None
    basis = f"of the {share_basis(verdict.basis, verdict.source)}"
    if failed:
        basis = "of the failed requests"
    return (
        "degraded: "
        + "; ".join(parts)
        + (f"; top cause: {top.cause} ({top.share:.0%} {basis})" if top else "; no single cause explains it")
    )


# ---------------------------------------------------------------------------- from a store


def diagnose(
    store: Any,
    *,
    window_start: datetime,
    window_end: datetime,
    baseline_start: datetime | None = None,
    baseline_end: datetime | None = None,
    endpoint: str | None = None,
    endpoint_class: str | None = None,
    columns: dict[str, str] | None = None,
    objectives: Objectives = DEFAULT_OBJECTIVES,
) -> Verdict:
    """Diagnose the ``ok`` requests in ``[window_start, window_end)`` (the others are counted:
    ``failed`` of :func:`diagnose_from`) (optionally of one
    ``endpoint`` or ``endpoint_class``; ``columns``: exact-match filters on service_name / model / replica, the
    engine signals stay those of every engine) against ``objectives`` and, when both baseline bounds are given, against
    ``[baseline_start, baseline_end)``.

    Counts, quantiles and tail sums are aggregated in the store
    (:class:`~inferpath.analysis.request_window.StoredWindow`); the engine/GPU signals and
    start-up spans are read only when the window is not healthy. Datetimes must be
    timezone-aware. Raises ``ValueError`` for a reversed window or a baseline with one bound,
    :class:`InsufficientDataError` under :data:`MIN_REQUESTS` requests in the window.
    """
    if unix_ns_from_datetime(window_end) <= unix_ns_from_datetime(window_start):
        raise ValueError("window_end must be after window_start")
    if (baseline_start is None) != (baseline_end is None):
        raise ValueError("give both baseline_start and baseline_end, or neither")
    baseline_window = None
    if baseline_start is not None and baseline_end is not None:
        if unix_ns_from_datetime(baseline_end) <= unix_ns_from_datetime(baseline_start):
            raise ValueError("baseline_end must be after baseline_start")
        baseline_window = (baseline_start, baseline_end)
        current_rows, baseline_rows = StoredWindow.pair(
            store,
            (window_start, window_end),
            baseline_window,
            endpoint=endpoint,
            columns=columns,
            endpoint_class=endpoint_class,
        )
    else:
        current = StoredWindow(
            store, start=window_start, end=window_end, endpoint=endpoint, columns=columns, endpoint_class=endpoint_class
        )
        current_rows, baseline_rows = current, None
    failed, failed_times = failed_requests(
        store, start=window_start, end=window_end, endpoint=endpoint, endpoint_class=endpoint_class, columns=columns
    )
    signals = StoredSignalWindows(store, (window_start, window_end), baseline_window)
    lookback = timedelta(seconds=COLD_START_LOOKBACK_SECONDS)
    startups = StoredStartups(
        store,
        window_start - 2 * lookback,
        window_end,
        ready_from=window_start - lookback,
        ready_before=window_end,
        warm_at=window_start,
    )
    filtered = bool(endpoint or endpoint_class or columns)  # the histograms know no endpoint

    def counted() -> Verdict | None:
        spans = current_rows.measured("e2e_ns")
        return _counted_verdict(store, (window_start, window_end), baseline_window, spans, signals, objectives)

    try:
        verdict = diagnose_from(
            current_rows,
            baseline_rows,
            signals,
            objectives=objectives,
            current_window=(window_start, window_end),
            baseline_window=baseline_window,
            startups=startups,
            failed=failed,
            failed_times=failed_times,
        )
    except InsufficientDataError as exc:
        judged = None if exc.window != "current" or filtered else counted()
        if judged is None:
            raise
        return judged
    if not verdict.healthy or filtered:
        return verdict
    judged = counted()
    return judged if judged is not None and not judged.healthy else verdict


def _counted_verdict(
    store: Any,
    window: Window,
    baseline_window: Window | None,
    spans: int,
    signals: Signals,
    objectives: Objectives,
) -> Verdict | None:
    """The verdict of ``window`` judged from the engine's own histograms
    (:class:`~inferpath.analysis.request_window.HistogramWindow`), where its request spans
    miss requests the engine counted: fewer than :data:`SPAN_COVERAGE_MIN` of its first tokens
    have a span (``spans``: the window's request rows), and :data:`MIN_REQUESTS` at least. An
    engine scraped but not traced, and spans that lag an incident (vLLM exports a span when its
    request ends; the ones still in the engine at the end of a window are in its histograms
    already). ``None`` where the spans hold the requests or the histograms count too few."""
    current = HistogramWindow(fetch_window_histograms(store, *window))
    counted = current.measured("ttft_ns")
    if counted < MIN_REQUESTS or counted - spans < MIN_REQUESTS or spans >= SPAN_COVERAGE_MIN * counted:
        return None
    if current.measured("e2e_ns") < MIN_REQUESTS:  # an engine that exports no E2E histogram
        return None
    baseline = HistogramWindow(fetch_window_histograms(store, *baseline_window)) if baseline_window else None
    why = (
        ": the others had not ended when the window closed, were not sampled, or their spans did not arrive"
        if spans
        else ": none began in the window; the engine is not traced, or its spans did not reach the store"
    )
    verdict = diagnose_from(
        cast(Any, current),  # a window's judgement reads what the histograms answer (HistogramWindow)
        cast(Any, baseline if baseline is not None and baseline.measured("ttft_ns") >= MIN_REQUESTS else None),
        signals,
        objectives=objectives,
        current_window=window,
        baseline_window=baseline_window,
    )
    verdict.notes.insert(0, COUNTED_NOTE.format(counted=counted, spans=spans, why=why))
    return verdict


__all__ = [
    "BATCH_GROWTH_RATIO",
    "COLD_MIN_SLOW",
    "COLD_RECOVERY_RUN",
    "COLD_START_LOOKBACK_SECONDS",
    "DEGRADED_RATIO",
    "DIAGNOSIS_COLUMNS",
    "FAILED_SHARE_MAX",
    "HELD_QUEUE_RATIO",
    "InsufficientDataError",
    "MIN_CAUSE_SHARE",
    "MIN_DEGRADATION_NS",
    "MIN_MEDIAN_DEGRADATION_NS",
    "MIN_HELD_QUEUE_NS",
    "MIN_REQUESTS",
    "SignalWindows",
    "TAIL_QUANTILE",
    "WindowSignals",
    "attribute",
    "batch_grew",
    "cold_start_rows",
    "decode_slower",
    "degradation",
    "diagnose",
    "diagnose_from",
    "judge_objectives",
    "queue_held",
]
