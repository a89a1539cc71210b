"""A few-second smoke run of each instrumentation benchmark in bench/ (the figures
themselves are recorded in bench/README.md from full runs)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(autouse=True)
def bench_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))


def test_stage_span_bench_reports_a_ratio(capsys) -> None:
    result = importlib.import_module("bench_stage_span").main(["--spans", "300", "--rounds", "2"])
    assert result["bare_us"] > 0 and result["ours_us"] > 0 and result["ratio"] > 0
    assert "ratio:" in capsys.readouterr().out


def test_gateway_bench_compares_with_the_stock_instrumentor(capsys) -> None:
    pytest.importorskip("opentelemetry.instrumentation.fastapi")
    result = importlib.import_module("bench_gateway").main(["--requests", "100", "--rounds", "1"])
    assert result["bare_us"] > 0 and result["stock_overhead_us"] > 0
    assert "ratio inferpath/stock" in capsys.readouterr().out


def test_streaming_bench_counts_every_token(capsys) -> None:
    result = importlib.import_module("bench_streaming").main(["--tokens", "500", "--rounds", "2"])
    assert result["meter_us_per_token"] > result["reference_us_per_token"]
    assert "us/token" in capsys.readouterr().out


def test_accuracy_bench_measures_both_concurrencies(capsys) -> None:
    report = importlib.import_module("bench_accuracy").main(
        ["--requests", "8", "--tokens", "3", "--ttft-ms", "5", "--itl-ms", "2"]
    )
    assert set(report) == {"1", "64 burst", "64 poisson"}
    assert all(row["requests"] == 8 for row in report.values())
    assert "concurrency 64" in capsys.readouterr().out


def test_receipt_read_bench_measures_both_reads(capsys) -> None:
    from inferpath.instrumentation import receipt

    result = importlib.import_module("bench_receipt_read").main(["--reads", "500", "--rounds", "2"])
    if not receipt._HAS_KERNEL_STAMPS:
        assert result == {}
        return
    assert result["reference_us"] > 0 and result["kernel_us"] > 0 and "raw_read_added_us" in result
    assert "per read" in capsys.readouterr().out


def test_peers_bench_needs_its_own_environment() -> None:
    pytest.importorskip("traceloop.sdk", reason="peers are installed in a separate venv")
    pytest.importorskip("langfuse")
    result = importlib.import_module("bench_peers").main(["--calls", "20", "--rounds", "1"])
    assert "bare" in result
