"""The figure memo: the same input gives the same built figure, any change builds anew."""

from __future__ import annotations

import pandas as pd

from inferpath.dashboard import figures, pages
from inferpath.dashboard.client import GAUGE_SERIES_COLUMNS, to_frame
from inferpath.dashboard.memo import input_digest, memo_figure


def _kv_rows(value: float):
    return to_frame(
        [
            {
                "bucket": "2026-11-30T11:17:00Z",
                "service_name": "vllm-tiny",
                "attributes": {"engine": "0"},
                "value": 0.5,
            },
            {
                "bucket": "2026-11-30T11:17:10Z",
                "service_name": "vllm-tiny",
                "attributes": {"engine": "0"},
                "value": value,
            },
        ],
        GAUGE_SERIES_COLUMNS,
    )


def _figure(rows, tz: str = "UTC"):
    return memo_figure(
        figures.gauge_over_time, rows, tz, title="KV-cache usage", y_title="%", scale=100.0, step_seconds=10
    )


def test_same_input_reuses_the_built_figure() -> None:
    # Two frames fetched apart (the data cache hands out copies) but equal in content.
    first, again = _figure(_kv_rows(0.7)), _figure(_kv_rows(0.7))
    assert first is again
    assert [list(trace.y) for trace in first.data] == [[50.0, 70.0]]
    assert first.layout.xaxis.title.text == "time (UTC)"


def test_new_data_or_zone_builds_a_new_figure() -> None:
    base = _figure(_kv_rows(0.7))
    changed = _figure(_kv_rows(0.8))
    assert changed is not base and [list(t.y) for t in changed.data] == [[50.0, 80.0]]
    berlin = _figure(_kv_rows(0.7), "Europe/Berlin")
    assert berlin is not base and berlin.layout.xaxis.title.text == "time (Europe/Berlin)"
    # 11:17 UTC is 12:17 wall time in Berlin in November.
    assert pd.Timestamp(berlin.data[0].x[0]) == pd.Timestamp("2026-11-30 12:17:00")


def test_digest_names_the_builder_and_every_argument() -> None:
    rows = _kv_rows(0.7)
    digest = input_digest(figures.gauge_over_time, (rows, "UTC"), {"scale": 100.0})
    assert digest == input_digest(figures.gauge_over_time, (rows.copy(), "UTC"), {"scale": 100.0})
    assert digest != input_digest(figures.gauge_over_time, (rows, "UTC"), {"scale": 1.0})
    assert digest != input_digest(pages.fleet_panels, (rows, "UTC"), {"scale": 100.0})
