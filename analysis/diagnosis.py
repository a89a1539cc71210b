"""Name the bottleneck: compare a window with a baseline and walk the troubleshooting order.

The order an SRE would follow, and what each step looks at:

1. Which measure degraded (TTFT, ITL, E2E), at p99, against the baseline window.
2. Where the added time sits. For the slowest requests of each window (the *tail band*,
   at or above the window's p90 of the measure) the mean time of every stage is compared.
   Means add up (the measure = stages + rest) where percentiles do not, so each stage's
   growth is a share of the growth of the tail's mean; the tail is used rather than all
   requests because the p99 is what degraded.
3. Why a stage grew, from the engine and GPU state of the same windows:
   queue time → KV-cache pressure (``gpu_memory``), else a saturated GPU (``gpu_compute``:
   utilization ≥ 90%, or a slower median decode step, :func:`decode_slower`),
   else a batch grown larger or a hold on every request, i.e. a batching window
   (``batching``, :func:`queue_held`), else plain ``queueing``;
   prefill → ``gpu_memory`` under KV pressure (preempted sequences are recomputed), else
   ``gpu_compute``; decode (ITL) → ``gpu_memory`` under KV pressure, else ``batching`` when
   the running batch grew, else ``gpu_compute``; tokenize → ``tokenization``; retrieval →
   ``retrieval``; network → ``network_hop``; gateway self time and rest → ``unexplained``.
4. Cold start: requests served by a replica absent from the baseline within its first
   :data:`COLD_START_WINDOW_SECONDS` are charged to ``cold_start`` as a whole.

Causes below :data:`MIN_CAUSE_SHARE` are dropped; the rest are ordered by share.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any, Mapping, Sequence

from inferpath.analysis.breakdown import REST, measure_stages
from inferpath.analysis.request_window import (
    WINDOW_COLUMNS, RowsWindow, StoredWindow, TailSums, as_window, prefetch_quantiles, prepare_attribution,
)
from inferpath.analysis.signals import (
    GPU_UTILIZATION_RATIO, KV_CACHE_USAGE_RATIO, QUEUE_DEPTH, RUNNING_REQUESTS,
    SignalWindows, StoredSignalWindows, WindowSignals,
)
from inferpath.analysis.startup import ReplicaStartup, StoredStartups
from inferpath.analysis.verdict import Cause, Degradation, Evidence, Verdict, Window
from inferpath.storage.rows import unix_ns_from_datetime

MIN_REQUESTS = 20
"""Requests needed per window: below 20, the "p99" is just the maximum of a handful."""
DEGRADED_RATIO = 1.5
"""A p99 must rise by half to count as degraded: run-to-run p99 noise over a few hundred
requests of an unchanged service stays within about ±30%."""
MIN_DEGRADATION_NS = 10_000_000
"""...and by at least 10 ms, so a 2 ms → 4 ms ITL wobble is not a finding."""
TAIL_QUANTILE = 0.9
"""The tail band: requests at or above the window's p90 of the measure."""
MIN_CAUSE_SHARE = 0.10
"""Causes explaining under 10% of the increase are within the noise of the attribution."""
KV_PRESSURE_RATIO = 0.90
"""KV-cache usage at which a paged-attention engine (vLLM) has no room for a burst and
starts to queue new sequences and preempt running ones."""
KV_HIGH_RATIO = 0.60
"""KV-cache usage that, doubled from the baseline and with requests waiting, means the queue
head does not fit: long prompts need many blocks at once, so a pool can refuse the next
sequence well below 90% full (the live vLLM capture queued 52 requests at 63-70%)."""
GPU_SATURATED_RATIO = 0.90
"""Utilization above which the GPU has no idle time left to absorb more work."""
GPU_HEADROOM_RATIO = 0.60
"""Utilization below which more GPUs cannot be the fix: the ones there are idle 40% of the time."""
BATCH_GROWTH_RATIO = 1.5
"""Running requests (batch size) up by half: each decode step now carries 1.5× the tokens."""
HELD_QUEUE_RATIO = 0.5
"""A batching window (or any fixed scheduling delay) holds *every* request: the median queue
time rises by at least half as much as the p90 does. Queueing behind bursts lengthens the
slow end far more than the median."""
MIN_HELD_QUEUE_NS = 10_000_000
"""...and the median must rise by 10 ms at least to be a hold rather than noise."""
COLD_START_WINDOW_SECONDS = 60.0
"""Requests within a minute of a replica's first request still meet model loading, CUDA
graph capture and cold caches."""


