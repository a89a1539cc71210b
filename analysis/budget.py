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
- ``network`` → ``network_hop``: co-locating the hop removes it;
- ``cold_start`` (the whole time of requests that met a starting replica) → ``cold_start``:
  routing only to ready replicas removes it.

The engine's own stages (queue, prefill) are what the GPU does. When the engine's part alone
fits in the target, adding GPUs will not bring the endpoint under it; when it does not,
``gpu_compute`` (or ``gpu_memory`` under KV pressure) is named as well.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferpath.analysis.breakdown import request_breakdown
from inferpath.analysis.causes import GPU_HEADROOM_RATIO
from inferpath.analysis.engine_state import engine_state
from inferpath.analysis.percentiles import quantile
from inferpath.analysis.signals import SignalWindows
from inferpath.analysis.verdict import (
    MIN_CAUSE_SHARE,
    MIN_REQUESTS,
    TAIL_QUANTILE,
    Cause,
    Degradation,
    Evidence,
    InsufficientDataError,
    Verdict,
    Window,
)
from inferpath.vocabulary import GPU_UTILIZATION_RATIO

MOVABLE: dict[str, tuple[str, str]] = {
    "tokenize": (
        "tokenization",
        "move tokenization in-process (a Rust tokenizer in the serving process, cached prompt tokens)",
    ),
    "retrieval": ("retrieval", "run retrieval in parallel with the first model pass over the prompt"),
    "network": (
        "network_hop",
        "remove the hop or bring its ends together (a proxy, a load balancer, a distant gateway)",
    ),
    "upstream_queue": (
        "queueing",
        "raise the limit in front of the engine (the caller's connection pool, a concurrency limit, its workers)",
    ),
    "cold_start": ("cold_start", "route to a replica only once it is ready (keep warm replicas)"),
}
"""Stage → (cause, the change that takes it off the critical path). ``cold_start`` is the
whole time of the tail's requests that met a starting replica (``diagnosis.cold_start_rows``);
``upstream_queue`` the part of a hop that waited in a queue before the engine
(``diagnosis.hop_queue``)."""
ENGINE_STAGES = ("queue", "prefill")


@dataclass(frozen=True)
class BudgetItem:
    """One stage that can leave the TTFT critical path: ``stage``, its ``cause``, ``action``
    in words, ``recoverable_ns`` (its mean in the tail band)."""

    stage: str
    cause: str
    action: str
    recoverable_ns: float


@dataclass(frozen=True)
class Budget:
    """Where the time over a TTFT objective goes (the tail band's mean stages).

    ``limit_ns``: the objective; ``p99_ns``: the measured p99; ``over_ns``: the excess;
    ``tail_mean_ns``: mean TTFT of the tail band; ``stage_mean_ns``: stage → mean ns in the
    tail band; ``items``: movable stages with what each recovers (largest first);
    ``recoverable_ns``: their sum; ``engine_ns``: queue + prefill mean; ``engine_fits``:
    the engine's part alone is within the objective (more GPUs cannot be the fix)."""

    limit_ns: float
    p99_ns: float
    over_ns: float
    tail_mean_ns: float
    stage_mean_ns: dict[str, float]
    items: list[BudgetItem] = field(default_factory=list)
    recoverable_ns: float = 0.0
    engine_ns: float = 0.0
    engine_fits: bool = True

    def text(self) -> str:
        """``TTFT p99 900 ms against a 600 ms objective (300 ms over): tokenization in-process
        and retrieval in parallel recover about 300 ms; engine queue + prefill take 560 ms, within it``."""
        head = f"TTFT p99 {_ms(self.p99_ns)} against a {_ms(self.limit_ns)} objective ({_ms(self.over_ns)} over)"
        moves = "; ".join(f"{item.action}: about {_ms(item.recoverable_ns)}" for item in self.items)
        engine = f"engine queue + prefill take {_ms(self.engine_ns)}, " + (
            "within the objective" if self.engine_fits else "over the objective on their own"
        )
        total = f" (about {_ms(self.recoverable_ns)} in all)" if len(self.items) > 1 else ""
        return head + (f": {moves}{total}" if moves else "") + f"; {engine}"


def ttft_budget(
    stage_mean_ns: Mapping[str, float],
    *,
    tail_mean_ns: float,
    p99_ns: float,
    limit_ns: float,
    actions: Mapping[str, str] | None = None,
) -> Budget:
    """The :class:`Budget` of a TTFT p99 over ``limit_ns`` from the tail band's mean stage
    times (ns, stage name → mean; ``rest`` and ``cold_start`` allowed). Stages under :data:`MIN_CAUSE_SHARE`
    of the excess are left out. ``actions``: stage → the change in words where the evidence
    names another than :data:`MOVABLE`'s (a hop whose streams the caller read late). Raises
    ``ValueError`` for a limit ≤ 0."""
    if limit_ns <= 0:
        raise ValueError(f"limit_ns must be > 0, got {limit_ns}")
    over = max(0.0, p99_ns - limit_ns)
    items = []
    for stage, (cause, action) in MOVABLE.items():
        spent = float(stage_mean_ns.get(stage, 0.0))
        if spent > 0 and over > 0 and spent / over >= MIN_CAUSE_SHARE:
            items.append(BudgetItem(stage, cause, (actions or {}).get(stage, action), spent))
    items.sort(key=lambda item: -item.recoverable_ns)
    engine_ns = float(sum(stage_mean_ns.get(s, 0.0) for s in ENGINE_STAGES))
    return Budget(
        limit_ns=float(limit_ns),
        p99_ns=float(p99_ns),
        over_ns=over,
        tail_mean_ns=float(tail_mean_ns),
        stage_mean_ns={k: float(v) for k, v in stage_mean_ns.items()},
        items=items,
        recoverable_ns=math.fsum(i.recoverable_ns for i in items),
        engine_ns=engine_ns,
        engine_fits=engine_ns <= limit_ns,
    )


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.0f} ms"


