"""The in-database aggregates equal the Python definitions on the same stored rows (real chDB)."""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta

import pytest
from fault_scenarios import MS, SCENARIOS, T0, WINDOW, Profile, load_scenario, request_rows

from inferpath.analysis.band_query import fetch_breakdown_bands
from inferpath.analysis.breakdown import breakdown_by_band, fetch_request_rows
from inferpath.analysis.correlate import fetch_timeline, fetch_timeline_rows
from inferpath.analysis.signals import fetch_window_signals_rows
from inferpath.analysis.timeline_query import fetch_window_signals
from inferpath.storage.rows import GAUGE_COLUMNS, REQUEST_COLUMNS, SUM_COLUMNS, GaugeRow, RequestRow, SumRow
from inferpath.storage.store import Store
from inferpath.vocabulary import SATURATION_GAUGES


def _odd_requests() -> list[RequestRow]:
    """Rows that exercise the edges: missing measures and stages, ties, errors, a bulk class."""
    rows = request_rows(Profile(queue_tail_ms=300.0), T0, seed=9, per_second=0.5)
    odd = []
    for i, row in enumerate(rows):
        changes: dict = {"trace_id": f"{0xABC:08x}{i:024x}"}
        if i % 7 == 0:
            changes |= {"ttft_ns": None, "itl_ns": None}  # a non-streamed response
        if i % 5 == 0:
            changes |= {"retrieval_ns": None, "network_ns": None}
        if i % 11 == 0:
            changes |= {"e2e_ns": 500 * MS, "ttft_ns": 100 * MS if changes.get("ttft_ns", 1) else None}  # ties
        if i % 13 == 0:
            changes |= {"status": "error"}
        if i % 4 == 1:  # an instrumented caller: its TTFT/E2E are the ones judged and shown
            changes |= {"client_ttft_ns": (row.ttft_ns or 0) + 40 * MS, "client_e2e_ns": (row.e2e_ns or 0) + 60 * MS}
        if i % 3 == 0:
            changes |= {"endpoint_class": "bulk", "endpoint": "/v1/completions"}
        odd.append(RequestRow(**(vars(row) | changes)))
    return odd


def _odd_signals() -> tuple[list[GaugeRow], list[SumRow]]:
    """A second queue series that stops mid-way (stale after the lookback) and a counter
    that restarts from zero, on a 7 s cadence unaligned with any step."""
    gauges, sums = [], []
    counter = 0.0
    for k in range(0, int(2 * WINDOW.total_seconds()), 7):
        ts = T0 + timedelta(seconds=k, milliseconds=300)
        if k < 500:
            gauges.append(
                GaugeRow(
                    resource_attributes={"service.instance.id": "engine-1"},
                    service_name="engine",
                    metric_name="queue_depth",
                    description="",
                    unit="",
                    attributes={"engine": "1"},
                    start_time=None,
                    time=ts,
                    value=float(k % 17),
                )
            )
        gauges.append(
            GaugeRow(
                resource_attributes={"service.instance.id": "engine-1"},
                service_name="engine",
                metric_name="kv_cache_usage_ratio",
                description="",
                unit="",
                attributes={"engine": "1"},
                start_time=None,
                time=ts,
                value=(k % 50) / 50,
            )
        )
        counter = 0.0 if k == 700 else counter + (k % 4)  # the engine restarted at 700 s
        sums.append(
            SumRow(
                resource_attributes={"service.instance.id": "engine-1"},
                service_name="engine",
                metric_name="preemptions_total",
                description="",
                unit="",
                attributes={"engine": "1"},
                start_time=T0,
                time=ts,
                value=counter,
            )
        )
    return gauges, sums


@pytest.fixture(scope="module")
def filled_store(tmp_path_factory: pytest.TempPathFactory):
    url = f"chdb://{tmp_path_factory.mktemp('views') / 'store'}"
    with Store.open(url) as store:
        windows = load_scenario(store, SCENARIOS["kv_cache_pressure"])
        store.insert("inferpath_requests", [r.to_insert_row() for r in _odd_requests()], REQUEST_COLUMNS)
        gauges, sums = _odd_signals()
        store.insert("otel_metrics_gauge", [g.to_insert_row() for g in gauges], GAUGE_COLUMNS)
        store.insert("otel_metrics_sum", [s.to_insert_row() for s in sums], SUM_COLUMNS)
        yield store, windows


