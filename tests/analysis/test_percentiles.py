"""Exact and bucket-estimated percentiles, checked against numpy and ClickHouse on real data."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest

from inferpath.analysis.percentiles import (
    bucket_increase, histogram_quantile, merge_buckets, otlp_to_cumulative, quantile, quantiles, tail_ratio,
)
from inferpath.storage.store import Store

LIVE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "vllm_live_capture"
QS = (0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)


def _ttft_buckets(path: Path) -> dict[float, float]:
    """Cumulative buckets of ``vllm:time_to_first_token_seconds`` in one recorded scrape."""
    pattern = re.compile(r'^vllm:time_to_first_token_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)$')
    buckets = {}
    for line in path.read_text().splitlines():
        match = pattern.match(line)
        if match:
            buckets[math.inf if match[1] == "+Inf" else float(match[1])] = float(match[2])
    return buckets


def _scrapes() -> list[Path]:
    if not LIVE.is_dir():
        pytest.skip(f"recorded vLLM capture {LIVE} is not present")
    return sorted(LIVE.glob("metrics_*.prom"), key=lambda p: int(p.stem.split("_")[1]))


def _client_ttft_seconds() -> list[float]:
    _scrapes()
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


def test_tail_ratio_is_p99_over_mean() -> None:
    values = _client_ttft_seconds()
    assert tail_ratio(values) == pytest.approx(np.quantile(values, 0.99) / np.mean(values), rel=1e-12)
    assert tail_ratio([2.0, 2.0, 2.0]) == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")]])
def test_quantile_rejects_empty_and_nan(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        quantile(bad, 0.5)


@pytest.mark.parametrize("q", [-0.1, 1.5, True, "0.5"])
def test_quantile_rejects_q_outside_unit_interval(q: object) -> None:
    with pytest.raises(ValueError, match="q must be"):
        quantile([1.0], q)  # type: ignore[arg-type]


def test_histogram_quantile_follows_prometheus_rules() -> None:
    buckets = {0.5: 10.0, 1.0: 11.0, math.inf: 12.0}
    # rank 10.8 falls in (0.5, 1.0] holding 1 value: 0.5 + 0.5 × 0.8.
    assert histogram_quantile(0.9, buckets) == pytest.approx(0.9)
    # rank 5 in the first bucket: interpolated from 0.
    assert histogram_quantile(0.25, {1.0: 10.0, 2.0: 20.0, math.inf: 20.0}) == pytest.approx(0.5)
    # A rank in the +Inf bucket returns the highest finite bound.
    assert histogram_quantile(0.99, buckets) == 1.0
    assert math.isnan(histogram_quantile(0.5, {1.0: 3.0, 2.0: 4.0}))  # no +Inf bucket
    assert math.isnan(histogram_quantile(0.5, {1.0: 0.0, math.inf: 0.0}))  # no observations
    assert histogram_quantile(-0.1, buckets) == -math.inf
    assert histogram_quantile(1.1, buckets) == math.inf
    # Non-monotonic counts (non-atomic scrape) are carried forward, not trusted.
    assert histogram_quantile(0.5, {1.0: 10.0, 2.0: 8.0, math.inf: 20.0}) == pytest.approx(
        histogram_quantile(0.5, {1.0: 10.0, 2.0: 10.0, math.inf: 20.0}))


def test_histogram_quantile_matches_clickhouse_on_recorded_vllm_buckets(store_url: str) -> None:
    buckets = _ttft_buckets(_scrapes()[-1])
    assert buckets[math.inf] == 226.0
    with Store.open(store_url) as store:
        for q in (0.1, 0.5, 0.9, 0.95, 0.99):
            expected = store.query(
                "SELECT quantilePrometheusHistogram({q:Float64})(b, c)"
                " FROM (SELECT arrayJoin(arrayZip({bounds:Array(Float64)}, {counts:Array(Float64)})) AS p,"
                " p.1 AS b, p.2 AS c)",
                {"q": q, "bounds": list(buckets), "counts": list(buckets.values())},
            )[0][0]
            assert histogram_quantile(q, buckets) == pytest.approx(expected, rel=1e-9)


def test_merged_buckets_estimate_the_pooled_quantile_not_an_average() -> None:
    values = _client_ttft_seconds()
    bounds = [b for b in _ttft_buckets(_scrapes()[-1]) if math.isfinite(b)] + [math.inf]
    halves = [values[::2], values[1::2]]  # two replicas serving alternate requests
    per_replica = [{b: float(sum(v <= b for v in half)) for b in bounds} for half in halves]
    merged = merge_buckets(per_replica)
    assert merged == {b: float(sum(v <= b for v in values)) for b in bounds}
    estimate = histogram_quantile(0.99, merged)
    exact = float(np.quantile(values, 0.99))
    # Interpolation stays inside the bucket holding the exact value.
    upper = min(b for b in bounds if b >= exact)
    lower = max([0.0] + [b for b in bounds if b < exact])
    assert lower <= estimate <= upper
    averaged = sum(quantile(h, 0.99) for h in halves) / 2
    assert averaged != pytest.approx(exact, rel=1e-3)


def test_bucket_increase_between_two_recorded_scrapes() -> None:
    scrapes = _scrapes()
    early, late = _ttft_buckets(scrapes[len(scrapes) // 2]), _ttft_buckets(scrapes[-1])
    increase = bucket_increase(early, late)
    assert increase[math.inf] == late[math.inf] - early[math.inf] > 0
    assert all(v >= 0 for v in increase.values())
    # An engine restart resets the counters: the later scrape is the increase.
    assert bucket_increase(late, early) == early


def test_otlp_per_bucket_counts_become_cumulative() -> None:
    assert otlp_to_cumulative([0.1, 1.0], [2, 3, 5]) == {0.1: 2.0, 1.0: 5.0, math.inf: 10.0}
    with pytest.raises(ValueError, match="bucket_counts"):
        otlp_to_cumulative([0.1, 1.0], [2, 3])


def test_merge_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="histogram 1"):
        merge_buckets([{1.0: 1.0}, {1.0: -1.0}])
