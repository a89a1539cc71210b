"""Time ranges of the dashboard: the picker's choices, their resolution to instants, the step.

Pure functions of their inputs (``now`` is passed in), so the page logic that depends on the
wall clock is testable. All instants are timezone-aware UTC.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

# Picker choices: query-parameter key -> (label, length). "custom" has no fixed length.
RELATIVE_RANGES: dict[str, tuple[str, timedelta]] = {
    "15m": ("last 15 min", timedelta(minutes=15)),
    "1h": ("last 1 h", timedelta(hours=1)),
    "6h": ("last 6 h", timedelta(hours=6)),
}
CUSTOM = "custom"
RANGE_KEYS = [*RELATIVE_RANGES, CUSTOM]
RANGE_LABELS = {key: label for key, (label, _) in RELATIVE_RANGES.items()} | {CUSTOM: "custom"}

# Bucket widths a person reads easily; the step is the smallest one giving <= target buckets.
_NICE_STEPS_SECONDS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400]


@dataclass(frozen=True)
class TimeWindow:
    """A half-open window ``[start, end)`` in UTC and the bucket width to chart it with."""

    start: datetime
    end: datetime
    step_seconds: int

    @property
    def duration_seconds(self) -> float:
        """Length of the window in seconds."""
        return (self.end - self.start).total_seconds()


def step_seconds_for(duration_seconds: float, *, target_buckets: int = 120) -> int:
    """Bucket width in seconds for a window: the smallest "nice" step giving at most
    ``target_buckets`` buckets (15 min -> 10 s, 1 h -> 30 s, 6 h -> 300 s)."""
    if duration_seconds <= 0:
        raise ValueError(f"duration_seconds must be > 0, got {duration_seconds}")
    for step in _NICE_STEPS_SECONDS:
        if duration_seconds / step <= target_buckets:
            return step
    return _NICE_STEPS_SECONDS[-1]


def resolve_window(
    range_key: str,
    *,
    now: datetime,
    custom_start: datetime | None = None,
    custom_end: datetime | None = None,
    snap_seconds: int = 5,
) -> TimeWindow:
    """Turn a picker choice into a :class:`TimeWindow`.

    Relative ranges end at ``now`` floored to ``snap_seconds`` (so repeated refreshes within
    that interval ask the same question and hit the query cache). ``custom`` needs both
    ``custom_start`` and ``custom_end``; naive datetimes are taken as UTC. Raises
    ``ValueError`` naming the bad field for an unknown key, a missing bound or
    ``end <= start``.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if range_key in RELATIVE_RANGES:
        end = _floor(now.astimezone(timezone.utc), snap_seconds)
        start = end - RELATIVE_RANGES[range_key][1]
    elif range_key == CUSTOM:
        if custom_start is None or custom_end is None:
            raise ValueError("custom range needs both start and end")
        start, end = as_utc(custom_start), as_utc(custom_end)
    else:
        raise ValueError(f"range must be one of {RANGE_KEYS}, got {range_key!r}")
    if end <= start:
        raise ValueError(f"end ({end.isoformat()}) must be after start ({start.isoformat()})")
    return TimeWindow(start, end, step_seconds_for((end - start).total_seconds()))


def parse_instant(text: str, *, field: str) -> datetime:
    """Parse an ISO-8601 instant (naive = UTC) or unix seconds; ``ValueError`` names ``field``."""
    try:
        return datetime.fromtimestamp(float(text), tz=timezone.utc)
    except ValueError:
        pass
    try:
        return as_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError as error:
        raise ValueError(f"{field}: not an ISO-8601 time or unix seconds: {text!r}") from error


def as_utc(value: datetime) -> datetime:
    """``value`` in UTC; a naive datetime is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def _floor(value: datetime, seconds: int) -> datetime:
    if seconds <= 1:
        return value.replace(microsecond=0)
    epoch = int(value.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=timezone.utc)
