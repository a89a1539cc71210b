"""Smoke test of ``bench/diagnosis.py``: a few minutes of data instead of an hour."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "diagnosis.py"


def test_diagnosis_bench_runs_and_prints_its_reference(capsys) -> None:
    spec = importlib.util.spec_from_file_location("bench_diagnosis", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    code = module.main(["--rate", "0.5", "--hours", "0.1", "--repeat", "1", "--limit-seconds", "30"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "reference  latency-summary query over 180 rows" in out
    assert "ratio diagnosis / reference" in out and "top cause tokenization" in out
