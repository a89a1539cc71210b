"""Smoke runs of the server and storage benchmarks (a few seconds each): they run, lose
nothing, and report sane figures. The measured figures are in bench/README.md."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.e2e
def test_ingest_benchmark_runs_without_loss(tmp_path: Path) -> None:
    result = _load("server_ingest").run(seconds=2.0, clients=2, spans_per_request=200, bodies=40, workdir=str(tmp_path))
    assert result["acked_spans"] > 0 and result["lost_spans"] == 0 and result["stored_twice"] == 0
    assert result["server_spans_per_second"] > 0 and result["raw_insert_spans_per_second"] > 0
    assert result["probes"] >= 1 and result["visible_p99_seconds"] < 30
    assert result["probe_poll_seconds"] == 0.1 and result["probe_reads"] >= result["probes"]
    assert len(result["python_loop_ms"]) == 2 and all(0 < ms < 10_000 for ms in result["python_loop_ms"])


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"probe_poll_seconds": 0.0}, "probe_poll_seconds must be a finite number > 0, got 0.0"),
        ({"probe_poll_seconds": float("inf")}, "probe_poll_seconds must be a finite number > 0, got inf"),
        ({"seconds": float("nan")}, "seconds must be a finite number > 0, got nan"),
        ({"clients": 0}, "clients must be >= 1, got 0"),
        ({"spans_per_request": 15}, "spans_per_request must be a positive multiple of 10, got 15"),
    ],
)
def test_ingest_benchmark_refuses_arguments_out_of_range_naming_them(tmp_path: Path, bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        _load("server_ingest").run(**{"seconds": 1.0, "workdir": str(tmp_path), **bad})
    assert not any(tmp_path.iterdir())  # refused before anything started


@pytest.mark.e2e
def test_read_summary_benchmark_matches_quantile_exact(tmp_path: Path) -> None:
    # 20k requests: near the p99 of a few thousand log-normal values, neighbours lie ~0.5 %
    # apart, which with the sketch's 0.5 % could reach the 1 % bound on its own.
    result = _load("read_summary").run(spans=200_000, repeat=1, workdir=str(tmp_path))
    assert result["stored_spans"] == 200_000
    day, hour = result["windows"]["24h"], result["windows"]["1h"]
    assert day["percentiles"] == "ddsketch" and hour["percentiles"] == "exact"
    assert day["request_count"] == day["exact_count"] == 20_000
    assert hour["request_count"] == hour["exact_count"] > 0
    # The hour holds ~830 requests: there quantileExact (the rank's value) and the summary's
    # interpolated p99 differ by the gap between neighbours, not by any approximation.
    assert day["p99_relative_deviation"] < 0.01
    assert day["api_summary_ms"] > 0 and day["raw_quantile_exact_ms"] > 0


@pytest.mark.e2e
def test_dashboard_queries_benchmark_serves_every_page(tmp_path: Path) -> None:
    result = _load("dashboard_queries").run(spans=50_000, windows_hours=(24.0,), repeat=1, store_dir=str(tmp_path))
    assert result["stored"] == {"spans": 50_000, "requests": 5000}
    pages = result["windows"]["24h"]
    assert set(pages) == {
        "reference",
        "overview",
        "correlate",
        "breakdown",
        "slowest",
        "trace",
        "gpus",
        "diagnosis",
        "alerts",
    }
    assert all(figures["median_ms"] > 0 for figures in pages.values())


@pytest.mark.e2e
def test_soak_benchmark_counts_memory_and_losses(tmp_path: Path) -> None:
    result = _load("server_soak").run(
        seconds=6.0,
        rate=2000.0,
        clients=2,
        spans_per_request=200,
        sample_seconds=1.0,
        warmup_seconds=2.0,
        workdir=str(tmp_path),
    )
    assert result["acked_spans"] > 0 and result["lost"] == 0 and result["stored_twice"] == 0
    assert result["refused"] == {
        "inferpath_server_spans_refused_total": 0.0,
        "inferpath_ingest_refused_busy_total": 0.0,
        "inferpath_ingest_refused_store_unavailable_total": 0.0,
    }
    assert result["dropped"] == {
        "inferpath_server_spans_dropped_total": 0.0,
        "inferpath_writer_rows_dropped_total": 0.0,
    }
    assert len(result["rss_mb"]) >= 4 and result["rss_reference_mb"] > 0
    assert result["rss_growth_of_medians"] == result["rss_growth_of_medians"]  # a number, not NaN


def test_the_server_benchmarks_remove_their_scratch_folder_and_keep_a_given_one(tmp_path: Path) -> None:
    scratch_folder = _load("server_ingest").scratch_folder
    with scratch_folder(None, "inferpath-bench-test-") as made:
        (made / "store").mkdir()
        assert made.is_dir()
    assert not made.exists()
    with scratch_folder(str(tmp_path), "unused-") as given:
        (given / "store").mkdir()
    assert given == tmp_path and (tmp_path / "store").is_dir()


@pytest.mark.e2e
def test_read_trace_benchmark_returns_the_reference_spans(tmp_path: Path) -> None:
    # The benchmark asserts that both sides return the same spans for every lookup.
    result = _load("read_trace").run(spans=20_000, lookups=5, workdir=str(tmp_path))
    assert result["stored_spans"] == 20_000 and result["lookups"] == 5
    for case in ("stored", "unknown"):
        figures = result["cases"][case]
        assert figures["inferpath"]["cpu_ms"] > 0 and figures["reference"]["cpu_ms"] > 0
