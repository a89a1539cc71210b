"""The Overview's verdict banner and tiles, zoom-independent spikes, the saturation panels,
and read-API failures as sentences: pure, on bodies shaped as the read API sends them."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pandas as pd
import pytest

from inferpath.dashboard import messages, saturation, spikes
from inferpath.dashboard import verdict as verdict_view
from inferpath.dashboard.app import parse_wall_time
from inferpath.dashboard.client import ReadApiError, detail_text

DEGRADED = {
    "healthy": False,
    "top_cause": "gpu_memory",
    "summary": "degraded: interactive TTFT p99 1899 ms over its 1000 ms objective; top cause: gpu_memory",
    "causes": [
        {
            "cause": "gpu_memory",
            "share": 0.8,
            "added_ns": 9e8,
            "evidence": [],
            "would_help": ["more KV blocks: a larger GPU memory fraction", "shorter prompts"],
            "would_not_help": ["more batch slots"],
        },
        {"cause": "queueing", "share": 0.2, "added_ns": 1e8, "evidence": [], "would_help": ["x"], "would_not_help": []},
    ],
    "objectives": [
        {
            "endpoint_class": "interactive",
            "measure": "ttft",
            "quantile": 0.99,
            "limit_ns": 1e9,
            "value_ns": 1.899e9,
            "requests": 40,
            "met": False,
        },
        {
            "endpoint_class": "interactive",
            "measure": "itl",
            "quantile": 0.99,
            "limit_ns": 1e8,
            "value_ns": 4e7,
            "requests": 40,
            "met": True,
        },
    ],
    "engine": {"slot_limit": 8, "bound": "memory"},
}


def test_the_banner_names_the_verdict_the_top_cause_and_its_first_remedy() -> None:
    banner = verdict_view.banner_of(DEGRADED)
    assert banner.state == "degraded" and banner.cause == "gpu_memory"
    assert banner.headline == (
        "Degraded: the bottleneck is GPU memory (KV cache full) (80 % of the slow requests' time)"
    )
    assert banner.action == "more KV blocks: a larger GPU memory fraction"
    assert banner.detail.startswith("interactive TTFT p99 1899 ms")
    html = verdict_view.banner_html(banner, evidence_href="diagnosis?start=a&end=b")
    assert 'data-verdict="degraded"' in html and 'data-cause="gpu_memory"' in html
    assert 'href="diagnosis?start=a&amp;end=b"' in html
    healthy = verdict_view.banner_of({"healthy": True, "summary": "healthy: every objective met"})
    assert healthy.state == "healthy" and healthy.action is None
    none = verdict_view.banner_of(None, no_verdict="No verdict for this window: 3 requests.")
    assert none.state == "unknown" and "3 requests" in verdict_view.banner_html(none, evidence_href=None)
    unexplained = verdict_view.banner_of({**DEGRADED, "top_cause": "unexplained"})
    assert unexplained.headline == "Degraded: no cause explains the slow requests"
    failing = verdict_view.banner_of(
        {
            "healthy": False,
            "summary": "degraded: 12% of requests failed: 40 error (HTTP 502); the latency of the others meets its objectives",
            "causes": [],
            "top_cause": None,
            "failed": {"error (HTTP 502)": 40},
            "failed_share": 0.12,
        }
    )
    assert failing.headline == "Degraded: 12 % of requests failed" and "HTTP status" in (failing.action or "")
    assert failing.detail.startswith("12% of requests failed: 40 error (HTTP 502)")
    starting = verdict_view.banner_of(
        {
            "healthy": False,
            "summary": "degraded: 40% of requests failed: 50 error (HTTP 500); the latency of the others "
            "meets its objectives; top cause: cold_start (100% of the failed requests)",
            "measure": None,
            "causes": [{"cause": "cold_start", "share": 1.0, "would_help": ["keep warm replicas"]}],
            "top_cause": "cold_start",
            "failed_share": 0.4,
        }
    )
    assert starting.headline == "Degraded: 40 % of requests failed, 100 % of them on a replica still starting"
    assert starting.cause == "cold_start" and starting.action == "keep warm replicas"


def test_tiles_are_coloured_against_the_objectives_and_the_window_before() -> None:
    tiles = verdict_view.objective_tiles(DEGRADED, {("interactive", "ttft"): 130.0, ("interactive", "itl"): 10.0})
    ttft, itl = tiles
    assert (ttft.label, ttft.state, round(ttft.value_ms)) == ("interactive TTFT p99", "broken", 1899)
    assert ttft.note == "over the objective by 899 ms" and ttft.baseline_ms == 130.0
    # ITL meets its objective but is 4× the window before: amber, not green.
    assert (itl.state, itl.note) == ("worse", "4.0× the window before")
    assert verdict_view.objective_tiles(DEGRADED, {})[1].state == "met"
    assert 'data-state="broken"' in verdict_view.tile_html(ttft)
    assert verdict_view.slot_limit(DEGRADED) == 8.0


def test_objective_limits_per_class_and_for_a_chosen_class() -> None:
    objectives = {
        "default_class": "interactive",
        "by_class": {
            "interactive": [{"measure": "ttft", "quantile": 0.99, "limit_seconds": 1.0}],
            "bulk": [{"measure": "ttft", "quantile": 0.99, "limit_seconds": 10.0}],
        },
    }
    assert verdict_view.objective_limits(objectives, None) == {"interactive": 1000.0, "bulk": 10000.0}
    assert verdict_view.objective_limits(objectives, "bulk") == {"bulk": 10000.0}
    # A class without its own objectives takes the default class's.
    assert verdict_view.objective_limits(objectives, "batch") == {"batch": 1000.0}
    assert verdict_view.objective_limits(None, None) == {}


def _steps(values: list[float | None], first_second: int = 0) -> list[dict]:
    return [
        {"time": datetime(2026, 11, 30, 11, 0, first_second + i, tzinfo=timezone.utc), "ttft_p99_seconds": v}
        for i, v in enumerate(values)
    ]


def test_spikes_do_not_move_or_shrink_with_the_zoom() -> None:
    threshold = spikes.spike_threshold(objective_seconds=1.0, reference_p99_seconds=0.1, reference_requests=200)
    assert threshold.seconds == pytest.approx(0.3) and "15 min before" in threshold.basis
    wide = _steps([0.1, 0.12, None, 2.0, 1.5, 0.1, 0.4, 0.1])
    found = spikes.find_spikes(wide, step_seconds=1, threshold=threshold)
    # A step without requests neither spikes nor splits a run; 0.4 s is its own spike.
    assert [(s["start"].second, s["end"].second, s["peak_seconds"]) for s in found] == [(3, 5, 2.0), (6, 7, 0.4)]
    # Zoomed onto the spike: the same steps are spikes, with the same peak (the in-window
    # median of detect_spikes would have had no history here and called nothing).
    zoomed = spikes.find_spikes(wide[3:5], step_seconds=1, threshold=threshold)
    assert [(s["start"].second, s["end"].second, s["peak_seconds"]) for s in zoomed] == [(3, 5, 2.0)]
    # Without a reference before the window, the objective alone is the threshold.
    alone = spikes.spike_threshold(objective_seconds=1.0, reference_p99_seconds=0.1, reference_requests=3)
    assert alone.seconds == 1.0 and "objective" in alone.basis
    assert spikes.spike_threshold(objective_seconds=None, reference_p99_seconds=None, reference_requests=None) is None


def _signals(**bodies) -> dict:
    return {"step_seconds": 1, "signals": bodies}


def _body(
    values: list[tuple[int, float]], *, series: int = 1, combine: str = "sum", last_second: int | None = None
) -> dict:
    points = [{"time": f"2026-11-30T11:00:{s:02d}Z", "max": v, "mean": v / 2} for s, v in values]
    last = last_second if last_second is not None else values[-1][0]
    return {"series": series, "combine": combine, "points": points, "last_time": f"2026-11-30T11:00:{last:02d}Z"}


def _gaps_as_none(values) -> list:
    return [None if isinstance(v, float) and math.isnan(v) else v for v in values]


def test_saturation_panels_show_max_per_step_counts_capacity_missing_and_stale() -> None:
    latency = {
        "step_seconds": 1,
        "points": [
            {"bucket": f"2026-11-30T11:00:{s:02d}Z", "endpoint_class": "interactive", "ttft_p99_seconds": 0.1 * (s + 1)}
            for s in range(5)
        ],
    }
    signals = _signals(
        queue_depth=_body([(0, 0), (1, 4), (3, 9)], series=2),
        kv_cache_usage_ratio=_body([(0, 0.2), (1, 0.9)], combine="max", series=2),
        running_requests=_body([(0, 2), (1, 8)], last_second=3),
    )
    window_end = datetime(2026, 11, 30, 11, 2, 0, tzinfo=timezone.utc)  # 2 min after the last sample
    figure = saturation.overview_figure(
        latency, signals, "UTC", ttft_limits_ms={"interactive": 1000.0}, slot_limit=8, window_end=window_end
    )
    traces = {t.name: t for t in figure.data}
    queue = traces["Queue depth (max per step)"]
    # A step without a sample is a gap (NaN, sent as null), never the last value held.
    assert _gaps_as_none(queue.y) == [0, 4, None, 9]
    assert _gaps_as_none(traces["Queue depth (mean)"].y) == [0, 2, None, 4.5]
    titles = [a.text for a in figure.layout.annotations]
    assert "Queue depth (sum of 2 engines)" in titles
    assert "KV-cache usage (fullest of 2 engines)" in titles
    assert "interactive objective 1,000 ms" in titles and "batch limit 8" in titles
    without_running = saturation.overview_figure(
        latency,
        _signals(queue_depth=signals["signals"]["queue_depth"]),
        "UTC",
        ttft_limits_ms={},
        slot_limit=None,
        window_end=window_end,
    )
    # Not exported is not 0: the panel says so instead of drawing a flat line.
    assert "Running batch: " + saturation.NOT_EXPORTED in [a.text for a in without_running.layout.annotations]
    assert any(t.startswith("stale: no sample since 11:00:03") for t in titles)
    # GPU utilization gets a row only when some GPU reports it.
    assert not any(t.startswith("GPU utilization") for t in titles)


def test_correlate_figure_reads_max_per_step_and_marks_the_spikes() -> None:
    correlate = {
        "step_seconds": 1,
        "points": [
            {
                "time": f"2026-11-30T11:00:{s:02d}Z",
                "ttft_p99_seconds": 2.0 if s == 3 else 0.1,
                "ttft_avg_seconds": 0.05,
                "preemptions_per_second": None,
            }
            for s in range(5)
        ],
    }
    signals = _signals(
        gpu_memory_used_bytes=_body([(0, 2**30), (4, 2**31)], series=4),
        gpu_memory_total_bytes=_body([(0, 2**32)], series=4),
    )
    found = spikes.find_spikes(correlate["points"], step_seconds=1, threshold=spikes.Threshold(1.0, "objective"))
    figure = saturation.correlate_figure(
        correlate, signals, "UTC", spikes=found, window_end=datetime(2026, 11, 30, 11, 0, 5, tzinfo=timezone.utc)
    )
    titles = [a.text for a in figure.layout.annotations]
    assert "GPU memory used (sum of 4 GPUs)" in titles and "total" in titles
    assert "Preemptions: " + saturation.NOT_EXPORTED in titles
    assert sum(saturation.NOT_EXPORTED in t for t in titles) == 5  # queue, running, KV, preemptions, GPU util
    bands = [s for s in figure.layout.shapes if s.fillcolor == saturation.SPIKE_FILL]
    assert len(bands) == 1 and pd.Timestamp(bands[0].x0) == pd.Timestamp("2026-11-30 11:00:03")
    # Every row reads the bottom row's time axis: a zoom moves them all.
    rows = len(saturation.CORRELATE_SIGNALS) + 1
    assert {figure.layout[f"xaxis{i}"].matches for i in range(1, rows)} == {f"x{rows}"}
    assert figure.data[0].y[3] == 2000.0  # seconds shown in ms
    colours = {t.name: t.line.color for t in figure.data}
    assert colours["GPU memory used (max per step)"] == saturation.SIGNAL_COLORS["gpu_memory_used_bytes"]
    assert "12:00" not in saturation.spike_label(found[0], "UTC")


def test_read_api_failures_become_sentences_that_say_what_to_do() -> None:
    assert (
        detail_text(
            [
                {
                    "loc": ["query", "start"],
                    "msg": "insufficient data: 3 requests with an E2E latency in the window, need 20",
                    "type": "value_error",
                }
            ]
        )
        == "insufficient data: 3 requests with an E2E latency in the window, need 20"
    )
    too_few = ReadApiError(
        "GET /api/v1/diagnosis answered HTTP 422: ...",
        url="u",
        status_code=422,
        detail="insufficient data: 3 requests, need 20",
    )
    sentence = messages.explain(too_few, what="the verdict", server_url="http://s")
    assert sentence == (
        "Could not load the verdict: insufficient data: 3 requests, need 20. Widen or move the window in the sidebar."
    )
    down = ReadApiError("inferpath server at http://s is unreachable: ConnectError", url="u")
    assert "`inferpath up`" in messages.explain(down, what="x", server_url="http://s")
    for status, words in ((401, "INFERPATH_TOKEN"), (404, "Upgrade"), (500, "Its log")):
        text = messages.explain(
            ReadApiError("m", url="u", status_code=status, detail="why"), what="x", server_url="http://s"
        )
        assert words in text and "HTTP" not in text and str(status) not in text
    assert (
        messages.no_verdict("insufficient data: 3 requests.")
        == "No verdict for this window: insufficient data: 3 requests. Widen or move the window in the sidebar."
    )


def test_alert_sections_become_flat_tables() -> None:
    from inferpath.dashboard.pages import alerts_table

    rules = alerts_table(
        "rules",
        [
            {
                "rule": "ttft",
                "health": "ok",
                "error": None,
                "duration_seconds": 0.01,
                "samples": [
                    {"labels": {"a": "1"}, "value": 2.0, "active": True, "confidence": "ok", "reason": "over"},
                    {"labels": {}, "value": 0.0, "active": False},
                ],
            }
        ],
        "UTC",
    )
    assert rules.to_dict("records") == [
        {
            "rule": "ttft",
            "health": "ok",
            "error": None,
            "duration_seconds": 0.01,
            "series": 2,
            "active": 1,
            "reason": "over",
        }
    ]
    firing = alerts_table(
        "firing",
        [{"rule": "ttft", "labels": {"class": "interactive"}, "active_at": "2026-11-30T11:00:00+00:00"}],
        "Europe/Berlin",
    )
    assert firing.to_dict("records") == [
        {"rule": "ttft", "labels": "class=interactive", "active_at": "2026-11-30 12:00:00"}
    ]


def test_the_sidebar_takes_times_to_the_second_in_the_chosen_zone() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    assert parse_wall_time("2026-11-30 12:00:07", berlin) == datetime(2026, 11, 30, 11, 0, 7, tzinfo=timezone.utc)
    assert parse_wall_time("2026-11-30T11:00:07Z", berlin) == datetime(2026, 11, 30, 11, 0, 7, tzinfo=timezone.utc)
    with pytest.raises(ValueError, match="write it as YYYY-MM-DD HH:MM:SS"):
        parse_wall_time("yesterday", berlin)
