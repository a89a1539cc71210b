"""Name the bottleneck: compare a window with a baseline and walk the troubleshooting order.

The order an SRE would follow, and what each step looks at:

1. Which measure degraded (TTFT, ITL, E2E), at p99, against the baseline window.
2. Where the added time sits. For the slowest requests of each window (the *tail band*,
   at or above the window's p90 of the measure) the mean time of every stage is compared.
   Means add up (the measure = stages + rest) where percentiles do not, so each stage's
   growth is a share of the growth of the tail's mean; the tail is used rather than all
   requests because the p99 is what degraded.
3. Why a stage grew, from the engine and GPU state of the same windows:
   queue time → KV-cache pressure (``gpu_memory``), else a saturated GPU (``gpu_compute``),
   else a batch grown larger (``batching``), else plain ``queueing``;
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

from inferpath.analysis.breakdown import REST, fetch_request_rows, measure_stages, request_breakdown
from inferpath.analysis.percentiles import quantile
from inferpath.analysis.signals import (
    GPU_UTILIZATION_RATIO, KV_CACHE_USAGE_RATIO, QUEUE_DEPTH, RUNNING_REQUESTS,
    SignalWindows, WindowSignals, fetch_window_signals,
)
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
GPU_SATURATED_RATIO = 0.90
"""Utilization above which the GPU has no idle time left to absorb more work."""
GPU_HEADROOM_RATIO = 0.60
"""Utilization below which more GPUs cannot be the fix: the ones there are idle 40% of the time."""
BATCH_GROWTH_RATIO = 1.5
"""Running requests (batch size) up by half: each decode step now carries 1.5× the tokens."""
COLD_START_WINDOW_SECONDS = 60.0
"""Requests within a minute of a replica's first request still meet model loading, CUDA
graph capture and cold caches."""


class InsufficientDataError(ValueError):
    """A window holds too few requests to compare percentiles; the message names the window."""


# ---------------------------------------------------------------------------- rules on signals

def kv_pressure(signals: SignalWindows, current_requests: int, baseline_requests: int) -> bool:
    """KV cache under pressure in the current window: usage p90 ≥ :data:`KV_PRESSURE_RATIO`,
    or more preemptions per request than in the baseline (an engine preempts only when it
    runs out of KV blocks)."""
    usage = signals.current.stat(KV_CACHE_USAGE_RATIO, "p90")
    if usage is not None and usage >= KV_PRESSURE_RATIO:
        return True
    current = (signals.current.preemptions or 0.0) / max(current_requests, 1)
    baseline = (signals.baseline.preemptions or 0.0) / max(baseline_requests, 1)
    return current > 0 and current > baseline


def gpu_saturated(signals: SignalWindows) -> bool:
    """Mean GPU utilization of the current window ≥ :data:`GPU_SATURATED_RATIO`."""
    utilization = signals.current.stat(GPU_UTILIZATION_RATIO)
    return utilization is not None and utilization >= GPU_SATURATED_RATIO


def batch_grew(signals: SignalWindows) -> bool:
    """Mean running requests grew by :data:`BATCH_GROWTH_RATIO` or more over the baseline."""
    current = signals.current.stat(RUNNING_REQUESTS)
    baseline = signals.baseline.stat(RUNNING_REQUESTS)
    if current is None or baseline is None or baseline <= 0:
        return False
    return current >= BATCH_GROWTH_RATIO * baseline


def stage_cause(stage: str, *, kv: bool, saturated: bool, batch: bool) -> str:
    """The cause a stage's growth is charged to, given the engine state (module docstring)."""
    if stage == "tokenize":
        return "tokenization"
    if stage == "retrieval":
        return "retrieval"
    if stage == "network":
        return "network_hop"
    if stage == "queue":
        return "gpu_memory" if kv else "gpu_compute" if saturated else "batching" if batch else "queueing"
    if stage == "prefill":
        return "gpu_memory" if kv else "gpu_compute"
    if stage == "decode":
        return "gpu_memory" if kv else "batching" if batch else "gpu_compute"
    return "unexplained"


# ---------------------------------------------------------------------------- measures

def _values(rows: Sequence[Mapping[str, Any]], column: str) -> list[float]:
    return [float(r[column]) for r in rows if r.get(column) is not None]


def degradation(measure: str, current_rows: Sequence[Mapping[str, Any]],
                baseline_rows: Sequence[Mapping[str, Any]]) -> Degradation:
    """Compare ``measure``'s exact p99 between windows; degraded when it rose by both
    :data:`DEGRADED_RATIO` and :data:`MIN_DEGRADATION_NS`."""
    current, baseline = _values(current_rows, f"{measure}_ns"), _values(baseline_rows, f"{measure}_ns")
    cur = quantile(current, 0.99) if current else None
    base = quantile(baseline, 0.99) if baseline else None
    if cur is None or base is None:
        return Degradation(measure, base, cur, None, False)
    ratio = cur / base if base > 0 else math.inf
    degraded = ratio >= DEGRADED_RATIO and cur - base >= MIN_DEGRADATION_NS
    return Degradation(measure, base, cur, ratio, degraded)


