"""The engine's own latency histograms: quantiles as PromQL reads them, increases over a window,
and the verdict they give where the request spans miss the requests (the shared live capture)."""

from __future__ import annotations

import shutil
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from inferpath.analysis import diagnose
from inferpath.analysis.engine_histograms import LatencyHistogram, _began, _increase, _Point, fetch_window_histograms
from inferpath.analysis.request_window import HistogramWindow
from inferpath.analysis.whatif_calibration import InsufficientSignalsError, fetch_calibration
from inferpath.collectors.recording import choose_offset_ns, import_recording, open_recording
from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread
from inferpath.storage.rows import datetime_from_unix_ns

# vLLM 0.32's TTFT buckets (seconds), as its /metrics lists them.
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


def test_quantiles_are_read_inside_their_bucket_as_promql_reads_them() -> None:
    # 100 observations: 50 in (0, 0.1], 30 in (0.1, 0.5], 10 in (0.5, 1], 10 in (1, 2.5].
    histogram = LatencyHistogram((0.1, 0.5, 1.0, 2.5), (50, 30, 10, 10, 0), 42.0)
    assert histogram.count == 100 and histogram.mean_seconds() == pytest.approx(0.42)
    assert histogram.quantile_seconds(0.5) == pytest.approx(0.1)  # rank 50 ends the first bucket
    assert histogram.quantile_seconds(0.25) == pytest.approx(0.05)  # from 0, linearly
    assert histogram.quantile_seconds(0.95) == pytest.approx(1.0 + 1.5 * 5 / 10)
    assert histogram.quantile_seconds(0.99) == pytest.approx(1.0 + 1.5 * 9 / 10)
    # A rank in +Inf is the highest finite bound: all the buckets say.
    assert LatencyHistogram((0.1, 1.0), (1, 0, 9), 50.0).quantile_seconds(0.99) == 1.0
    assert LatencyHistogram((0.1,), (0, 0), 0.0).quantile_seconds(0.5) is None
    with pytest.raises(ValueError, match="q must be in 0..1"):
        histogram.quantile_seconds(99)


def test_a_windows_increase_starts_at_the_scrape_before_it_and_survives_a_restart() -> None:
    bounds = (0.1, 1.0)
    points = [
        _Point(10, bounds, (5, 0, 0), 0.2),  # before the window: its base
        _Point(20, bounds, (7, 1, 0), 0.9),  # +2 fast, +1 slow
        _Point(30, bounds, (1, 0, 0), 0.05),  # the engine restarted: counted from zero
        _Point(40, bounds, (1, 2, 1), 3.5),
    ]
    increase = _increase(points, start_ns=15)
    assert increase is not None
    got_bounds, counts, total = increase
    assert got_bounds == bounds and counts == [3.0, 3.0, 1.0]
    assert total == pytest.approx(0.7 + 0.05 + 3.45)
    assert _increase(points, start_ns=40) is None  # nothing scraped after the start
    # Without a scrape before the window, what its first scrape holds came before it.
    later = _Point(40, bounds, (8, 2, 1), 3.5)
    assert _increase([points[1], later], start_ns=0) == (bounds, [1.0, 1.0, 1.0], pytest.approx(2.6))


def test_counters_that_begin_in_the_window_are_told_from_counters_that_ran_on() -> None:
    bounds = (0.1, 1.0)
    first, second = _Point(20, bounds, (0, 0, 0), 0.0), _Point(30, bounds, (4, 1, 0), 0.6)
    assert _began([first, second], start_ns=20) == 20  # its first scrape opens the window
    assert _began([first, second], start_ns=25) is None  # it ran on from before
    restarted = [_Point(10, bounds, (90, 9, 1), 30.0), first, second]
    assert _began(restarted, start_ns=15) == 20  # counting less than before: a new process


def _import(folder: Path, server) -> tuple[object, int]:
    recording = open_recording(folder)
    offset = choose_offset_ns(recording, ttl_days=server.runtime.settings.ttl_days, now_ns=time.time_ns())
    with httpx.Client(base_url=server.url, timeout=120.0) as client:
        result = import_recording(recording, client, offset_ns=offset)
    return result, offset


@pytest.fixture
def capture_server(tmp_path: Path, shared_data: Path):
    """A server on a store of its own: the tests import the same capture at the same times."""
    server = serve_in_thread(Settings(store_url=f"chdb://{tmp_path / 'store'}", assembly_settle_seconds=0.2), port=0)
    yield server, tmp_path
    server.stop()


