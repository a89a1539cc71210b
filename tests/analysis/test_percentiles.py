"""Exact percentiles, checked against numpy on real data."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from inferpath.analysis.percentiles import quantile, quantiles

LIVE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "vllm_live_capture"
QS = (0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)


def _client_ttft_seconds() -> list[float]:
    if not LIVE.is_dir():
        pytest.skip(f"recorded vLLM capture {LIVE} is not present")
    return [r["ttft"] for r in json.loads((LIVE / "client_results.json").read_text()) if r.get("ttft") is not None]


@pytest.mark.parametrize("size", [1, 2, 7, 100, 1001])
def test_exact_quantiles_match_numpy(size: int) -> None:
    rng = random.Random(size)
    values = [rng.lognormvariate(0, 1.5) for _ in range(size)]
    got = quantiles(values, QS)
    for q in QS:
        assert got[q] == pytest.approx(float(np.quantile(values, q)), rel=1e-12)
        assert quantile(values, q) == got[q]


def test_exact_quantiles_of_real_client_ttft_match_numpy() -> None:
    values = _client_ttft_seconds()
    assert len(values) > 200
    for q in QS:
        assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)), rel=1e-12)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")]])
def test_quantile_rejects_empty_and_nan(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        quantile(bad, 0.5)


@pytest.mark.parametrize("q", [-0.1, 1.5, True, "0.5"])
def test_quantile_rejects_q_outside_unit_interval(q: object) -> None:
    with pytest.raises(ValueError, match="q must be"):
        quantile([1.0], q)  # type: ignore[arg-type]