DIAGNOSIS_COLUMNS: tuple[str, ...] = WINDOW_COLUMNS
"""The request columns the rules read."""

Rows = Sequence[Mapping[str, Any]] | RowsWindow | StoredWindow
"""A window's requests: request-row dicts, or a :mod:`~inferpath.analysis.request_window` window."""
Signals = SignalWindows | StoredSignalWindows
"""Both windows' engine/GPU signals, held or read from the store on first use."""


class InsufficientDataError(ValueError):
    """A window holds too few requests to compare percentiles; the message names the window,
    and ``window`` says which: ``"current"`` or ``"baseline"``."""

    def __init__(self, message: str, window: str = "current") -> None:
        super().__init__(message)
        self.window = window


# ---------------------------------------------------------------------------- rules on signals

def kv_pressure(signals: Signals, current_requests: int, baseline_requests: int) -> bool:
    """KV cache under pressure in the current window: usage p90 ≥ :data:`KV_PRESSURE_RATIO`;
    or usage p90 ≥ :data:`KV_HIGH_RATIO`, at least double the baseline's, with a deeper queue
    (the queue head is waiting for blocks); or more preemptions per request than in the
    baseline (an engine preempts only when it runs out of KV blocks)."""
    usage = signals.current.stat(KV_CACHE_USAGE_RATIO, "p90")
    if usage is not None and usage >= KV_PRESSURE_RATIO:
        return True
    before = signals.baseline.stat(KV_CACHE_USAGE_RATIO, "p90")
    depth, depth_before = signals.current.stat(QUEUE_DEPTH), signals.baseline.stat(QUEUE_DEPTH)
    if (usage is not None and before is not None and depth is not None and depth_before is not None
            and usage >= KV_HIGH_RATIO and usage >= 2 * before and depth > depth_before):
        return True
    current = (signals.current.preemptions or 0.0) / max(current_requests, 1)
    baseline = (signals.baseline.preemptions or 0.0) / max(baseline_requests, 1)
    return current > 0 and current > baseline


def gpu_saturated(signals: Signals) -> bool:
    """Mean GPU utilization of the current window ≥ :data:`GPU_SATURATED_RATIO`."""
    utilization = signals.current.stat(GPU_UTILIZATION_RATIO)
    return utilization is not None and utilization >= GPU_SATURATED_RATIO


def batch_grew(signals: Signals) -> bool:
    """Mean running requests grew by :data:`BATCH_GROWTH_RATIO` or more over the baseline."""
    current = signals.current.stat(RUNNING_REQUESTS)
    baseline = signals.baseline.stat(RUNNING_REQUESTS)
    if current is None or baseline is None or baseline <= 0:
        return False
    return current >= BATCH_GROWTH_RATIO * baseline


def queue_held(current_rows: Rows, baseline_rows: Rows) -> bool:
    """Queue time grew for the typical request, not just the tail: the p50 of ``queue_ns`` rose
    by ≥ :data:`MIN_HELD_QUEUE_NS` and by ≥ :data:`HELD_QUEUE_RATIO` of the p90's rise — the
    signature of a batching window that holds each request before its prefill."""
    current, baseline = as_window(current_rows), as_window(baseline_rows)
    if not current.measured("queue_ns") or not baseline.measured("queue_ns"):
        return False
    p50_rise = current.quantile("queue_ns", 0.5) - baseline.quantile("queue_ns", 0.5)
    p90_rise = current.quantile("queue_ns", 0.9) - baseline.quantile("queue_ns", 0.9)
    return p50_rise >= MIN_HELD_QUEUE_NS and p50_rise >= HELD_QUEUE_RATIO * p90_rise


def decode_slower(current_rows: Rows, baseline_rows: Rows) -> bool:
    """The typical decode step got slower: median ITL rose by :data:`DEGRADED_RATIO` and
    by 1 ms at least. A decode step is one GPU pass over the
    batch, so a slower median step means the GPU itself is slower or busier (a saturated or
    shared GPU) — a batching window leaves it unchanged. GPU utilization alone cannot tell:
    a continuously batching engine shows high utilization at any load."""
    now, before = as_window(current_rows).quantile("itl_ns", 0.5), as_window(baseline_rows).quantile("itl_ns", 0.5)
    if now is None or before is None:
        return False
    return before > 0 and now >= DEGRADED_RATIO * before and now - before >= 1_000_000


