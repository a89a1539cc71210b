"""Figure builders and display tables of the dashboard, on small frames (no browser)."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from inferpath.dashboard import figures
from inferpath.dashboard.client import GAUGE_SERIES_COLUMNS, to_frame


def _queue_rows() -> pd.DataFrame:
    return to_frame(
        [
            {"bucket": 1796037410.0, "service_name": "vllm-tiny", "attributes": {"engine": "0"}, "value": 0.0},
            {"bucket": 1796037420.0, "service_name": "vllm-tiny", "attributes": {"engine": "0"}, "value": 52.0},
            # 11:17:00 has no sample: the series must break there, not drop to zero.
            {"bucket": 1796037440.0, "service_name": "vllm-tiny", "attributes": {"engine": "0"}, "value": 3.0},
        ],
        GAUGE_SERIES_COLUMNS,
    )


def _annotations(figure: go.Figure) -> list[str]:
    return [annotation.text for annotation in figure.layout.annotations]


def test_gauge_missing_bucket_is_a_gap_not_zero_and_null_rows_are_no_data() -> None:
    figure = figures.gauge_over_time(_queue_rows(), "UTC", title="Queue", y_title="waiting", step_seconds=10)
    (queue,) = figure.data
    values = list(queue.y)
    assert values[:2] == [0.0, 52.0] and values[3] == 3.0
    assert math.isnan(values[2]) and queue.connectgaps is False
    assert figures.NO_DATA not in _annotations(figure)
    nulls = _queue_rows().assign(value=None)
    empty = figures.gauge_over_time(nulls, "UTC", title="Queue", y_title="waiting")
    assert len(empty.data) == 0 and figures.NO_DATA in _annotations(empty)
    assert empty.layout.yaxis.showticklabels is False


def test_gauge_times_from_any_zone_are_drawn_in_the_zone_the_axis_names() -> None:
    # 09:00 in New York (UTC-5 in November) is 14:00 UTC and 15:00 in Berlin.
    new_york = pd.DataFrame(
        {
            "bucket": pd.to_datetime(["2026-11-30 09:00:00", "2026-11-30 09:00:10"]).tz_localize("America/New_York"),
            "service_name": "vllm",
            "attributes": [{"engine": "0"}] * 2,
            "value": [1.0, 2.0],
        }
    )
    utc = figures.gauge_over_time(new_york, "UTC", title="Queue", y_title="waiting")
    assert utc.layout.xaxis.title.text == "time (UTC)"
    assert pd.Timestamp(utc.data[0].x[0]) == pd.Timestamp("2026-11-30 14:00:00")
    berlin = figures.gauge_over_time(new_york, "Europe/Berlin", title="Queue", y_title="waiting", step_seconds=10)
    assert berlin.layout.xaxis.title.text == "time (Europe/Berlin)"
    assert [pd.Timestamp(x) for x in berlin.data[0].x] == [
        pd.Timestamp("2026-11-30 15:00:00"),
        pd.Timestamp("2026-11-30 15:00:10"),
    ]


def test_requests_table_times_are_wall_times_of_the_chosen_zone() -> None:
    rows = pd.DataFrame(
        {
            "timestamp": pd.to_datetime(["2026-11-30 09:00:00"]).tz_localize("America/New_York"),
            "trace_id": ["ab"],
            "ttft_ns": [1_000_000],
        }
    )
    table = figures.requests_table(rows, "Europe/Berlin")
    assert table.loc[0, "timestamp"] == pd.Timestamp("2026-11-30 15:00:00")


def test_gauge_figure_scales_ratio_to_percent_and_labels_series() -> None:
    kv = to_frame(
        [
            {
                "bucket": "2026-11-30T11:17:00Z",
                "service_name": "vllm-tiny",
                "attributes": {"engine": "0"},
                "value": 0.7,
            },
            {
                "bucket": "2026-11-30T11:17:00Z",
                "service_name": "vllm-tiny",
                "attributes": {"engine": "1"},
                "value": 0.25,
            },
        ],
        GAUGE_SERIES_COLUMNS,
    )
    figure = figures.gauge_over_time(kv, "UTC", title="KV-cache usage", y_title="%", scale=100)
    assert [trace.name for trace in figure.data] == ["vllm-tiny engine=0", "vllm-tiny engine=1"]
    assert [list(trace.y) for trace in figure.data] == [[70.0], [25.0]]
    empty = figures.gauge_over_time(to_frame([], GAUGE_SERIES_COLUMNS), "UTC", title="t", y_title="%")
    assert figures.NO_DATA in _annotations(empty)


def test_stage_table_orders_measures_converts_to_ms_and_keeps_missing_blank() -> None:
    summary = to_frame(
        [
            {
                "measure": "decode",
                "count": 10,
                "avg_seconds": 1.0,
                "p50_seconds": 0.9,
                "p95_seconds": 1.5,
                "p99_seconds": 2.0,
            },
            {
                "measure": "ttft",
                "count": 10,
                "avg_seconds": 0.5,
                "p50_seconds": 0.1575,
                "p95_seconds": 1.2,
                "p99_seconds": 1.82,
            },
            {
                "measure": "retrieval",
                "count": 0,
                "avg_seconds": None,
                "p50_seconds": None,
                "p95_seconds": None,
                "p99_seconds": None,
            },
            {
                "measure": "queue",
                "count": 10,
                "avg_seconds": 0.2,
                "p50_seconds": 0.0,
                "p95_seconds": 0.8,
                "p99_seconds": 1.1,
            },
        ]
    )
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
    rows = to_frame(
        [
            {
                "timestamp": "2026-11-30T11:17:00Z",
                "trace_id": "ab",
                "status": "ok",
                "ttft_ns": 157_000_000,
                "e2e_ns": 900_000_000,
                "queue_ns": None,
                "gateway_ns": None,
                "span_count": 1,
            },
            {
                "timestamp": "2026-11-30T11:17:01Z",
                "trace_id": "cd",
                "status": "ok",
                "ttft_ns": 20_000_000,
                "e2e_ns": 100_000_000,
                "queue_ns": 5_000_000,
                "gateway_ns": None,
                "span_count": 1,
            },
        ]
    )
    table = figures.requests_table(rows, "UTC")
    assert list(table.columns) == ["timestamp", "e2e_ms", "ttft_ms", "queue_ms", "status", "trace_id", "span_count"]
    assert table.loc[0, "ttft_ms"] == 157.0 and table.loc[1, "queue_ms"] == 5.0
    assert math.isnan(table.loc[0, "queue_ms"])


def test_to_frame_makes_time_columns_utc_aware_from_iso_and_unix() -> None:
    from_iso = to_frame([{"bucket": "2026-11-30T12:16:50+01:00", "value": 1}])
    from_unix = to_frame([{"bucket": 1796037410, "value": 1}])
    assert str(from_iso["bucket"].dt.tz) == "UTC"
    assert from_iso.loc[0, "bucket"] == from_unix.loc[0, "bucket"] == pd.Timestamp("2026-11-30T11:16:50Z")
    empty = to_frame([], GAUGE_SERIES_COLUMNS)
    assert list(empty.columns) == GAUGE_SERIES_COLUMNS and str(empty["bucket"].dt.tz) == "UTC"
