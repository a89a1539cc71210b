"""The user's choices beyond the time picker, as pure functions (no browser): a box dragged on
a time chart as a window, the filters and which read-API routes take them, the What-if
link and table, and the order of the slowest-requests columns."""

from __future__ import annotations

from datetime import datetime, timezone
from urllib.parse import parse_qs, urlparse

import pandas as pd

from inferpath.dashboard import figures, whatif
from inferpath.dashboard.brush import brushed_window
from inferpath.dashboard.client import to_frame
from inferpath.dashboard.filters import READ_API_FILTERS, Filters, not_applied_note


def _box(x0: str, x1: str) -> dict:
    return {
        "selection": {
            "points": [],
            "point_indices": [],
            "lasso": [],
            "box": [{"xref": "x", "yref": "y", "x": [x0, x1], "y": [0, 1]}],
        }
    }


def test_a_box_on_a_time_chart_is_a_window_of_whole_seconds_in_utc() -> None:
    # Wall times of the chart's zone, in either order, widened to whole seconds.
    start, end = brushed_window(_box("2026-11-30 12:20:09.6", "2026-11-30 12:14:00.2"), "Europe/Berlin")
    assert (start, end) == (
        datetime(2026, 11, 30, 11, 14, tzinfo=timezone.utc),
        datetime(2026, 11, 30, 11, 20, 10, tzinfo=timezone.utc),
    )
    # Across the spring change in Berlin (02:00 CET → 03:00 CEST): an hour of wall time is
    # one minute of real time.
    start, end = brushed_window(_box("2026-03-29 01:59:30", "2026-03-29 03:00:30"), "Europe/Berlin")
    assert (end - start).total_seconds() == 60
    # A click (no span), no box, or a box on an axis that is not time: no window.
    assert brushed_window(_box("2026-11-30 12:14:00", "2026-11-30 12:14:00"), "UTC") is None
    assert brushed_window({"selection": {"box": []}}, "UTC") is None
    assert brushed_window(None, "UTC") is None
    assert brushed_window(_box("queue", "prefill"), "UTC") is None


def test_filters_go_only_to_routes_that_take_them_and_the_rest_is_said() -> None:
    filters = Filters(endpoint_class="bulk", model="llama-2-70b")
    assert filters.as_params() == {"endpoint_class": "bulk", "model": "llama-2-70b"}
    assert filters.for_route("/api/v1/requests") == (("endpoint_class", "bulk"), ("model", "llama-2-70b"))
    assert filters.for_route("/api/v1/alerts") == ()
    note = not_applied_note(filters, ["/api/v1/requests", "/api/v1/alerts", "/api/v1/views/signals"])
    # Both are applied to /requests; the class means nothing for engine state; the alerts
    # route takes neither, the signals view not the model.
    assert note.startswith(
        "Not filtered here by endpoint class = bulk (/alerts); model = llama-2-70b (/alerts, /views/signals)"
    )
    assert "Clear the filter" in note
    assert not_applied_note(Filters(endpoint_class="bulk"), ["/api/v1/requests"]) is None
    assert not_applied_note(Filters(), list(READ_API_FILTERS)) is None


def test_the_whatif_link_exists_only_for_causes_the_engine_model_can_replay() -> None:
    start = datetime(2026, 11, 30, 11, 14, tzinfo=timezone.utc)
    end = datetime(2026, 11, 30, 11, 20, 9, tzinfo=timezone.utc)
    href = whatif.whatif_href(
        {"top_cause": "gpu_memory"}, start=start, end=end, tz="UTC", choices={"endpoint_class": "interactive"}
    )
    query = {k: v[0] for k, v in parse_qs(urlparse(href).query).items()}
    assert urlparse(href).path == "whatif"
    assert query == {
        "start": "2026-11-30T11:14:00Z",
        "end": "2026-11-30T11:20:09Z",
        "tz": "UTC",
        "refresh": "0",
        "endpoint_class": "interactive",
        "cause": "gpu_memory",
        "kv_blocks": "x2",
    }
    assert whatif.change_from_url(query) == ("twice the KV-cache blocks per engine", {"kv_blocks": "x2"}, 0)
    compute = whatif.whatif_href({"top_cause": "gpu_compute"}, start=start, end=end, tz="UTC")
    assert whatif.change_from_url({k: v[0] for k, v in parse_qs(urlparse(compute).query).items()})[1:] == ({}, 1)
    for cause in ("tokenization", "batching", "unexplained", None):
        assert whatif.whatif_href({"top_cause": cause}, start=start, end=end, tz="UTC") is None
    assert whatif.whatif_href(None, start=start, end=end, tz="UTC") is None