def stage_cause(stage: str, *, kv: bool, saturated: bool, batch: bool, held: bool = False) -> str:
    """The cause a stage's growth is charged to, given the engine state (module docstring);
    ``held``: :func:`queue_held` (queue growth then goes to ``batching``)."""
    if stage == "tokenize":
        return "tokenization"
    if stage == "retrieval":
        return "retrieval"
    if stage == "network":
        return "network_hop"
    if stage == "queue":
        return ("gpu_memory" if kv else "gpu_compute" if saturated
                else "batching" if batch or held else "queueing")
    if stage == "prefill":
        return "gpu_memory" if kv else "gpu_compute"
    if stage == "decode":
        return "gpu_memory" if kv else "batching" if batch else "gpu_compute"
    return "unexplained"


# ---------------------------------------------------------------------------- measures

def degradation(measure: str, current_rows: Rows, baseline_rows: Rows) -> Degradation:
    """Compare ``measure``'s exact p99 between windows; degraded when it rose by both
    :data:`DEGRADED_RATIO` and :data:`MIN_DEGRADATION_NS`."""
    cur = as_window(current_rows).quantile(f"{measure}_ns", 0.99)
    base = as_window(baseline_rows).quantile(f"{measure}_ns", 0.99)
    if cur is None or base is None:
        return Degradation(measure, base, cur, None, False)
    ratio = cur / base if base > 0 else math.inf
    degraded = ratio >= DEGRADED_RATIO and cur - base >= MIN_DEGRADATION_NS
    return Degradation(measure, base, cur, ratio, degraded)


