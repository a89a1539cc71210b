"""Diagnosis against a latency target: which stages on the TTFT critical path to move.

The baseline comparison of :mod:`~inferpath.analysis.diagnosis` answers "what changed"; an
endpoint that has always been slow has no good baseline, so this answers "where does the
time over the target go, and what can be taken off the critical path". For the slowest
requests (the tail band at or above the window's p90 of TTFT, as the diagnosis uses) the
mean time of each TTFT stage is measured; stages the caller controls are charged first:

- ``tokenize`` → ``tokenization``: tokenizing in the serving process (a Rust tokenizer,
  in-process rather than a remote call, cached prompts) takes it off the path;
- ``retrieval`` → ``retrieval``: running retrieval in parallel with the model's first pass
  over the prompt (the prompt's prefill, or speculative prefill of the system part) hides it;
- ``network`` → ``network_hop``: co-locating the hop removes it.

The engine's own stages (queue, prefill) are what the GPU does. When the engine's part alone
fits in the target, adding GPUs will not bring the endpoint under it; when it does not,
``gpu_compute`` (or ``gpu_memory`` under KV pressure) is named as well.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from inferpath.analysis.diagnosis import (
    GPU_HEADROOM_RATIO, MIN_CAUSE_SHARE, MIN_REQUESTS, TAIL_QUANTILE, InsufficientDataError, kv_pressure,
)
from inferpath.analysis.breakdown import request_breakdown
from inferpath.analysis.percentiles import quantile
from inferpath.analysis.signals import GPU_UTILIZATION_RATIO, SignalWindows
from inferpath.analysis.verdict import Cause, Degradation, Evidence, Verdict, Window

MOVABLE: dict[str, tuple[str, str]] = {
    "tokenize": ("tokenization", "move tokenization in-process (a Rust tokenizer in the serving process, "
                                 "cached prompt tokens)"),
    "retrieval": ("retrieval", "run retrieval in parallel with the first model pass over the prompt"),
    "network": ("network_hop", "co-locate the gateway with the model server (remove the hop)"),
}
"""Stage → (cause, the change that takes it off the critical path)."""
ENGINE_STAGES = ("queue", "prefill")


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.0f} ms"


def diagnose_against_target(
    rows: Sequence[Mapping[str, Any]], *, ttft_target_ns: int, signals: SignalWindows | None = None,
    window: Window | None = None,
) -> Verdict:
    """Explain how the TTFT p99 of ``rows`` (request-row dicts) exceeds ``ttft_target_ns``.

    Returns a :class:`Verdict` whose ``degradations`` hold one TTFT entry (``baseline_p99_ns`` =
    the target) and whose causes are the movable stages (module docstring) in order of their
    mean time in the tail band, each with ``added_ns`` = that time and ``share`` = it over the
    excess, plus the engine cause when the engine alone exceeds the target. ``summary`` says
    how much moving them would recover. Healthy when the p99 is within the target.
    Raises ``ValueError`` for a target ≤ 0 and :class:`InsufficientDataError` under
    :data:`MIN_REQUESTS` requests with a TTFT.
    """
    if ttft_target_ns <= 0:
        raise ValueError(f"ttft_target_ns must be > 0, got {ttft_target_ns}")
    breakdowns = [b for b in (request_breakdown(r, "ttft") for r in rows) if b is not None]
    if len(breakdowns) < MIN_REQUESTS:
        raise InsufficientDataError(f"window has {len(breakdowns)} requests with a TTFT; at least "
                                    f"{MIN_REQUESTS} are needed")
    signals = signals or SignalWindows()
    p99 = quantile([b.total_ns for b in breakdowns], 0.99)
    degradation = Degradation("ttft", float(ttft_target_ns), p99, p99 / ttft_target_ns, p99 > ttft_target_ns)
    verdict = Verdict(healthy=not degradation.degraded, summary="", measure="ttft", degradations=[degradation],
                      causes=[], current_window=window, baseline_window=None,
                      current_requests=len(rows), baseline_requests=0)
    if verdict.healthy:
        verdict.summary = f"healthy: TTFT p99 {_ms(p99)} within the {_ms(ttft_target_ns)} target"
        return verdict

    edge = quantile([b.total_ns for b in breakdowns], TAIL_QUANTILE)
    tail = [b for b in breakdowns if b.total_ns >= edge]
    mean = {stage: math.fsum(b.stage_ns[stage] for b in tail) / len(tail) for stage in tail[0].stage_ns}
    excess = p99 - ttft_target_ns
    engine_ns = sum(mean.get(s, 0.0) for s in ENGINE_STAGES)
    utilization = signals.current.stat(GPU_UTILIZATION_RATIO)

    def evidence(measure: str, value: float, text: str, unit: str = "ns", statistic: str = "mean of tail band"):
        return Evidence(measure, statistic, unit, None, value, None, window, text)

    recoverable = 0.0
    for stage, (name, action) in MOVABLE.items():
        spent = mean.get(stage, 0.0)
        if spent <= 0 or spent / excess < MIN_CAUSE_SHARE:
            continue
        recoverable += spent
        cause = Cause(cause=name, share=spent / excess, added_ns=spent, stages=[stage])
        cause.evidence.append(evidence(f"{stage}_ns", spent, f"{stage} takes {_ms(spent)} of the slowest "
                                       f"{1 - TAIL_QUANTILE:.0%} requests' {_ms(mean_total(tail))} TTFT, "
                                       "on the critical path"))
        cause.would_help.append(f"{action}: recovers about {_ms(spent)}")
        verdict.causes.append(cause)
    if engine_ns > ttft_target_ns:
        kv = kv_pressure(signals, len(rows), 0)
        cause = Cause(cause="gpu_memory" if kv else "gpu_compute", share=(engine_ns - ttft_target_ns) / excess,
                      added_ns=engine_ns - ttft_target_ns, stages=list(ENGINE_STAGES))
        cause.evidence.append(evidence("queue_ns+prefill_ns", engine_ns,
                                       f"queue + prefill alone take {_ms(engine_ns)}, over the target"))
        cause.would_help.append("add GPUs or replicas, or shorten prompts: the engine alone exceeds the target")
        verdict.causes.append(cause)
    verdict.causes.sort(key=lambda c: -c.added_ns)
    gpu_text = f"GPU utilization {utilization:.0%}; " if utilization is not None else ""
    if engine_ns <= ttft_target_ns and verdict.causes:
        not_gpu = (f"adding GPUs will not help: {gpu_text}queue + prefill take {_ms(engine_ns)}, "
                   f"within the {_ms(ttft_target_ns)} target")
        for cause in verdict.causes:
            cause.would_not_help.append(not_gpu)
            if utilization is not None and utilization < GPU_HEADROOM_RATIO:
                cause.evidence.append(evidence(GPU_UTILIZATION_RATIO, utilization, f"GPU utilization {utilization:.0%}",
                                               unit="ratio", statistic="mean"))
    names = " + ".join(c.cause for c in verdict.causes) or "no single stage"
    verdict.summary = (f"TTFT p99 {_ms(p99)} against a {_ms(ttft_target_ns)} target ({_ms(excess)} over): "
                       f"{names}" + (", not GPU" if engine_ns <= ttft_target_ns else "")
                       + (f"; moving them off the critical path would recover about {_ms(recoverable)}"
                          if recoverable else ""))
    return verdict


def mean_total(tail: Sequence[Any]) -> float:
    """Mean ``total_ns`` of request breakdowns (ns)."""
    return math.fsum(b.total_ns for b in tail) / len(tail)


__all__ = ["ENGINE_STAGES", "MOVABLE", "diagnose_against_target", "mean_total"]