def test_an_engine_scraped_and_not_traced_is_judged_from_its_histograms(capture_server, shared_data) -> None:
    # The live capture's scrapes alone: vLLM's /metrics, no span. Its burst queued 56 requests
    # behind a 64-block KV pool (3 preemptions); its TTFT histogram counted 226 first tokens,
    # the last 58 of them 1-2.5 s late. Before, "no verdict: 0 requests".
    server, root = capture_server
    folder = root / "scrapes_only"
    folder.mkdir()
    for path in (shared_data / "vllm_live_capture").glob("metrics_*.prom"):
        shutil.copy(path, folder)
    result, _ = _import(folder, server)
    counted = fetch_window_histograms(server.runtime.store, result.start, result.end)
    assert round(counted["ttft_ns"].count) == 226 and round(counted["queue_ns"].count) == 220
    assert 1.0 < (counted["ttft_ns"].quantile_seconds(0.99) or 0) <= 2.5

    verdict = diagnose(server.runtime.store, window_start=result.start, window_end=result.end)
    assert verdict.source == "histograms" and verdict.current_requests == 226
    assert verdict.top_cause == "gpu_memory", (verdict.summary, [(c.cause, c.share) for c in verdict.causes])
    assert "of the mean request's time" in verdict.summary
    assert verdict.notes[0].startswith("judged from the engine's own latency histograms")
    assert "0 request spans" in verdict.notes[0]
    ttft = next(r for r in verdict.objectives if r.measure == "ttft" and r.quantile == 0.99)
    assert ttft.met is False and 1e9 < (ttft.value_ns or 0) <= 2.5e9
    evidence = " ".join(e.text for e in verdict.causes[0].evidence)
    assert "of the mean TTFT of the requests the engine counted" in evidence and "preemptions" in evidence

    # A what-if needs each request: it says why it cannot answer, and what to do.
    with pytest.raises(InsufficientSignalsError, match="no request spans: 0 in the window.*226 first tokens"):
        fetch_calibration(server.runtime.store, result.start, result.end)

    # A window before the burst: the engine kept up, and the histograms say so.
    calm = diagnose(server.runtime.store, window_start=result.start, window_end=result.start + timedelta(seconds=40))
    assert calm.healthy and calm.source == "histograms", calm.summary


def test_spans_that_lag_the_incident_leave_the_verdict_to_the_histograms(capture_server, shared_data) -> None:
    # The whole capture, spans and scrapes: vLLM exports a span when its request ends, and the
    # capture stopped with the burst's requests still in the engine. Their spans never came
    # (133 of 226): judged on the spans alone the range `inferpath import` suggests read healthy.
    server, root = capture_server
    folder = root / "whole"
    shutil.copytree(shared_data / "vllm_live_capture", folder)
    result, offset = _import(folder, server)
    verdict = diagnose(server.runtime.store, window_start=result.start, window_end=result.end)
    assert verdict.source == "histograms" and verdict.top_cause == "gpu_memory", verdict.summary
    assert "had not ended when the window closed, were not sampled" in verdict.notes[0]
    # Where the spans hold the requests (the first 40 s of load), the spans judge.
    first = datetime_from_unix_ns(1796037438338696590 + offset)
    early = diagnose(server.runtime.store, window_start=first, window_end=first + timedelta(seconds=55))
    assert early.source == "spans" and early.healthy, early.summary


def test_a_queue_quantile_never_passes_the_ttft_quantile_it_is_part_of() -> None:
    # vLLM's queue-time buckets are coarser than its TTFT buckets (60, 120 s against 40, 80 s):
    # interpolated alone, a queue p99 of 112 s beside a TTFT p99 of 79 s.
    ttft = LatencyHistogram((40.0, 80.0), (10, 90, 0), 6000.0)
    queue = LatencyHistogram((60.0, 120.0), (20, 80, 0), 5000.0)
    window = HistogramWindow({"ttft_ns": ttft, "queue_ns": queue})
    assert queue.quantile_seconds(0.99) == pytest.approx(119.25)
    assert window.quantile("queue_ns", 0.99) == pytest.approx(window.quantile("ttft_ns", 0.99))
    assert window.quantile("queue_ns", 0.1) == pytest.approx(queue.quantile_seconds(0.1) * 1e9)
    assert len(window) == 100 and window.measured("itl_ns") == 0 and window.quantile("itl_ns", 0.5) is None


def test_an_engine_without_an_e2e_histogram_leaves_the_verdict_to_the_spans(capture_server, shared_data) -> None:
    # Triton exports a first-response histogram and no E2E one: the histograms cannot judge a
    # window (every verdict needs 20 E2E latencies), so the spans' verdict stands.
    server, root = capture_server
    folder = root / "no_e2e"
    shutil.copytree(shared_data / "vllm_live_capture", folder)
    for path in folder.glob("metrics_*.prom"):
        kept = [line for line in path.read_text().splitlines() if "e2e_request_latency" not in line]
        path.write_text("\n".join(kept) + "\n")
    result, _ = _import(folder, server)
    verdict = diagnose(server.runtime.store, window_start=result.start, window_end=result.end)
    assert verdict.source == "spans" and verdict.healthy, verdict.summary