def diagnose_against_target(
    rows: Sequence[Mapping[str, Any]],
    *,
    ttft_target_ns: int,
    signals: SignalWindows | None = None,
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
        raise InsufficientDataError(
            f"window has {len(breakdowns)} requests with a TTFT; at least {MIN_REQUESTS} are needed"
        )
    signals = signals or SignalWindows()
    p99 = quantile([b.total_ns for b in breakdowns], 0.99)
    degradation = Degradation("ttft", float(ttft_target_ns), p99, p99 / ttft_target_ns, p99 > ttft_target_ns)
    verdict = Verdict(
        healthy=not degradation.degraded,
        summary="",
        measure="ttft",
        degradations=[degradation],
        causes=[],
        current_window=window,
        baseline_window=None,
        current_requests=len(rows),
        baseline_requests=0,
    )
    if verdict.healthy:
        verdict.summary = f"healthy: TTFT p99 {_ms(p99)} within the {_ms(ttft_target_ns)} target"
        return verdict

    edge = quantile([b.total_ns for b in breakdowns], TAIL_QUANTILE)
    tail = [b for b in breakdowns if b.total_ns >= edge]
    mean = {stage: math.fsum(b.stage_ns[stage] for b in tail) / len(tail) for stage in tail[0].stage_ns}
    budget = ttft_budget(mean, tail_mean_ns=mean_total(tail), p99_ns=p99, limit_ns=ttft_target_ns)
    verdict.budget = budget
    utilization = signals.current.stat(GPU_UTILIZATION_RATIO)

    def evidence(measure: str, value: float, text: str, unit: str = "ns", statistic: str = "mean of tail band"):
        return Evidence(measure, statistic, unit, None, value, None, window, text)

    for item in budget.items:
        cause = Cause(
            cause=item.cause,
            share=min(1.0, item.recoverable_ns / budget.over_ns),
            added_ns=item.recoverable_ns,
            stages=[item.stage],
        )
        cause.evidence.append(
            evidence(
                f"{item.stage}_ns",
                item.recoverable_ns,
                f"{item.stage} takes {_ms(item.recoverable_ns)} of the slowest "
                f"{1 - TAIL_QUANTILE:.0%} requests' {_ms(budget.tail_mean_ns)} TTFT, "
                "on the critical path",
            )
        )
        cause.would_help.append(f"{item.action}: recovers about {_ms(item.recoverable_ns)}")
        verdict.causes.append(cause)
    if not budget.engine_fits:
        memory = engine_state(signals.current).memory_pressure
        cause = Cause(
            cause="gpu_memory" if memory else "gpu_compute",
            share=min(1.0, (budget.engine_ns - ttft_target_ns) / budget.over_ns),
            added_ns=budget.engine_ns - ttft_target_ns,
            stages=list(ENGINE_STAGES),
        )
        cause.evidence.append(
            evidence(
                "queue_ns+prefill_ns",
                budget.engine_ns,
                f"engine queue + prefill alone take {_ms(budget.engine_ns)}, over the target",
            )
        )
        cause.would_help.append("add GPUs or replicas, or shorten prompts: the engine alone exceeds the target")
        verdict.causes.append(cause)
    verdict.causes.sort(key=lambda c: -c.added_ns)
    gpu_text = f"GPU utilization {utilization:.0%}; " if utilization is not None else ""
    if budget.engine_fits and verdict.causes:
        not_gpu = (
            f"adding GPUs will not help: {gpu_text}engine queue + prefill take {_ms(budget.engine_ns)}, "
            f"within the {_ms(ttft_target_ns)} target"
        )
        for cause in verdict.causes:
            cause.would_not_help.append(not_gpu)
            if utilization is not None and utilization < GPU_HEADROOM_RATIO:
                cause.evidence.append(
                    evidence(
                        GPU_UTILIZATION_RATIO,
                        utilization,
                        f"GPU utilization {utilization:.0%}",
                        unit="ratio",
                        statistic="mean",
                    )
                )
    names = " + ".join(c.cause for c in verdict.causes) or "no single stage"
    verdict.summary = (
        f"TTFT p99 {_ms(p99)} against a {_ms(ttft_target_ns)} target ({_ms(budget.over_ns)} over): "
        f"{names}"
        + (", not GPU" if budget.engine_fits else "")
        + (
            f"; moving them off the critical path would recover about {_ms(budget.recoverable_ns)}"
            if budget.recoverable_ns
            else ""
        )
    )
    return verdict


def mean_total(tail: Sequence[Any]) -> float:
    """Mean ``total_ns`` of request breakdowns (ns)."""
    return math.fsum(b.total_ns for b in tail) / len(tail)


__all__ = ["ENGINE_STAGES", "MOVABLE", "Budget", "BudgetItem", "diagnose_against_target", "mean_total", "ttft_budget"]
