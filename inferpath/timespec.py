"""Durations and points in time as people type them: one parser for every command and file.

- Durations (:func:`parse_duration_seconds`): Prometheus' syntax, ``90s``, ``15m``, ``1h30m``,
  ``250ms``, ``1d``, ``2w``, or a plain number of seconds.
- Points in time (:func:`parse_time`): ISO-8601 with an offset (``2026-12-03T10:00:00Z``),
  ``now``, a time relative to now (``-30m``, ``-1h30m``), or Unix seconds; the absolute
  forms alone (:func:`parse_instant`) for the read API.
- A command's window (:func:`command_window`): its ``--since`` / ``--from`` / ``--to``.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_DURATION_UNITS_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_NUMBER = re.compile(r"^\d+(\.\d+)?$")
_UNIX_SECONDS = re.compile(r"^-?\d+(\.\d+)?$")


def parse_duration_seconds(value: Any) -> float:
    """``"1h30m"``, ``"90s"``, ``"250ms"`` or a number (seconds) → seconds (float, ≥ 0).

    Units as Prometheus durations: ms, s, m, h, d, w; a bare number is seconds. Raises
    ``ValueError`` otherwise.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 30s, 5m or 1h, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0 or value != value:
            raise ValueError(f"a duration must be a non-negative number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration like 30s, 5m or 1h, got {value!r}")
    text = value.strip().lower()
    if _NUMBER.match(text):
        return float(text)
    position, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            break
        total += float(match.group(1)) * _DURATION_UNITS_SECONDS[match.group(2)]
        position = match.end()
    if position != len(text) or not text:
        raise ValueError(f"expected a duration like 30s, 5m or 1h30m, got {value!r}")
    return total


class TimeOutOfRange(ValueError):
    """A well-formed time that no ``datetime`` can hold (year outside 1..9999 once in UTC)."""


_ABSOLUTE_FORMS = "ISO-8601 with an offset (2026-12-03T10:00:00Z) or Unix seconds"
_ALL_FORMS = "ISO-8601 with an offset (2026-12-03T10:00:00Z), now, -30m or Unix seconds"


_FINER_UNITS = ((10**3, "milliseconds"), (10**6, "microseconds"), (10**9, "nanoseconds"))


def _unix_out_of_range(text: str, value: Any) -> TimeOutOfRange:
    """The error for Unix seconds no datetime can hold, saying which finer unit the number
    reads as (a Unix time in nanoseconds, as OTLP and Prometheus write them, is the usual
    mistake) and what it is in seconds."""
    from decimal import Decimal

    number = Decimal(text)
    for per_second, unit in _FINER_UNITS:
        seconds = number / per_second
        if abs(seconds) < 10**10:  # a time before the year 2286 once in seconds
            shown = format(seconds.normalize(), "f")
            return TimeOutOfRange(
                f"{value!r} is out of range: Unix times are seconds, and this looks like {unit} ({shown} s)"
            )
    return TimeOutOfRange(f"{value!r} is out of range: Unix times are seconds")


def _instant(text: str, value: Any, forms: str) -> datetime:
    if _UNIX_SECONDS.match(text):
        try:
            return datetime.fromtimestamp(float(text), tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise _unix_out_of_range(text, value) from None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"expected {forms}; got {value!r}") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ValueError(f"{value!r} has no time zone: add Z or an offset such as +01:00")
    try:
        return parsed.astimezone(timezone.utc)
    except OverflowError:
        raise TimeOutOfRange(f"{value!r} is out of range") from None


def parse_instant(value: str) -> datetime:
    """An absolute point in time → aware UTC datetime: ISO-8601 with an offset (``Z``
    allowed) or Unix seconds (a sign allowed: ``-86400`` is 1969-12-31). What the read API
    takes, where no "now" is shared with the caller.

    Raises :class:`TimeOutOfRange` (a ``ValueError``) for a well-formed time no datetime
    can hold, ``ValueError`` for a naive ISO time or anything else."""
    return _instant(value.strip() if isinstance(value, str) else "", value, _ABSOLUTE_FORMS)


def parse_time(value: str, *, now: datetime | None = None) -> datetime:
    """A point in time → aware UTC datetime (module docstring for the forms).

    ``now`` is the reference of relative times (default: the current time). Raises
    ``ValueError`` for an empty value, a naive ISO time (no offset) or anything else
    (:class:`TimeOutOfRange` for a time no datetime can hold)."""
    text = value.strip() if isinstance(value, str) else ""
    reference = now or datetime.now(timezone.utc)
    if not text:
        raise ValueError(f"expected a time: {_ALL_FORMS}")
    if text.lower() == "now":
        return reference
    if text.startswith("-"):
        try:
            return reference - timedelta(seconds=parse_duration_seconds(text[1:]))
        except OverflowError:
            raise TimeOutOfRange(f"{value!r} is out of range: that is further back than any date") from None
    return _instant(text, value, _ALL_FORMS)


def positive_duration_seconds(text: str, option: str) -> float:
    """``text`` as a duration (seconds, > 0); ``ValueError`` naming ``option`` otherwise."""
    try:
        seconds = parse_duration_seconds(text)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None
    if seconds <= 0:
        raise ValueError(f"{option} must be a positive duration like 15m, 1h30m or 90s; got {text!r}")
    return seconds


def command_window(
    *, since: str | None, from_: str | None, to: str | None, default_since: str, now: datetime
) -> tuple[datetime, datetime]:
    """``(start, end)`` of a command's window: ``--from`` to ``--to`` (default ``now``), or the
    ``--since`` (default ``default_since``) before ``--to``. Raises ``ValueError`` naming the
    option: both ``--since`` and ``--from``, a bad time or duration, a window that starts in
    the future or ends before it starts."""
    if since is not None and from_ is not None:
        raise ValueError("give --since or --from, not both")

    def when(text: str, option: str) -> datetime:
        try:
            return parse_time(text, now=now)
        except ValueError as exc:
            raise ValueError(f"{option}: {exc}") from None

    begin = when(from_, "--from") if from_ else None  # read first: the first bad option is the one named
    end = when(to, "--to") if to else now
    if begin is None:
        begin = end - timedelta(seconds=positive_duration_seconds(since or default_since, "--since"))
    elif begin >= now:
        raise ValueError(f"--from {begin.isoformat()} is in the future: no data can be in the window")
    if end <= begin:
        given = "--to" if to else "--to (default now)"
        raise ValueError(f"{given} must be after --from (from {begin.isoformat()}, to {end.isoformat()})")
    return begin, end


__all__ = [
    "TimeOutOfRange",
    "command_window",
    "parse_duration_seconds",
    "parse_instant",
    "parse_time",
    "positive_duration_seconds",
]
