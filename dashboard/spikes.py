"""TTFT spikes judged against a reference that does not move with the zoom.

A step spikes when its TTFT p99 exceeds a threshold fixed *before* looking at the window:
:data:`SPIKE_FACTOR` × the TTFT p99 of the :data:`REFERENCE_SECONDS` before the window
starts, capped by the TTFT objective (a step over the objective is always a spike). With
too few requests before the window the objective alone is the threshold. So zooming into
a spike, or out of it, never changes whether a step is one: only the step width does.
(``analysis.correlate.detect_spikes`` compares with the median of the steps *inside* the
window, which is what made spikes move and shrink with the zoom.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

SPIKE_FACTOR = 3.0
"""As ``analysis.correlate.SPIKE_FACTOR``: healthy step-to-step p99 noise stays under 2×."""
REFERENCE_SECONDS = 900
"""The reference period: the 15 minutes before the window."""
MIN_REFERENCE_REQUESTS = 20
"""Fewer requests than this before the window give no reference (as the diagnosis' minimum)."""


@dataclass(frozen=True)
class Threshold:
    """The TTFT p99 (seconds) above which a step is a spike, and what it came from."""

    seconds: float
    basis: str


def reference_window(start: datetime) -> tuple[datetime, datetime]:
    """The period whose TTFT p99 is the reference of a window starting at ``start``."""
    return start - timedelta(seconds=REFERENCE_SECONDS), start


def spike_threshold(
    *, objective_seconds: float | None, reference_p99_seconds: float | None, reference_requests: int | None
) -> Threshold | None:
    """The threshold: the smaller of the objective and :data:`SPIKE_FACTOR` × the reference
    p99 (when the reference has :data:`MIN_REFERENCE_REQUESTS`); ``None`` without either."""
    candidates = []
    if reference_p99_seconds and reference_requests and reference_requests >= MIN_REFERENCE_REQUESTS:
        candidates.append(
            Threshold(
                SPIKE_FACTOR * reference_p99_seconds,
                f"{SPIKE_FACTOR:g}× the TTFT p99 of the 15 min before the window "
                f"({reference_p99_seconds * 1000:.0f} ms)",
            )
        )
    if objective_seconds:
        candidates.append(Threshold(objective_seconds, f"the TTFT p99 objective ({objective_seconds * 1000:.0f} ms)"))
    return min(candidates, key=lambda t: t.seconds) if candidates else None


def find_spikes(
    points: Sequence[Mapping[str, Any]],
    *,
    step_seconds: float,
    threshold: Threshold | None,
    time_key: str = "time",
    value_key: str = "ttft_p99_seconds",
) -> list[dict[str, Any]]:
    """Runs of consecutive steps whose ``value_key`` exceeds ``threshold.seconds``, as
    ``{"start", "end", "peak_seconds", "threshold_seconds", "ratio"}`` (``end`` = the last
    spiking step's start + one step; times as given). A step without requests neither
    spikes nor ends a run."""
    if threshold is None:
        return []
    step = timedelta(seconds=step_seconds)
    spikes: list[dict[str, Any]] = []
    for point in points:
        value = point.get(value_key)
        if value is None:
            continue
        at = _instant(point[time_key])
        if value <= threshold.seconds:
            continue
        if spikes and spikes[-1]["_last"] + step >= at:
            spikes[-1].update(end=at + step, _last=at, peak_seconds=max(spikes[-1]["peak_seconds"], value))
        else:
            spikes.append(
                {
                    "start": at,
                    "end": at + step,
                    "_last": at,
                    "peak_seconds": value,
                    "threshold_seconds": threshold.seconds,
                }
            )
    for spike in spikes:
        del spike["_last"]
        spike["ratio"] = spike["peak_seconds"] / threshold.seconds
    return spikes


def _instant(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