def _window_of(rows: Rows) -> Window | None:
    spans = [span for span in as_window(rows).replica_spans().values() if span is not None]
    return (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None


def cold_start_rows(current_rows: Rows, baseline_rows: Rows,
                    startups: Sequence[ReplicaStartup] = ()) -> dict[str, list[Mapping[str, Any]]]:
    """Per starting replica: its requests within :data:`COLD_START_WINDOW_SECONDS` of its start.

    A replica is starting when it is absent from the baseline (its start: its first request in
    the current window) or when one of ``startups`` (start-up spans, :mod:`.startup`) names it
    became ready at most :data:`COLD_START_WINDOW_SECONDS` before the current window's first
    request and serves in it (its start: ``ready_at``) — the latter also
    catches a replica restarted under the same name.
    """
    current = as_window(current_rows)
    known = as_window(baseline_rows).replicas()
    startups = list(startups)
    if not startups and current.replicas() <= known:
        return {}  # no replica is new and none restarted: no spans to read
    spans = current.replica_spans()
    limit = timedelta(seconds=COLD_START_WINDOW_SECONDS)
    measured = [span for span in spans.values() if span is not None]
    started: dict[str, datetime] = {}
    if measured:
        first, last = min(s[0] for s in measured), max(s[1] for s in measured)
        for startup in startups:
            if startup.replica and startup.replica in spans and first - limit <= startup.ready_at <= last:
                started[startup.replica] = min(startup.ready_at, started.get(startup.replica, startup.ready_at))
    started.update({replica: span[0] for replica, span in spans.items()
                    if replica and replica not in known and replica not in started and span is not None})
    out: dict[str, list[Mapping[str, Any]]] = {}
    for row in current.rows_of(started):
        replica = row.get("replica")
        if replica in started and timedelta(0) <= row["timestamp"] - started[replica] <= limit:
            out.setdefault(replica, []).append(row)
    return out


# ---------------------------------------------------------------------------- the core

def diagnose_from(
    current_rows: Rows,
    baseline_rows: Rows,
    signals: Signals | None = None,
    *,
    current_window: Window | None = None,
    baseline_window: Window | None = None,
    startups: Sequence[ReplicaStartup] = (),
) -> Verdict:
    """Diagnose ``current_rows`` against ``baseline_rows`` (request-row dicts, see
    :mod:`inferpath.analysis.breakdown`, or windows of :mod:`inferpath.analysis.request_window`)
    with the engine/GPU ``signals`` of both windows.

    ``startups``: engine start-ups read from start-up spans (:func:`.startup.fetch_startups`),
    used to recognise and measure cold starts. Windows default to the span of the rows'
    timestamps. Raises
    :class:`InsufficientDataError` when a window has fewer than :data:`MIN_REQUESTS`
    requests with an E2E latency.
    """
    signals = signals or SignalWindows()
    current_rows, baseline_rows = as_window(current_rows), as_window(baseline_rows)
    for name, rows in (("current", current_rows), ("baseline", baseline_rows)):
        measured = rows.measured("e2e_ns")
        if measured < MIN_REQUESTS:
            raise InsufficientDataError(
                f"{name} window has {measured} requests with an E2E latency; at least {MIN_REQUESTS} are needed",
                window=name,
            )
    windows = (current_window or _window_of(current_rows), baseline_window or _window_of(baseline_rows))
    degradations = [degradation(m, current_rows, baseline_rows) for m in ("ttft", "itl", "e2e")]
    by_measure = {d.measure: d for d in degradations}
    verdict = Verdict(healthy=True, summary="", measure=None, degradations=degradations, causes=[],
                      current_window=windows[0], baseline_window=windows[1],
                      current_requests=len(current_rows), baseline_requests=len(baseline_rows))
    degraded = [d for d in degradations if d.degraded]
    if not degraded:
        verdict.summary = "healthy: " + "; ".join(_degradation_text(d) for d in degradations if d.ratio)
        return verdict
    verdict.healthy = False
    # The troubleshooting order: TTFT first. Every stage before the first token (CPU stages,
    # hops, queue, prefill) lives in it, and attributing over E2E would mix in decode noise.
    # ITL or E2E degrading alone shows up as added decode time, so it is attributed over E2E.
    verdict.measure = "ttft" if by_measure["ttft"].degraded else "e2e"
    verdict.causes = attribute(verdict.measure, current_rows, baseline_rows, signals, windows, startups)
    worst = max(degraded, key=lambda d: d.ratio or 0)
    verdict.summary = _degradation_text(worst) + (
        f"; top cause: {verdict.causes[0].cause} ({verdict.causes[0].share:.0%} of the increase)"
        if verdict.causes else "; no single cause explains the increase"
    )
    return verdict


def attribute(
    measure: str, current_rows: Rows, baseline_rows: Rows,
    signals: Signals, windows: tuple[Window | None, Window | None],
    startups: Sequence[ReplicaStartup] = (),
) -> list[Cause]:
    """Share the growth of the tail band's mean ``measure`` among causes (module docstring)."""
    stages = measure_stages(measure)
    current_rows, baseline_rows = as_window(current_rows), as_window(baseline_rows)
    column = f"{measure}_ns"
    # The edges come from each window's quantile, so only the tail (a tenth) is summed, and
    # in integer ns: a stored window sums in the store and gives the same numbers.
    current_edge = current_rows.quantile(column, TAIL_QUANTILE)
    baseline_edge = baseline_rows.quantile(column, TAIL_QUANTILE)
    if current_edge is None or baseline_edge is None:
        return []
    # Stored windows read both bands' sums and the queue time's quantiles in one scan.
    prepare_attribution(current_rows, baseline_rows, measure, current_edge, baseline_edge)
    cold = {r.get("trace_id") for rows in cold_start_rows(current_rows, baseline_rows, startups).values()
            for r in rows}
    current_tail = current_rows.tail_sums(measure, current_edge, cold)
    baseline_tail = baseline_rows.tail_sums(measure, baseline_edge)
    if not current_tail.count or not baseline_tail.count:
        return []
    n = current_tail.count
    base_mean = {s: baseline_tail.stage_ns[s] / baseline_tail.count for s in (*stages, REST)}
    base_total = baseline_tail.total_ns / baseline_tail.count
    context = {
        "kv": kv_pressure(signals, len(current_rows), len(baseline_rows)),
        "saturated": gpu_saturated(signals) or decode_slower(current_rows, baseline_rows),
        "batch": batch_grew(signals),
        "held": queue_held(current_rows, baseline_rows),
    }
    added: dict[str, float] = {}
    stages_of: dict[str, list[str]] = {}
    if current_tail.kept_count:
        for stage in (*stages, REST):
            cause = stage_cause(stage, **context)
            kept = current_tail.kept_stage_ns[stage] - current_tail.kept_count * base_mean[stage]
            added[cause] = added.get(cause, 0.0) + kept / n
            if stage not in stages_of.setdefault(cause, []):
                stages_of[cause].append(stage)
    cold_count = current_tail.count - current_tail.kept_count
    if cold_count:  # a request on a starting replica is charged to the cold start as a whole
        added["cold_start"] = (current_tail.excluded_total_ns - cold_count * base_total) / n
    total_added = current_tail.total_ns / n - base_total
    if total_added <= 0:
        return []
    causes = [
        Cause(cause=name, share=value / total_added, added_ns=value,
              stages=[s for s in stages_of.get(name, []) if _grew(s, current_tail, baseline_tail)])
        for name, value in added.items() if value / total_added >= MIN_CAUSE_SHARE
    ]
    causes.sort(key=lambda c: -c.share)
    # The columns the evidence quotes, read for both windows at once.
    prefetch_quantiles(current_rows, baseline_rows,
                       [column for cause in causes for column in _EVIDENCE_COLUMNS.get(cause.cause, ())])
    for cause in causes:
        _explain(cause, measure, current_rows, baseline_rows, signals, windows, startups)
    return causes


def _grew(stage: str, current_tail: TailSums, baseline_tail: TailSums) -> bool:
    return current_tail.stage_ns[stage] / current_tail.count > baseline_tail.stage_ns[stage] / baseline_tail.count


# ---------------------------------------------------------------------------- evidence and advice

def _ms(ns: float | None) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:.0f} ms" if ns >= 1e7 else f"{ns / 1e6:.1f} ms"