def _window_of(rows: Sequence[Mapping[str, Any]]) -> Window | None:
    times = [r["timestamp"] for r in rows if isinstance(r.get("timestamp"), datetime)]
    return (min(times), max(times)) if times else None


def cold_start_rows(current_rows: Sequence[Mapping[str, Any]],
                    baseline_rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Per replica absent from the baseline: its requests within
    :data:`COLD_START_WINDOW_SECONDS` of its first request in the current window."""
    known = {r.get("replica") for r in baseline_rows}
    first_seen: dict[str, datetime] = {}
    for row in current_rows:
        replica, ts = row.get("replica"), row.get("timestamp")
        if replica and replica not in known and isinstance(ts, datetime):
            first_seen[replica] = min(ts, first_seen.get(replica, ts))
    limit = timedelta(seconds=COLD_START_WINDOW_SECONDS)
    out: dict[str, list[Mapping[str, Any]]] = {}
    for row in current_rows:
        replica = row.get("replica")
        if replica in first_seen and row["timestamp"] - first_seen[replica] <= limit:
            out.setdefault(replica, []).append(row)
    return out


# ---------------------------------------------------------------------------- the core

def diagnose_from(
    current_rows: Sequence[Mapping[str, Any]],
    baseline_rows: Sequence[Mapping[str, Any]],
    signals: SignalWindows | None = None,
    *,
    current_window: Window | None = None,
    baseline_window: Window | None = None,
) -> Verdict:
    """Diagnose ``current_rows`` against ``baseline_rows`` (request-row dicts, see
    :mod:`inferpath.analysis.breakdown`) with the engine/GPU ``signals`` of both windows.

    Windows default to the span of the rows' timestamps. Raises
    :class:`InsufficientDataError` when a window has fewer than :data:`MIN_REQUESTS`
    requests with an E2E latency.
    """
    signals = signals or SignalWindows()
    for name, rows in (("current", current_rows), ("baseline", baseline_rows)):
        measured = sum(1 for r in rows if r.get("e2e_ns") is not None)
        if measured < MIN_REQUESTS:
            raise InsufficientDataError(
                f"{name} window has {measured} requests with an E2E latency; at least {MIN_REQUESTS} are needed"
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
    latency = [d for d in degraded if d.measure in ("ttft", "e2e")]
    # ITL alone degrading still shows up as added decode time, so it is attributed over E2E.
    verdict.measure = max(latency, key=lambda d: d.ratio or 0).measure if latency else "e2e"
    verdict.causes = attribute(verdict.measure, current_rows, baseline_rows, signals, windows)
    worst = max(degraded, key=lambda d: d.ratio or 0)
    verdict.summary = _degradation_text(worst) + (
        f"; top cause: {verdict.causes[0].cause} ({verdict.causes[0].share:.0%} of the increase)"
        if verdict.causes else "; no single cause explains the increase"
    )
    return verdict


def attribute(
    measure: str, current_rows: Sequence[Mapping[str, Any]], baseline_rows: Sequence[Mapping[str, Any]],
    signals: SignalWindows, windows: tuple[Window | None, Window | None],
) -> list[Cause]:
    """Share the growth of the tail band's mean ``measure`` among causes (module docstring)."""
    stages = measure_stages(measure)
    current_tail, baseline_tail = _tail(current_rows, measure), _tail(baseline_rows, measure)
    if not current_tail or not baseline_tail:
        return []
    n = len(current_tail)
    base_mean = {s: math.fsum(b.stage_ns[s] for b in baseline_tail) / len(baseline_tail) for s in (*stages, REST)}
    base_total = math.fsum(b.total_ns for b in baseline_tail) / len(baseline_tail)
    cold = {r.get("trace_id") for rows in cold_start_rows(current_rows, baseline_rows).values() for r in rows}
    context = {
        "kv": kv_pressure(signals, len(current_rows), len(baseline_rows)),
        "saturated": gpu_saturated(signals),
        "batch": batch_grew(signals),
    }
    added: dict[str, float] = {}
    stages_of: dict[str, list[str]] = {}
    for item in current_tail:
        if item.trace_id in cold:
            added["cold_start"] = added.get("cold_start", 0.0) + (item.total_ns - base_total) / n
            continue
        for stage in (*stages, REST):
            cause = stage_cause(stage, **context)
            added[cause] = added.get(cause, 0.0) + (item.stage_ns[stage] - base_mean[stage]) / n
            if stage not in stages_of.setdefault(cause, []):
                stages_of[cause].append(stage)
    total_added = math.fsum(b.total_ns for b in current_tail) / n - base_total
    if total_added <= 0:
        return []
    causes = [
        Cause(cause=name, share=value / total_added, added_ns=value,
              stages=[s for s in stages_of.get(name, []) if _grew(s, current_tail, baseline_tail)])
        for name, value in added.items() if value / total_added >= MIN_CAUSE_SHARE
    ]
    causes.sort(key=lambda c: -c.share)
    for cause in causes:
        _explain(cause, measure, current_rows, baseline_rows, signals, windows)
    return causes


def _tail(rows: Sequence[Mapping[str, Any]], measure: str) -> list:
    items = [b for b in (request_breakdown(r, measure) for r in rows) if b is not None]
    if not items:
        return []
    edge = quantile([b.total_ns for b in items], TAIL_QUANTILE)
    return [b for b in items if b.total_ns >= edge]


def _grew(stage: str, current_tail: Sequence, baseline_tail: Sequence) -> bool:
    cur = math.fsum(b.stage_ns[stage] for b in current_tail) / len(current_tail)
    base = math.fsum(b.stage_ns[stage] for b in baseline_tail) / len(baseline_tail)
    return cur > base


# ---------------------------------------------------------------------------- evidence and advice

def _ms(ns: float | None) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:.0f} ms" if ns >= 1e7 else f"{ns / 1e6:.1f} ms"