def _assert_summaries_equal(got: list, expected: list) -> None:
    assert [s.group for s in got] == [s.group for s in expected]
    for mine, reference in zip(got, expected):
        mine, reference = dataclasses.asdict(mine), dataclasses.asdict(reference)
        for key in ("group", "measure", "count", "total_mean_ns", "stage_mean_ns", "stage_share"):
            assert mine[key] == reference[key], key  # integer sums: exact
        for key in ("lower_ns", "upper_ns"):
            assert mine[key] == pytest.approx(reference[key], rel=1e-12), key
        assert mine["stage_p99_ns"] == pytest.approx(reference["stage_p99_ns"], rel=1e-12)


@pytest.mark.parametrize("endpoint_class", [None, "interactive", "bulk"])
def test_bands_in_sql_equal_breakdown_by_band(filled_store, endpoint_class) -> None:
    store, windows = filled_store
    start, end = windows["baseline_start"], windows["window_end"]
    rows = fetch_request_rows(store, start=start, end=end, endpoint_class=endpoint_class)
    count, bands = fetch_breakdown_bands(store, start=start, end=end, endpoint_class=endpoint_class)
    assert count == len(rows) > 50
    for measure in ("ttft", "e2e"):
        expected = breakdown_by_band(rows, measure=measure)
        assert len(expected) == 4
        _assert_summaries_equal(bands[measure], expected)
    # The tail of the kv-pressure window is queueing: the SQL answer says so too.
    assert bands["ttft"][-1].stage_share["queue"] > bands["ttft"][0].stage_share["queue"]


def test_bands_of_an_empty_window_are_empty(filled_store) -> None:
    store, windows = filled_store
    start = windows["window_end"] + timedelta(hours=1)
    assert fetch_breakdown_bands(store, start=start, end=start + WINDOW) == (0, {"ttft": [], "e2e": []})


@pytest.mark.parametrize("step_seconds, offset_seconds", [(30.0, 0), (7.0, 0), (61.0, 95), (1.5, 500)])
def test_timeline_in_sql_equals_the_python_timeline(filled_store, step_seconds, offset_seconds) -> None:
    store, windows = filled_store
    start = windows["baseline_start"] + timedelta(seconds=offset_seconds)
    end = windows["window_end"] + timedelta(seconds=3 * step_seconds)  # ends with empty steps
    got = fetch_timeline(store, start=start, end=end, step_seconds=step_seconds)
    expected = fetch_timeline_rows(store, start=start, end=end, step_seconds=step_seconds)
    assert got.step_start_ns == expected.step_start_ns
    assert list(got.columns) == list(expected.columns)
    for name, values in expected.columns.items():
        mine = got.columns[name]
        assert [v is None for v in mine] == [v is None for v in values], name
        assert [v for v in mine if v is not None] == pytest.approx(
            [v for v in values if v is not None], rel=1e-12, abs=1e-12
        ), name
    assert any(v is None for v in expected.columns["ttft_p99_seconds"])  # the empty tail steps
    assert max(v or 0 for v in expected.columns["preemptions_per_second"]) > 0
    assert not any(v is not None and math.isnan(v) for v in got.columns["ttft_p99_seconds"])


def test_timeline_of_one_endpoint(filled_store) -> None:
    store, windows = filled_store
    window = {
        "start": windows["baseline_start"],
        "end": windows["window_end"],
        "step_seconds": 20.0,
        "endpoint": "/v1/completions",
    }
    got, expected = fetch_timeline(store, **window), fetch_timeline_rows(store, **window)
    assert got.columns["requests"] == expected.columns["requests"]
    assert (
        0
        < sum(got.columns["requests"])
        < sum(fetch_timeline(store, **(window | {"endpoint": None})).columns["requests"])
    )


@pytest.mark.parametrize("window", [("baseline_start", "baseline_end"), ("window_start", "window_end")])
def test_window_signals_in_sql_equal_the_python_ones(filled_store, window) -> None:
    store, windows = filled_store
    start, end = windows[window[0]], windows[window[1]]
    got = fetch_window_signals(store, start, end)
    expected = fetch_window_signals_rows(store, start, end)
    assert set(got.gauges) == set(expected.gauges) == set(SATURATION_GAUGES)
    for name, stats in expected.gauges.items():
        assert dataclasses.asdict(got.gauges[name]) == pytest.approx(dataclasses.asdict(stats), rel=1e-12), name
    assert got.preemptions == pytest.approx(expected.preemptions, rel=1e-12)
    assert expected.preemptions is not None
    later = windows["window_end"] + 2 * WINDOW
    assert fetch_window_signals(store, later, later + WINDOW).gauges == {}