def _degradation_text(d: Degradation) -> str:
    name = d.measure.upper()
    if d.ratio is None:
        return f"{name} not measured in both windows"
    return f"{name} p99 {_ms(d.baseline_p99_ns)} → {_ms(d.current_p99_ns)} ({d.ratio:.1f}×)"


_CPU_STAGE = {"tokenization": "tokenize_ns", "retrieval": "retrieval_ns", "network_hop": "network_ns"}
_EVIDENCE_COLUMNS: dict[str, tuple[str, ...]] = {
    "tokenization": ("tokenize_ns",), "retrieval": ("retrieval_ns",), "network_hop": ("network_ns", "gateway_ns"),
    "queueing": ("queue_ns",), "gpu_compute": ("queue_ns", "prefill_ns", "itl_ns"), "gpu_memory": ("queue_ns",),
    "batching": ("queue_ns", "itl_ns", "decode_ns"),
}
"""The request columns whose quantiles :func:`_explain` quotes per cause."""
_HELP = {
    "tokenization": "use a fast (Rust) tokenizer, cache tokenized prompts and tokenize off the event loop",
    "retrieval": "cache retrieval results, shrink top-k or the index, and give the retriever its own workers",
    "network_hop": "remove the extra hop or co-locate the gateway with the model server; keep connections alive",
    "queueing": "add replicas or raise the engine's concurrent-sequence limit; rate-limit bulk traffic",
    "gpu_compute": "add GPUs or replicas, or move bulk traffic to replicas of its own",
    "gpu_memory": "give the KV cache more room (fewer concurrent sequences, shorter max length, prefix "
                  "caching, a quantized KV cache) or add replicas",
    "batching": "cap the batch for interactive endpoints (a smaller batch window or fewer running sequences) "
                "and serve bulk traffic from separate replicas",
    "cold_start": "keep warm replicas (a minimum replica count), preload weights, and route to a replica "
                  "only once it is ready",
}


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _explain(cause: Cause, measure: str, current_rows: RowsWindow | StoredWindow,
             baseline_rows: RowsWindow | StoredWindow, signals: Signals,
             windows: tuple[Window | None, Window | None], startups: Sequence[ReplicaStartup] = ()) -> None:
    """Fill ``cause.evidence``, ``would_help`` and ``would_not_help`` with the numbers."""
    current_window, baseline_window = windows

    def evidence(measure_name: str, statistic: str, unit: str, base: float | None, cur: float | None,
                 text: str) -> None:
        cause.evidence.append(Evidence(measure_name, statistic, unit, base, cur, baseline_window, current_window, text))

    def stage_p99(column: str) -> str:
        b, c = baseline_rows.quantile(column, 0.99), current_rows.quantile(column, 0.99)
        name = column.removesuffix("_ns")
        evidence(column, "p99", "ns", b, c, f"{name} p99 {_ms(b)} → {_ms(c)}")
        return f"{name} went from {_ms(b)} to {_ms(c)} at p99"

    def signal(name: str, which: str, unit: str = "ratio") -> tuple[float | None, float | None]:
        b, c = signals.baseline.stat(name, which), signals.current.stat(name, which)
        if b is not None or c is not None:
            fmt = _percent if unit == "ratio" else (lambda v: "n/a" if v is None else f"{v:.1f}")
            evidence(name, which, unit, b, c, f"{name} {which} {fmt(b)} → {fmt(c)}")
        return b, c

    d = degradation(measure, current_rows, baseline_rows)
    rise = f"{measure.upper()} p99 rose" + (f" {d.ratio:.1f}×" if d.ratio else "")
    evidence(f"{measure}_ns", "mean of tail band", "ns", None, cause.added_ns,
             f"{cause.cause} added {_ms(cause.added_ns)} per request in the slowest "
             f"{1 - TAIL_QUANTILE:.0%} ({cause.share:.0%} of the increase)")
    _, util = signal(GPU_UTILIZATION_RATIO, "mean")
    gpus_idle = util is not None and util < GPU_HEADROOM_RATIO
    if cause.cause in _HELP:
        cause.would_help.append(_HELP[cause.cause])

    if cause.cause in _CPU_STAGE:
        moved = stage_p99(_CPU_STAGE[cause.cause])
        reason = (f"utilization {util:.0%} while {rise}" if gpus_idle
                  else "the time is spent before the request reaches the engine")
        cause.would_not_help.append(f"adding GPUs will not help: {reason}; {moved}")
        if cause.cause == "network_hop":
            stage_p99("gateway_ns")
    elif cause.cause == "queueing":
        stage_p99("queue_ns")
        signal(QUEUE_DEPTH, "mean", "requests")
        cause.would_not_help.append("faster tokenization or retrieval will not help: requests wait in the engine queue")
        if gpus_idle:
            cause.would_help.append(f"the GPUs have headroom (utilization {util:.0%}): "
                                    "raise the engine's batch limit before adding GPUs")
    elif cause.cause == "gpu_compute":
        stage_p99("queue_ns")
        stage_p99("prefill_ns")
        b50, c50 = baseline_rows.quantile("itl_ns", 0.5), current_rows.quantile("itl_ns", 0.5)
        evidence("itl_ns", "p50", "ns", b50, c50, f"median decode step (ITL p50) {_ms(b50)} → {_ms(c50)}")
        signal(QUEUE_DEPTH, "mean", "requests")
        cause.would_not_help.append("tuning the tokenizer, retrieval or the network will not help: "
                                    f"the engine is the bottleneck (GPU utilization {_percent(util)})")
    elif cause.cause == "gpu_memory":
        stage_p99("queue_ns")
        _, kv = signal(KV_CACHE_USAGE_RATIO, "p90")
        signal(QUEUE_DEPTH, "mean", "requests")
        before, after = signals.baseline.preemptions, signals.current.preemptions
        evidence("preemptions_total", "total", "count", before, after,
                 f"preemptions {before or 0:.0f} → {after or 0:.0f}")
        idle = f" while GPU utilization is {util:.0%}" if util is not None else ""
        cause.would_not_help.append(f"more compute alone will not help: KV-cache usage p90 {_percent(kv)} "
                                    f"and {after or 0:.0f} preemptions{idle}")
    elif cause.cause == "batching":
        if "queue" in cause.stages:
            b50, c50 = baseline_rows.quantile("queue_ns", 0.5), current_rows.quantile("queue_ns", 0.5)
            evidence("queue_ns", "p50", "ns", b50, c50,
                     f"every request waits longer before its prefill: queue p50 {_ms(b50)} → {_ms(c50)}")
            idle = f" while GPU utilization is {util:.0%}" if util is not None else ""
            cause.would_help.append("shorten or remove the batching window: it holds each request before "
                                    f"prefill{idle}")
        stage_p99("itl_ns")
        stage_p99("decode_ns")
        before, after = signal(RUNNING_REQUESTS, "mean", "requests")
        grown = f": running requests went from {before:.0f} to {after:.0f}" if before and after else ""
        cause.would_not_help.append(f"adding GPUs will not help while each one runs oversized batches{grown}")
    elif cause.cause == "cold_start":
        serving = current_rows.replicas()
        for startup in startups:
            if startup.replica in serving:
                evidence("loading_seconds", "total", "seconds", None, startup.loading_seconds, startup.text())
        for replica, rows in cold_start_rows(current_rows, baseline_rows, startups).items():
            p99 = RowsWindow(rows).quantile(f"{measure}_ns", 0.99)
            evidence(f"{measure}_ns", "p99", "ns", d.baseline_p99_ns, p99,
                     f"new replica {replica}: {len(rows)} requests in its first "
                     f"{COLD_START_WINDOW_SECONDS:.0f} s, {measure.upper()} p99 {_ms(p99)}")
        cause.would_not_help.append("more steady-state capacity will not help requests that land on a starting replica")
    else:
        cause.would_help.append(f"instrument the missing stages: {_ms(cause.added_ns)} per slow request "
                                "is in no stage span")


