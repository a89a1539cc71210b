"""Smoke runs of the collectors' benchmarks (a fraction of a second each): they run and report sane figures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_parse_benchmark_runs_and_beats_the_raw_parser(shared_data):
    rows = _load("collectors_parse").run(seconds=0.15, data=shared_data)
    assert {row["source"] for row in rows} == {"vllm", "sglang", "dcgm"}
    # Generous bound for a loaded CI machine; bench/README.md records the measured ratios.
    vllm = rows[0]
    assert vllm["sample_lines"] > 400 and vllm["ratio"] > 0.8


def test_nvml_benchmark_runs():
    result = _load("collectors_nvml").run(gpus=2, call_latency_us=0.0, polls=50)
    assert result["poll_us_per_gpu"] > result["reference_us_per_gpu"] > 0
    assert result["overhead_us_per_gpu"] < 1000  # a smoke bound only; the figure is in bench/README.md
