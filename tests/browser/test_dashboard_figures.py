"""Figure builders and display tables of the dashboard, on small frames (no browser)."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from inferpath.dashboard import figures
from inferpath.dashboard.client import GAUGE_SERIES_COLUMNS, TTFT_SERIES_COLUMNS, to_frame


def _ttft_rows() -> pd.DataFrame:
    return to_frame([
        {"bucket": "2026-11-30T11:16:50+00:00", "endpoint_class": "interactive", "count": 4,
         "avg_seconds": 0.30, "p50_seconds": 0.15, "p99_seconds": 1.80},
        {"bucket": "2026-11-30T11:17:00+00:00", "endpoint_class": "interactive", "count": 2,
         "avg_seconds": 0.50, "p50_seconds": 0.40, "p99_seconds": 0.90},
        # 11:17:10 has no requests: the series must break there, not drop to zero.
        {"bucket": "2026-11-30T11:17:20+00:00", "endpoint_class": "interactive", "count": 1,
         "avg_seconds": 0.20, "p50_seconds": 0.20, "p99_seconds": 0.20},
        {"bucket": "2026-11-30T11:17:00+00:00", "endpoint_class": "bulk", "count": 3,
         "avg_seconds": 2.0, "p50_seconds": 1.5, "p99_seconds": 4.0},
    ], TTFT_SERIES_COLUMNS)


def _queue_rows() -> pd.DataFrame:
    return to_frame([
        {"bucket": 1796037410.0, "service_name": "vllm-tiny", "attributes": {"engine": "0"},
         "value": 0.0},
        {"bucket": 1796037420.0, "service_name": "vllm-tiny", "attributes": {"engine": "0"},
         "value": 52.0},
    ], GAUGE_SERIES_COLUMNS)


def _annotations(figure: go.Figure) -> list[str]:
    return [annotation.text for annotation in figure.layout.annotations]


def test_ttft_figure_has_p50_p99_avg_per_class_and_queue_on_shared_time_axis() -> None:
    figure = figures.ttft_with_queue_depth(_ttft_rows(), _queue_rows(), step_seconds=10)
    names = [trace.name for trace in figure.data]
    assert names == ["bulk p50", "bulk p99", "bulk avg", "interactive p50", "interactive p99",
                     "interactive avg", "vllm-tiny engine=0"]
    ttft_traces = [trace for trace in figure.data if trace.yaxis == "y"]
    queue_traces = [trace for trace in figure.data if trace.yaxis == "y2"]
    assert len(ttft_traces) == 6 and len(queue_traces) == 1
    # Both panels read one time axis: the queue panel's x axis is bound to the TTFT one.
    assert figure.layout.xaxis.matches == "x2" or figure.layout.xaxis2.matches == "x"
    assert figure.layout.yaxis.title.text == "TTFT (ms)"
    assert list(queue_traces[0].y) == [0.0, 52.0]
    assert figures.NO_DATA not in _annotations(figure)


def test_ttft_values_are_milliseconds_and_missing_bucket_is_a_gap_not_zero() -> None:
    figure = figures.ttft_with_queue_depth(_ttft_rows(), _queue_rows(), step_seconds=10)
    p99 = next(trace for trace in figure.data if trace.name == "interactive p99")
    buckets = [pd.Timestamp(x) for x in p99.x]
    assert buckets == sorted(buckets) and len(buckets) == 4
    values = list(p99.y)
    assert values[0] == 1800.0 and values[1] == 900.0 and values[3] == 200.0
    assert math.isnan(values[2]), "the empty 11:17:10 bucket must be a gap"
    assert p99.connectgaps is False


def test_empty_inputs_are_annotated_no_data_never_drawn_as_zero() -> None:
    empty_ttft = to_frame([], TTFT_SERIES_COLUMNS)
    empty_queue = to_frame([], GAUGE_SERIES_COLUMNS)
    figure = figures.ttft_with_queue_depth(empty_ttft, empty_queue)
    assert len(figure.data) == 0
    assert figure.layout.yaxis.showticklabels is False and figure.layout.yaxis2.showticklabels is False
    no_data = [a for a in figure.layout.annotations if a.text == figures.NO_DATA]
    assert {a.yref for a in no_data} == {"y domain", "y2 domain"}

    only_queue_missing = figures.ttft_with_queue_depth(_ttft_rows(), empty_queue)
    assert only_queue_missing.layout.yaxis.showticklabels is not False
    refs = [a.yref for a in only_queue_missing.layout.annotations if a.text == figures.NO_DATA]
    assert refs == ["y2 domain"]
    assert all(trace.yaxis == "y" for trace in only_queue_missing.data)


def test_missing_endpoint_class_is_labelled_unclassified() -> None:
    rows = _ttft_rows()
    rows.loc[rows["endpoint_class"] == "bulk", "endpoint_class"] = ""
    names = {trace.name for trace in figures.ttft_with_queue_depth(rows, _queue_rows()).data}
    assert {"unclassified p50", "unclassified p99", "unclassified avg"} <= names


def test_rows_with_only_nulls_count_as_no_data() -> None:
    nulls = to_frame([{"bucket": "2026-11-30T11:00:00Z", "endpoint_class": "bulk",
                       "count": 0, "avg_seconds": None, "p50_seconds": None,
                       "p99_seconds": None}], TTFT_SERIES_COLUMNS)
    figure = figures.ttft_with_queue_depth(nulls, _queue_rows())
    assert [a.yref for a in figure.layout.annotations if a.text == figures.NO_DATA] == [
        "y domain"]


def test_gauge_figure_scales_ratio_to_percent_and_labels_series() -> None:
    kv = to_frame([
        {"bucket": "2026-11-30T11:17:00Z", "service_name": "vllm-tiny",
         "attributes": {"engine": "0"}, "value": 0.7},
        {"bucket": "2026-11-30T11:17:00Z", "service_name": "vllm-tiny",
         "attributes": {"engine": "1"}, "value": 0.25},
    ], GAUGE_SERIES_COLUMNS)
    figure = figures.gauge_over_time(kv, title="KV-cache usage", y_title="%", scale=100)
    assert [trace.name for trace in figure.data] == ["vllm-tiny engine=0", "vllm-tiny engine=1"]
    assert [list(trace.y) for trace in figure.data] == [[70.0], [25.0]]
    empty = figures.gauge_over_time(to_frame([], GAUGE_SERIES_COLUMNS), title="t", y_title="%")
    assert figures.NO_DATA in _annotations(empty)


def test_stage_table_orders_measures_converts_to_ms_and_keeps_missing_blank() -> None:
    summary = to_frame([
        {"measure": "decode", "count": 10, "avg_seconds": 1.0, "p50_seconds": 0.9,
         "p95_seconds": 1.5, "p99_seconds": 2.0},
        {"measure": "ttft", "count": 10, "avg_seconds": 0.5, "p50_seconds": 0.1575,
         "p95_seconds": 1.2, "p99_seconds": 1.82},
        {"measure": "retrieval", "count": 0, "avg_seconds": None, "p50_seconds": None,
         "p95_seconds": None, "p99_seconds": None},
        {"measure": "queue", "count": 10, "avg_seconds": 0.2, "p50_seconds": 0.0,
         "p95_seconds": 0.8, "p99_seconds": 1.1},
    ])
    table = figures.stage_latency_table(summary)
    assert list(table.columns) == figures.STAGE_TABLE_COLUMNS
    assert list(table["stage"]) == ["TTFT (server)", "retrieval", "queue", "decode"]
    ttft = table.iloc[0]
    assert ttft["count"] == 10
    assert math.isclose(ttft["p50_ms"], 157.5) and math.isclose(ttft["p99_ms"], 1820.0)
    retrieval = table.iloc[1]
    assert retrieval["count"] == 0 and math.isnan(retrieval["p95_ms"])
    # A real zero (no queueing at p50) stays a zero: only missing is blank.
    assert table.iloc[2]["p50_ms"] == 0.0
    assert figures.stage_latency_table(to_frame([])).empty


def test_requests_table_turns_ns_into_ms_leads_with_durations_and_drops_unreported() -> None:
    rows = to_frame([
        {"timestamp": "2026-11-30T11:17:00Z", "trace_id": "ab", "status": "ok",
         "ttft_ns": 157_000_000, "e2e_ns": 900_000_000, "queue_ns": None, "gateway_ns": None,
         "span_count": 1},
        {"timestamp": "2026-11-30T11:17:01Z", "trace_id": "cd", "status": "ok",
         "ttft_ns": 20_000_000, "e2e_ns": 100_000_000, "queue_ns": 5_000_000,
         "gateway_ns": None, "span_count": 1},
    ])
    table = figures.requests_table(rows)
    assert list(table.columns) == ["timestamp", "e2e_ms", "ttft_ms", "queue_ms", "status",
                                   "trace_id", "span_count"]
    assert table.loc[0, "ttft_ms"] == 157.0 and table.loc[1, "queue_ms"] == 5.0
    assert math.isnan(table.loc[0, "queue_ms"])


def test_to_frame_makes_time_columns_utc_aware_from_iso_and_unix() -> None:
    from_iso = to_frame([{"bucket": "2026-11-30T12:16:50+01:00", "value": 1}])
    from_unix = to_frame([{"bucket": 1796037410, "value": 1}])
    assert str(from_iso["bucket"].dt.tz) == "UTC"
    assert from_iso.loc[0, "bucket"] == from_unix.loc[0, "bucket"] == pd.Timestamp(
        "2026-11-30T11:16:50Z")
    empty = to_frame([], GAUGE_SERIES_COLUMNS)
    assert list(empty.columns) == GAUGE_SERIES_COLUMNS and str(empty["bucket"].dt.tz) == "UTC"