def test_the_whatif_table_puts_observed_replayed_and_predicted_side_by_side() -> None:
    answer = {
        "observed": {
            "interactive": {"requests": 40, "ttft_p50_seconds": 0.2, "ttft_p99_seconds": 1.9},
            "all": {"requests": 60, "ttft_p50_seconds": 0.3, "ttft_p99_seconds": 2.5},
        },
        "replayed": {
            "interactive": {"ttft_p50_seconds": 0.21, "ttft_p99_seconds": 1.8},
            "all": {"ttft_p50_seconds": 0.3, "ttft_p99_seconds": 2.4},
        },
        "predicted": {
            "all": {"ttft_p50_seconds": 0.1, "ttft_p99_seconds": 0.4},
            "interactive": {"ttft_p50_seconds": 0.09, "ttft_p99_seconds": None},
        },
        "calibration_errors": {"interactive": {"ttft_p50": 0.05, "ttft_p99": -0.053, "itl_p50": 0.2}},
    }
    table = whatif.ttft_table(answer)
    assert list(table["endpoint class"]) == ["interactive", "all"]
    row = table.iloc[0]
    assert row["requests"] == 40 and row["observed TTFT p99 (ms)"] == 1900.0
    assert row["predicted TTFT p50 (ms)"] == 90.0 and pd.isna(row["predicted TTFT p99 (ms)"])
    assert whatif.ttft_replay_error(answer) == 0.053  # TTFT only; ITL's error is not TTFT's
    assert whatif.ttft_replay_error({}) is None


def test_slowest_requests_lead_with_felt_latency_then_queue_prefill_decode() -> None:
    rows = to_frame(
        [
            {
                "timestamp": "2026-11-30T11:17:00Z",
                "trace_id": "ab",
                "status": "ok",
                "client_e2e_ns": 910_000_000,
                "e2e_ns": 900_000_000,
                "client_ttft_ns": 160_000_000,
                "ttft_ns": 157_000_000,
                "itl_ns": 3_000_000,
                "gateway_ns": 1_000_000,
                "tokenize_ns": 2_000_000,
                "queue_ns": 50_000_000,
                "prefill_ns": 80_000_000,
                "decode_ns": 700_000_000,
            }
        ]
    )
    table = figures.requests_table(rows, "UTC")
    assert list(table.columns)[:9] == [
        "timestamp",
        "client_e2e_ms",
        "client_ttft_ms",
        "queue_ms",
        "prefill_ms",
        "decode_ms",
        "e2e_ms",
        "ttft_ms",
        "itl_ms",
    ]


def test_the_dashboard_knows_which_filters_each_route_of_the_server_takes() -> None:
    # READ_API_FILTERS restates the server's routes; a route that learns (or loses) a filter
    # must be changed in both places, or the dashboard sends what is refused or leaves a page
    # unfiltered without saying so.
    from inferpath.server.read_api import _query_param_names, router

    declared = {
        route.path: _query_param_names(route.dependant) for route in router.routes if hasattr(route, "dependant")
    }
    for path, filters in READ_API_FILTERS.items():
        assert path in declared, path
        taken = declared[path] & {"endpoint_class", "service", "model", "replica"}
        assert filters == taken, (path, sorted(filters), sorted(taken))
