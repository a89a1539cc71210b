"""The percentile cases of the diagnosis issue: quantiles over pooled raw rows, never averaged."""

from __future__ import annotations

from inferpath.analysis.percentiles import quantile

MS = 1_000_000


def test_p99_over_two_replicas_is_pooled_not_averaged() -> None:
    replica_a = [100 * MS] * 1000
    replica_b = [100 * MS] * 950 + [3000 * MS] * 50
    averaged = (quantile(replica_a, 0.99) + quantile(replica_b, 0.99)) / 2
    assert averaged == 1550 * MS  # what averaging per-replica p99s claims
    assert quantile(replica_a + replica_b, 0.99) == 3000 * MS


def test_p99_over_two_windows_weights_by_requests() -> None:
    window_1 = [100 * MS] * 1000
    window_2 = [5000 * MS] * 10
    averaged = (quantile(window_1, 0.99) + quantile(window_2, 0.99)) / 2
    assert averaged == 2550 * MS
    assert quantile(window_1 + window_2, 0.99) == 100 * MS
