"""The one parser of durations and points in time (inferpath/timespec.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from inferpath.timespec import parse_duration_seconds, parse_instant, parse_time

NOW = datetime(2026, 12, 3, 10, 0, tzinfo=timezone.utc)


def test_durations() -> None:
    assert parse_duration_seconds("1h30m") == 5400
    assert parse_duration_seconds("250ms") == 0.25
    assert parse_duration_seconds("2w") == 14 * 86400
    assert parse_duration_seconds(90) == 90
    assert parse_duration_seconds(" 15M ") == 900
    for bad in ("5 minutes", "m5", "-1s", "", "1h 30m", True, None, float("nan")):
        with pytest.raises(ValueError):
            parse_duration_seconds(bad)


def test_points_in_time() -> None:
    assert parse_time("now", now=NOW) == NOW
    assert parse_time("-1h30m", now=NOW) == NOW - timedelta(minutes=90)
    assert parse_time("2026-12-03T11:00:00+01:00", now=NOW) == NOW
    assert parse_time("1796292000", now=NOW) == datetime.fromtimestamp(1796292000, tz=timezone.utc)
    with pytest.raises(ValueError, match="no time zone"):
        parse_time("2026-12-03T10:00:00", now=NOW)
    for bad in ("", "yesterday", "-5 minutes"):
        with pytest.raises(ValueError):
            parse_time(bad, now=NOW)


def test_instants_are_the_absolute_forms_only() -> None:
    assert parse_instant("2026-12-03T10:00:00Z") == NOW
    assert parse_instant("2026-12-03T10:00:00z") == NOW
    assert parse_instant(" 1796292000.5 ") == datetime.fromtimestamp(1796292000.5, tz=timezone.utc)
    assert parse_instant("-86400") == datetime(1969, 12, 31, tzinfo=timezone.utc)
    for relative in ("now", "-30m"):  # relative forms need a reference: parse_time's
        with pytest.raises(ValueError):
            parse_instant(relative)
    with pytest.raises(ValueError, match="no time zone"):
        parse_instant("2026-12-03T10:00:00")
