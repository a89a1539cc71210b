"""Time-range resolution of the dashboard's picker (pure, no browser)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from inferpath.dashboard.client import format_time
from inferpath.dashboard.timerange import (
    parse_instant,
    resolve_window,
    step_seconds_for,
)

NOW = datetime(2026, 11, 30, 11, 36, 9, 500_000, tzinfo=timezone.utc)


def test_relative_ranges_end_at_now_snapped_and_pick_readable_steps() -> None:
    window = resolve_window("15m", now=NOW)
    assert window.end == datetime(2026, 11, 30, 11, 36, 5, tzinfo=timezone.utc)
    assert window.start == window.end - timedelta(minutes=15)
    assert window.step_seconds == 10
    assert resolve_window("1h", now=NOW).step_seconds == 30
    assert resolve_window("6h", now=NOW).step_seconds == 300
    # Two refreshes within the snap interval ask the same question (cache hit).
    assert resolve_window("1h", now=NOW + timedelta(seconds=0.4)) == resolve_window("1h", now=NOW)


def test_custom_range_takes_naive_as_utc_and_rejects_bad_bounds() -> None:
    window = resolve_window(
        "custom", now=NOW, custom_start=datetime(2026, 11, 30, 11, 10), custom_end=datetime(2026, 11, 30, 11, 20)
    )
    assert window.start.tzinfo is not None and window.duration_seconds == 600
    assert window.step_seconds == 5
    with pytest.raises(ValueError, match="must be after start"):
        resolve_window("custom", now=NOW, custom_start=NOW, custom_end=NOW)
    with pytest.raises(ValueError, match="needs both start and end"):
        resolve_window("custom", now=NOW, custom_start=NOW)
    with pytest.raises(ValueError, match="range must be one of"):
        resolve_window("2d", now=NOW)


def test_parse_instant_accepts_iso_with_offset_z_and_unix_seconds() -> None:
    expected = datetime(2026, 11, 30, 11, 16, 51, tzinfo=timezone.utc)
    assert parse_instant("2026-11-30T12:16:51+01:00", field="start") == expected
    assert parse_instant("2026-11-30T11:16:51Z", field="start") == expected
    assert parse_instant("1796037411", field="start") == expected
    with pytest.raises(ValueError, match="^end: not an ISO-8601"):
        parse_instant("yesterday", field="end")


def test_step_and_time_formatting_edges() -> None:
    assert step_seconds_for(60) == 1
    assert step_seconds_for(10 * 365 * 86400) == 86400
    with pytest.raises(ValueError, match="duration_seconds"):
        step_seconds_for(0)
    assert format_time(NOW) == "2026-11-30T11:36:09.500000+00:00"
    assert format_time(1796037411) == "1796037411.0"
    with pytest.raises(ValueError, match="timezone-aware"):
        format_time(datetime(2026, 11, 30))