def _degradation_text(d: Degradation) -> str:
    name = d.measure.upper()
    if d.ratio is None:
        return f"{name} not measured in both windows"
    return f"{name} p99 {_ms(d.baseline_p99_ns)} → {_ms(d.current_p99_ns)} ({d.ratio:.1f}×)"


_CPU_STAGE = {"tokenization": "tokenize_ns", "retrieval": "retrieval_ns", "network_hop": "network_ns"}
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


def _explain(cause: Cause, measure: str, current_rows: Sequence[Mapping[str, Any]],
             baseline_rows: Sequence[Mapping[str, Any]], signals: SignalWindows,
             windows: tuple[Window | None, Window | None]) -> None:
    """Fill ``cause.evidence``, ``would_help`` and ``would_not_help`` with the numbers."""
    current_window, baseline_window = windows

    def evidence(measure_name: str, statistic: str, unit: str, base: float | None, cur: float | None,
                 text: str) -> None:
        cause.evidence.append(Evidence(measure_name, statistic, unit, base, cur, baseline_window, current_window, text))

    def stage_p99(column: str) -> str:
        base, cur = _values(baseline_rows, column), _values(current_rows, column)
        b = quantile(base, 0.99) if base else None
        c = quantile(cur, 0.99) if cur else None
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
        stage_p99("itl_ns")
        stage_p99("decode_ns")
        before, after = signal(RUNNING_REQUESTS, "mean", "requests")
        grown = f": running requests went from {before:.0f} to {after:.0f}" if before and after else ""
        cause.would_not_help.append(f"adding GPUs will not help while each one runs oversized batches{grown}")
    elif cause.cause == "cold_start":
        for replica, rows in cold_start_rows(current_rows, baseline_rows).items():
            values = _values(rows, f"{measure}_ns")
            p99 = quantile(values, 0.99) if values else None
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

    Reads ``ok`` request rows (optionally of one ``endpoint``) and the canonical engine/GPU
    signals of both windows from ``store``, then applies :func:`diagnose_from`. Datetimes
    must be timezone-aware. Raises ``ValueError`` for an empty or reversed window and
    :class:`InsufficientDataError` for too few requests.
    """
    for name, start, end in (("window", window_start, window_end), ("baseline", baseline_start, baseline_end)):
        if unix_ns_from_datetime(end) <= unix_ns_from_datetime(start):
            raise ValueError(f"{name}_end must be after {name}_start")
    current_rows = fetch_request_rows(store, start=window_start, end=window_end, endpoint=endpoint)
    baseline_rows = fetch_request_rows(store, start=baseline_start, end=baseline_end, endpoint=endpoint)
    signals = SignalWindows(
        current=fetch_window_signals(store, window_start, window_end),
        baseline=fetch_window_signals(store, baseline_start, baseline_end),
    )
    return diagnose_from(current_rows, baseline_rows, signals,
                         current_window=(window_start, window_end), baseline_window=(baseline_start, baseline_end))


__all__ = [
    "BATCH_GROWTH_RATIO", "COLD_START_WINDOW_SECONDS", "DEGRADED_RATIO", "GPU_HEADROOM_RATIO",
    "GPU_SATURATED_RATIO", "InsufficientDataError", "KV_PRESSURE_RATIO", "MIN_CAUSE_SHARE",
    "MIN_DEGRADATION_NS", "MIN_REQUESTS", "SignalWindows", "TAIL_QUANTILE", "WindowSignals", "attribute",
    "batch_grew", "cold_start_rows", "degradation", "diagnose", "diagnose_from", "gpu_saturated",
    "kv_pressure", "stage_cause",
]
