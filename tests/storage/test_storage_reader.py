"""Reader queries against real chDB: exact percentiles, FINAL semantics, bounds."""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from inferpath.storage.reader import Reader
from inferpath.storage.rows import GAUGE_COLUMNS, REQUEST_COLUMNS, SPAN_COLUMNS, GaugeRow, RequestRow, SpanRow
from inferpath.storage.store import Store
from inferpath.vocabulary import REQUEST_MEASURES

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)


def _insert(store: Store, rows: list[RequestRow]) -> None:
    store.insert("inferpath_requests", [r.to_insert_row() for r in rows], REQUEST_COLUMNS)


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1e9)


@pytest.fixture
def client_results(shared_data: Path) -> list[dict]:
    """What a load client measured against a real vLLM engine (ttft/e2e in seconds)."""
    return json.loads((shared_data / "vllm_live_capture" / "client_results.json").read_text())


def test_latency_percentiles_match_numpy_on_real_client_data(store: Store, client_results: list[dict]) -> None:
    rows = [
        RequestRow(
            T0 + timedelta(milliseconds=100 * i),
            secrets.token_hex(16),
            endpoint="/v1/completions",
            endpoint_class="interactive",
            client_ttft_ns=_ns(r["ttft"]),
            client_e2e_ns=_ns(r["e2e"]),
        )
        for i, r in enumerate(client_results)
    ]
    _insert(store, rows)
    summary = Reader(store).latency_summary(T0, T0 + HOUR)
    assert [s["measure"] for s in summary] == list(REQUEST_MEASURES)
    by_measure = {s["measure"]: s for s in summary}
    for measure, key in (("client_ttft", "ttft"), ("client_e2e", "e2e")):
        values_ns = np.array([_ns(r[key]) for r in client_results if r[key] is not None], dtype=float)
        got = by_measure[measure]
        assert got["count"] == len(values_ns)
        assert got["avg_seconds"] == pytest.approx(values_ns.mean() / 1e9, rel=1e-12)
        for q, name in ((50, "p50_seconds"), (95, "p95_seconds"), (99, "p99_seconds")):
            assert got[name] == pytest.approx(np.percentile(values_ns, q) / 1e9, rel=1e-9), (measure, q)
    assert by_measure["queue"] == {
        "measure": "queue",
        "count": 0,
        "avg_seconds": None,
        "p50_seconds": None,
        "p95_seconds": None,
        "p99_seconds": None,
    }


def test_percentiles_on_known_values(store: Store) -> None:
    values_ms = [5, 1, 4, 2, 3, 100, 7, 9, 11, 13]
    _insert(store, [RequestRow(T0, secrets.token_hex(16), ttft_ns=v * 1_000_000) for v in values_ms])
    ttft = Reader(store).latency_summary(T0, T0 + HOUR)[REQUEST_MEASURES.index("ttft")]
    arr = np.array(values_ms, dtype=float) / 1000
    assert ttft["p50_seconds"] == pytest.approx(np.percentile(arr, 50))  # 6.0 ms
    assert ttft["p95_seconds"] == pytest.approx(np.percentile(arr, 95))
    assert ttft["p50_seconds"] == pytest.approx(0.006)


def test_final_keeps_the_latest_version_of_a_trace_row(store: Store) -> None:
    # Mid-hour: versions of a row share their hourly partition, where FINAL merges them
    # (storage/README.md: a start moved across an hour boundary is the documented exception).
    t = T0 + timedelta(minutes=30)
    trace_id = secrets.token_hex(16)
    first = RequestRow(
        t, trace_id, status="incomplete", e2e_ns=1_000, span_count=2, updated_at=t + timedelta(seconds=1)
    )
    latest = RequestRow(
        t - timedelta(milliseconds=5),
        trace_id,
        status="ok",
        e2e_ns=9_000,
        span_count=5,
        updated_at=t + timedelta(seconds=3),
    )
    older_late = RequestRow(
        t, trace_id, status="error", e2e_ns=5_000, span_count=3, updated_at=t + timedelta(seconds=2)
    )
    for row in (first, latest, older_late):  # separate inserts: separate parts, no merge yet
        _insert(store, [row])
    reader = Reader(store)
    assert store.query("SELECT count() FROM inferpath_requests")[0][0] == 3
    assert reader.request_count(T0 - HOUR, T0 + HOUR) == 1
    (got,) = reader.requests(T0 - HOUR, T0 + HOUR)
    assert (got["status"], got["e2e_ns"], got["span_count"]) == ("ok", 9_000, 5)
    assert got["timestamp"] == t - timedelta(milliseconds=5)
    e2e = reader.latency_summary(T0 - HOUR, T0 + HOUR)[REQUEST_MEASURES.index("e2e")]
    assert (e2e["count"], e2e["p50_seconds"]) == (1, pytest.approx(9e-6))