# ---------------------------------------------------------------------------- from a store

def diagnose(
    store: Any, *, window_start: datetime, window_end: datetime,
    baseline_start: datetime, baseline_end: datetime, endpoint: str | None = None,
) -> Verdict:
    """Diagnose requests in ``[window_start, window_end)`` against ``[baseline_start, baseline_end)``.

    Reads the ``ok`` requests (optionally of one ``endpoint``) of both windows as a
    :meth:`~inferpath.analysis.request_window.StoredWindow.pair` (counts, quantiles and tail
    sums aggregated in the store, both windows per scan; only starting replicas' rows are
    read) and, when a measure degraded, the canonical engine/GPU signals of both windows
    (:class:`~inferpath.analysis.signals.StoredSignalWindows`) and the start-up spans, then
    applies :func:`diagnose_from`. Datetimes
    must be timezone-aware. Raises ``ValueError`` for an empty or reversed window and
    :class:`InsufficientDataError` for too few requests.
    """
    for name, start, end in (("window", window_start, window_end), ("baseline", baseline_start, baseline_end)):
        if unix_ns_from_datetime(end) <= unix_ns_from_datetime(start):
            raise ValueError(f"{name}_end must be after {name}_start")
    current_rows, baseline_rows = StoredWindow.pair(store, (window_start, window_end),
                                                    (baseline_start, baseline_end), endpoint=endpoint)
    # Signals and start-ups are read on first use: a healthy verdict, or one window with too
    # few requests, needs neither.
    signals = StoredSignalWindows(store, (window_start, window_end), (baseline_start, baseline_end))
    # A replica may finish loading a little before it takes its first request (readiness
    # probes, load-balancer updates): look back one cold-start window.
    lookback = timedelta(seconds=COLD_START_WINDOW_SECONDS)
    startups = StoredStartups(store, window_start - 2 * lookback, window_end,
                              ready_from=window_start - lookback, ready_before=window_end)
    return diagnose_from(current_rows, baseline_rows, signals,
                         current_window=(window_start, window_end), baseline_window=(baseline_start, baseline_end),
                         startups=startups)


__all__ = [
    "BATCH_GROWTH_RATIO", "COLD_START_WINDOW_SECONDS", "DEGRADED_RATIO", "GPU_HEADROOM_RATIO",
    "GPU_SATURATED_RATIO", "HELD_QUEUE_RATIO", "KV_HIGH_RATIO", "InsufficientDataError", "MIN_HELD_QUEUE_NS", "KV_PRESSURE_RATIO", "MIN_CAUSE_SHARE",
    "MIN_DEGRADATION_NS", "MIN_REQUESTS", "SignalWindows", "TAIL_QUANTILE", "WindowSignals", "attribute",
    "batch_grew", "cold_start_rows", "degradation", "diagnose", "diagnose_from", "gpu_saturated",
    "kv_pressure", "queue_held", "decode_slower", "stage_cause",
]
