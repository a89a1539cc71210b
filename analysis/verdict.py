"""The shape of a diagnosis: what degraded, which causes explain it, with the numbers.

Plain dataclasses so the CLI can print them and the read API can serve them;
:func:`verdict_to_dict` gives the JSON-ready form (datetimes as ISO 8601 UTC strings,
non-finite floats as ``null``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, is_dataclass
from datetime import datetime
from typing import Any

from inferpath.vocabulary import CAUSES

Window = tuple[datetime, datetime]

MIN_REQUESTS = 20
"""Requests needed in a window: below 20, the "p99" is just the maximum of a handful."""
TAIL_QUANTILE = 0.9
"""The tail band: requests at or above the window's p90 of the measure."""
MIN_CAUSE_SHARE = 0.10
"""Causes explaining under 10% of the time attributed are within the noise of the attribution."""


class InsufficientDataError(ValueError):
    """A window holds too few requests to judge percentiles. The message says
    ``insufficient data: N requests ..., need M``; ``window`` is ``"current"`` or
    ``"baseline"``, ``count`` and ``needed`` the numbers."""

    def __init__(self, message: str, window: str = "current", count: int = 0, needed: int = MIN_REQUESTS) -> None:
        super().__init__(message)
        self.window, self.count, self.needed = window, count, needed


@dataclass(frozen=True)
class Evidence:
    """One number that supports a cause, with the windows it was measured in.

    ``measure``: what was measured (e.g. ``"tokenize_ns"``, ``"kv_cache_usage_ratio"``);
    ``statistic``: ``p99``, ``mean``, ``p90``, ``max``, ``total`` or ``count``; ``unit``:
    ``ns``, ``seconds``, ``ratio``, ``requests``, ``bytes`` or ``count``; ``baseline`` / ``current``: the
    values in the baseline and current windows (``None`` when not measured there).
    ``text``: the same in words.
    """

    measure: str
    statistic: str
    unit: str
    baseline: float | None
    current: float | None
    baseline_window: Window | None
    current_window: Window | None
    text: str


@dataclass(frozen=True)
class Degradation:
    """A per-request measure (``ttft``, ``itl`` or ``e2e``) compared between windows, at p99
    and at the median.

    ``baseline_p99_ns`` / ``current_p99_ns``: exact p99 in ns (``None`` when the window has
    no values); ``ratio``: current / baseline p99; ``degraded``: the rule's decision;
    ``baseline_p50_ns`` / ``current_p50_ns``: the medians, and ``by``: ``"p99"``, or
    ``"p50"`` when the median rose though the p99 did not (every other request slower).
    """

    measure: str
    baseline_p99_ns: float | None
    current_p99_ns: float | None
    ratio: float | None
    degraded: bool
    baseline_p50_ns: float | None = None
    current_p50_ns: float | None = None
    by: str = "p99"


@dataclass
class Cause:
    """One cause of the latency increase.

    ``cause``: one of :data:`CAUSES`. ``share``: its share (ratio) of the increase of the
    mean ``measure`` of the slowest requests (the tail band, see the diagnosis module);
    ``added_ns``: nanoseconds it added per tail request. A share can exceed 1 when other
    stages got faster at the same time (the shares of all causes, kept or not, sum to 1). ``stages``: the stages whose
    growth was attributed to it. ``would_help`` / ``would_not_help``: actions in words,
    with the numbers that justify them.
    """

    cause: str
    share: float
    added_ns: float
    stages: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    would_help: list[str] = field(default_factory=list)
    would_not_help: list[str] = field(default_factory=list)


@dataclass
class BaselineInfo:
    """The baseline window of a verdict: ``window``, ``requests``, ``meets_objectives``
    (its own objectives held; a baseline that breaks them is never used to call the window
    healthy) and ``objectives`` (its results)."""

    window: Window | None
    requests: int
    meets_objectives: bool
    objectives: list[Any] = field(default_factory=list)


@dataclass
class Verdict:
    """The outcome of a diagnosis.

    ``healthy``: no measure degraded. ``measure``: the measure whose increase the causes
    share (``"e2e"`` or ``"ttft"``; ``None`` when healthy). ``degradations``: TTFT, ITL, E2E
    comparisons. ``causes``: ordered by share, largest first. ``summary``: one line.
    ``current_requests`` / ``baseline_requests``: requests diagnosed in each window.

    ``objectives``: each objective judged per endpoint class (:class:`~inferpath.analysis.
    objectives.ObjectiveResult`); ``tail``: p99 against the mean per class
    (:class:`~inferpath.analysis.objectives.TailResult`); ``baseline``: ``None`` without a
    baseline, else :class:`BaselineInfo`; ``engine``: the engine's state while requests
    waited (:class:`~inferpath.analysis.engine_state.EngineState`, ``None`` when not read);
    ``budget``: where the time over a broken TTFT objective goes
    (:class:`~inferpath.analysis.budget.Budget`); ``notes``: what could not be judged and
    why (missing signals or measures); ``basis``: ``"objectives"`` (causes share the tail's
    time) or ``"baseline"`` (causes share its growth over the baseline); ``failed``: the
    window's requests that did not end ``ok``, by what they ended with (``{}`` when none);
    ``failed_share``: their share (ratio) of all the window's requests; ``source``:
    ``"spans"`` (the request rows) or ``"histograms"`` (the engine's own latency histograms,
    where the spans miss the requests; causes then share the mean request's time).
    """

    healthy: bool
    summary: str
    measure: str | None
    degradations: list[Degradation]
    causes: list[Cause]
    current_window: Window | None
    baseline_window: Window | None
    current_requests: int
    baseline_requests: int
    objectives: list[Any] = field(default_factory=list)
    tail: list[Any] = field(default_factory=list)
    baseline: BaselineInfo | None = None
    engine: Any = None
    budget: Any = None
    notes: list[str] = field(default_factory=list)
    basis: str = "objectives"
    failed: dict[str, int] = field(default_factory=dict)
    failed_share: float = 0.0
    source: str = "spans"

    @property
    def top_cause(self) -> str | None:
        """Name of the largest cause, ``None`` when there is none."""
        return self.causes[0].cause if self.causes else None


def verdict_to_dict(verdict: Verdict) -> dict[str, Any]:
    """JSON-ready dict of ``verdict`` (nested dataclasses as dicts, tuples as lists,
    datetimes as ISO 8601 strings, NaN/inf as ``None``), plus ``top_cause``."""
    out = _plain(verdict)
    out["top_cause"] = verdict.top_cause
    engine = verdict.engine
    if engine is not None and out.get("engine") is not None:
        out["engine"].update(
            bound=engine.bound,
            memory_pressure=engine.memory_pressure,
            waiting_share=engine.waiting_share,
            text=engine.text(),
        )
    if verdict.budget is not None and out.get("budget") is not None:
        out["budget"]["text"] = verdict.budget.text()
    return out


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, frozenset | set):
        return sorted(_plain(v) for v in value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


__all__ = [
    "CAUSES",
    "MIN_CAUSE_SHARE",
    "MIN_REQUESTS",
    "TAIL_QUANTILE",
    "BaselineInfo",
    "InsufficientDataError",
    "Cause",
    "Degradation",
    "Evidence",
    "Verdict",
    "Window",
    "verdict_to_dict",
]
