"""Smoke runs of the server and storage benchmarks (a few seconds each): they run, lose
nothing, and report sane figures. The measured figures are in bench/README.md."""

from __future__ import annotations

import importlib.util
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
    result = _load("server_ingest").run(seconds=2.0, clients=2, spans_per_request=200, bodies=40,
                                        workdir=str(tmp_path))
    assert result["acked_spans"] > 0 and result["lost_spans"] == 0 and result["stored_twice"] == 0
    assert result["server_spans_per_second"] > 0 and result["raw_insert_spans_per_second"] > 0
    assert result["probes"] >= 1 and result["visible_p99_seconds"] < 30


@pytest.mark.e2e
def test_read_summary_benchmark_matches_quantile_exact(tmp_path: Path) -> None:
    result = _load("read_summary").run(rows=5000, repeat=1, workdir=str(tmp_path))
    assert result["request_count"] == 5000
    assert result["p99_relative_deviation"] < 0.01
    assert result["api_summary_ms"] > 0 and result["raw_quantile_exact_ms"] > 0