def test_filters_range_order_and_limit(store: Store) -> None:
    rows = [
        RequestRow(
            T0 + timedelta(seconds=i),
            secrets.token_hex(16),
            endpoint="/chat" if i % 2 else "/embed",
            endpoint_class="interactive" if i % 2 else "bulk",
            e2e_ns=(i + 1) * 1_000_000,
            client_e2e_ns=50_000_000 if i == 4 else None,
        )
        for i in range(10)
    ]
    _insert(store, rows)
    reader = Reader(store)
    start, end = T0, T0 + timedelta(seconds=10)
    assert reader.request_count(start, end) == 10
    assert reader.request_count(start, end, endpoint="/chat") == 5
    assert reader.request_count(start, end, endpoint_class="bulk") == 5
    assert reader.request_count(start, end, endpoint="/chat", endpoint_class="bulk") == 0
    # [start, end): the row at exactly `end` is excluded, the one at `start` included.
    assert reader.request_count(T0 + timedelta(seconds=3), T0 + timedelta(seconds=5)) == 2
    newest = reader.requests(start, end, limit=3)
    assert [r["timestamp"] for r in newest] == [T0 + timedelta(seconds=s) for s in (9, 8, 7)]
    slowest = reader.requests(start, end, order="slowest", limit=2)
    assert [r["e2e_ns"] for r in slowest] == [5_000_000, 10_000_000]  # client e2e 50 ms first
    assert set(newest[0]) == set(REQUEST_COLUMNS)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(start=datetime(2025, 1, 1), end=T0), "start must be timezone-aware"),
        (dict(start=T0, end=T0), "end must be after start"),
        (dict(start=T0, end=T0 + timedelta(days=32)), "at most 31 days"),
        (dict(start=T0, end=T0 + HOUR, limit=0), "limit"),
        (dict(start=T0, end=T0 + HOUR, limit=10_001), "limit"),
        (dict(start=T0, end=T0 + HOUR, order="random"), "order"),
    ],
)
def test_requests_argument_validation(store: Store, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Reader(store).requests(**kwargs)


def test_trace_id_validation(store: Store) -> None:
    with pytest.raises(ValueError, match="trace_id"):
        Reader(store).trace_spans("' OR 1=1 --")
    assert Reader(store).trace_spans("0" * 32) == []


def test_trace_lookup_bounds_cover_fractional_seconds_and_midnight(store: Store) -> None:
    """The lookup's time bounds come from whole seconds (``otel_traces_trace_id_ts``):
    spans in the last nanoseconds of the trace's last second, and a trace crossing midnight
    (two partitions), are all found; a neighbour trace in the same second is not."""
    midnight = datetime(2025, 1, 2, tzinfo=timezone.utc)
    starts = [
        midnight - timedelta(microseconds=1),
        midnight + timedelta(seconds=1, microseconds=999_999),
        midnight - timedelta(seconds=3, microseconds=-1),
    ]
    trace_id, other = secrets.token_hex(16), secrets.token_hex(16)
    spans = [
        SpanRow(start, trace_id, secrets.token_hex(8), span_name=f"s{i}", duration_ns=5)
        for i, start in enumerate(starts)
    ]
    spans.append(SpanRow(starts[1], other, secrets.token_hex(8), span_name="neighbour"))
    store.insert("otel_traces", [s.to_insert_row() for s in spans], SPAN_COLUMNS)
    found = Reader(store).trace_spans(trace_id.upper())
    assert [s.span_name for s in found] == ["s2", "s0", "s1"]
    assert [s.timestamp for s in found] == sorted(starts)
    assert [s.span_name for s in Reader(store).trace_spans(other)] == ["neighbour"]


def test_ttft_timeseries_buckets(store: Store) -> None:
    rows = [
        # bucket 12:00: client-side TTFT wins over gateway TTFT when both exist
        RequestRow(
            T0 + timedelta(seconds=5),
            secrets.token_hex(16),
            endpoint_class="interactive",
            client_ttft_ns=200_000_000,
            ttft_ns=150_000_000,
        ),
        RequestRow(
            T0 + timedelta(seconds=30), secrets.token_hex(16), endpoint_class="interactive", ttft_ns=100_000_000
        ),
        RequestRow(T0 + timedelta(seconds=40), secrets.token_hex(16), endpoint_class="bulk", ttft_ns=1_000_000_000),
        RequestRow(T0 + timedelta(seconds=50), secrets.token_hex(16), endpoint_class="bulk"),  # no TTFT: left out
        # bucket 12:01
        RequestRow(
            T0 + timedelta(seconds=61), secrets.token_hex(16), endpoint_class="interactive", ttft_ns=300_000_000
        ),
    ]
    _insert(store, rows)
    series = Reader(store).ttft_timeseries(T0, T0 + HOUR, step_seconds=60)
    assert [(p["bucket"], p["endpoint_class"], p["count"]) for p in series] == [
        (T0, "bulk", 1),
        (T0, "interactive", 2),
        (T0 + timedelta(minutes=1), "interactive", 1),
    ]
    interactive = series[1]
    assert interactive["avg_seconds"] == pytest.approx(0.15)
    assert interactive["p50_seconds"] == pytest.approx(0.15)
    assert interactive["p99_seconds"] == pytest.approx(np.percentile([0.2, 0.1], 99))
    assert series[0]["bucket"].tzinfo is not None
    only_bulk = Reader(store).ttft_timeseries(T0, T0 + HOUR, step_seconds=60, endpoint_class="bulk")
    assert [p["endpoint_class"] for p in only_bulk] == ["bulk"]
    with pytest.raises(ValueError, match="buckets"):
        Reader(store).ttft_timeseries(T0, T0 + timedelta(days=31), step_seconds=1)
    with pytest.raises(ValueError, match="step_seconds"):
        Reader(store).ttft_timeseries(T0, T0 + HOUR, step_seconds=0)


def test_gauge_timeseries_averages_per_bucket_and_series(store: Store) -> None:
    def point(seconds: int, gpu: str, value: float) -> tuple:
        return GaugeRow(
            {"service.name": "gpu-node"},
            "gpu-node",
            "gpu_utilization_ratio",
            "GPU utilization",
            "1",
            {"gpu": gpu},
            None,
            T0 + timedelta(seconds=seconds),
            value=value,
        ).to_insert_row()

    rows = [point(0, "0", 0.2), point(10, "0", 0.4), point(20, "1", 0.9), point(70, "0", 1.0)]
    other = GaugeRow({}, "gpu-node", "power_watts", "", "W", {"gpu": "0"}, None, T0, value=300.0).to_insert_row()
    store.insert("otel_metrics_gauge", rows + [other], GAUGE_COLUMNS)
    series = Reader(store).gauge_timeseries("gpu_utilization_ratio", T0, T0 + HOUR, step_seconds=60)
    assert [(p["bucket"], p["attributes"], p["value"]) for p in series] == [
        (T0, {"gpu": "0"}, pytest.approx(0.3)),
        (T0, {"gpu": "1"}, pytest.approx(0.9)),
        (T0 + timedelta(minutes=1), {"gpu": "0"}, pytest.approx(1.0)),
    ]
    assert {p["service_name"] for p in series} == {"gpu-node"}
