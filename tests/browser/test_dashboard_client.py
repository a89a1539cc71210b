"""The dashboard's read-API client against a real server holding a real vLLM capture."""

from __future__ import annotations

import pandas as pd
import pytest
from capture_server import FedServer, free_port

from inferpath.dashboard.client import (
    GAUGE_SERIES_COLUMNS,
    SUMMARY_COLUMNS,
    TTFT_SERIES_COLUMNS,
    ReadApiClient,
    ReadApiError,
)


def test_summary_has_every_measure_and_matches_the_client_side_ttft(fed_server: FedServer) -> None:
    with ReadApiClient(fed_server.url) as client:
        summary = client.summary(fed_server.start, fed_server.end)
    assert list(summary.columns[: len(SUMMARY_COLUMNS)]) == SUMMARY_COLUMNS
    by_measure = summary.set_index("measure")
    assert {"ttft", "e2e", "queue", "prefill", "decode"} <= set(by_measure.index)
    # One row per llm_request span the engine exported (120 in the capture).
    assert summary.attrs["request_count"] == fed_server.requests_total >= 100
    assert summary.attrs["percentiles"] == "exact"  # a 70 s capture: far below the rollup window
    ttft = by_measure.loc["ttft"]
    assert ttft["count"] == fed_server.requests_total
    assert 0 < ttft["p50_seconds"] <= ttft["p95_seconds"] <= ttft["p99_seconds"] < 60
    # Measures nobody reported stay missing rather than zero.
    assert by_measure.loc["retrieval", "count"] == 0
    assert pd.isna(by_measure.loc["retrieval", "p50_seconds"])


def test_ttft_and_queue_depth_series_are_utc_and_overlap_in_time(fed_server: FedServer) -> None:
    with ReadApiClient(fed_server.url) as client:
        summary = client.summary(fed_server.start, fed_server.end).set_index("measure")
        ttft = client.ttft_timeseries(fed_server.start, fed_server.end, step_seconds=10)
        queue = client.gauge_timeseries("queue_depth", fed_server.start, fed_server.end, step_seconds=10)
    assert set(TTFT_SERIES_COLUMNS) <= set(ttft.columns)
    assert set(GAUGE_SERIES_COLUMNS) <= set(queue.columns)
    assert str(ttft["bucket"].dt.tz) == "UTC" and str(queue["bucket"].dt.tz) == "UTC"
    assert ttft["count"].sum() == fed_server.requests_total
    # The chart and the table must tell the same story: bucket means recombine to the total.
    weighted_mean = (ttft["avg_seconds"] * ttft["count"]).sum() / ttft["count"].sum()
    assert weighted_mean == pytest.approx(summary.loc["ttft", "avg_seconds"], rel=1e-9)
    # The burst near the end of the run (up to 56 waiting in the raw scrapes) shows even in
    # 10-second means; one-second buckets hold one scrape each and give the raw peak back.
    assert queue["value"].max() > 10
    with ReadApiClient(fed_server.url) as client:
        fine = client.gauge_timeseries("queue_depth", fed_server.start, fed_server.end, step_seconds=1)
    assert fine["value"].max() == 56
    assert queue["service_name"].eq("vllm").all()
    assert ttft["bucket"].min() <= queue["bucket"].max() and queue["bucket"].min() <= ttft["bucket"].max()


def test_slowest_requests_come_first(fed_server: FedServer) -> None:
    with ReadApiClient(fed_server.url) as client:
        rows = client.requests(fed_server.start, fed_server.end, limit=20, order="slowest")
    assert len(rows) == 20
    assert str(rows["timestamp"].dt.tz) == "UTC"
    e2e = rows["e2e_ns"].tolist()
    assert e2e == sorted(e2e, reverse=True)


def test_errors_name_the_url_and_the_reason(fed_server: FedServer) -> None:
    with ReadApiClient(fed_server.url) as client:
        with pytest.raises(ReadApiError, match="HTTP 422") as bad_range:
            client.summary(fed_server.end, fed_server.start)
    assert bad_range.value.status_code == 422 and "end must be after start" in str(bad_range.value)
    nowhere = f"http://127.0.0.1:{free_port()}"
    with ReadApiClient(nowhere, timeout_seconds=2.0) as client:
        with pytest.raises(ReadApiError, match="unreachable") as down:
            client.health()
    assert down.value.status_code is None and nowhere in str(down.value)
    with pytest.raises(ValueError, match="server_url"):
        ReadApiClient("127.0.0.1:4318")


def test_signals_view_gives_the_max_per_step_and_who_reported(fed_server: FedServer) -> None:
    with ReadApiClient(fed_server.url) as client:
        coarse = client.view("signals", fed_server.start, fed_server.end, step_seconds=10)
        fine = client.view("signals", fed_server.start, fed_server.end, step_seconds=1)
        objectives = client.objectives()
    queue = coarse["signals"]["queue_depth"]
    assert queue["series"] == 1 and queue["combine"] == "sum" and queue["last_time"]
    # The burst's raw peak (56 waiting in one scrape) survives 10-second steps as their max,
    # where the step mean dilutes it.
    assert max(p["max"] for p in queue["points"]) == 56
    assert max(p["mean"] for p in queue["points"]) < 56
    assert max(p["max"] for p in fine["signals"]["queue_depth"]["points"]) == 56
    assert coarse["signals"]["kv_cache_usage_ratio"]["combine"] == "max"
    # The capture has no GPU exporter: absent, not zero.
    assert "gpu_utilization_ratio" not in coarse["signals"]
    assert objectives["default_class"] == "interactive"
    assert {"measure": "ttft", "quantile": 0.99, "limit_seconds": 1.0} in objectives["by_class"]["interactive"]


def _run_page(app, name: str) -> None:
    """Switch the AppTest ``app`` to the page titled ``name`` and run it."""
    (page_hash,) = [
        h
        for h, page in app._registered_pages.items()  # noqa: SLF001 - pages are functions
        if page.get("page_name") == name
    ]
    app._page_hash = page_hash  # noqa: SLF001
    app.run()


def test_the_pages_send_each_filter_only_to_the_routes_that_take_it(
    fed_server: FedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import timezone
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    calls: list[tuple[str, dict]] = []
    original = ReadApiClient._get

    def recording(client, path, params):  # type: ignore[no-untyped-def]
        calls.append((path, dict(params)))
        return original(client, path, params)

    monkeypatch.setattr(ReadApiClient, "_get", recording)
    monkeypatch.setenv("INFERPATH_SERVER_URL", fed_server.url)
    app = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py"), default_timeout=120)
    app.query_params.update(
        {
            "start": fed_server.start.isoformat(),
            "end": fed_server.end.isoformat(),
            "refresh": "0",
            "tz": "UTC",
            "endpoint_class": "interactive",
            "model": "no-such-model",
        }
    )
    app.run()  # the Overview
    assert not app.exception
    sent = {path: params for path, params in calls}
    assert sent["/api/v1/views/latency"]["endpoint_class"] == "interactive"
    window_start = fed_server.start.astimezone(timezone.utc).isoformat()
    (summary,) = [params for path, params in calls if path == "/api/v1/summary" and params["start"] == window_start]
    assert summary["endpoint_class"] == "interactive"
    # Each filter goes only to the routes that take it (the server would refuse an unknown
    # parameter), and the page says what it did not filter.
    from inferpath.dashboard.filters import READ_API_FILTERS

    assert any(params.get("model") == "no-such-model" for _, params in calls)
    assert all("model" in READ_API_FILTERS.get(path, frozenset()) for path, params in calls if "model" in params)
    assert sent["/api/v1/diagnosis"]["endpoint_class"] == "interactive"
    assert sent["/api/v1/diagnosis"]["model"] == "no-such-model"
    notes = [info.value for info in app.info if "Not filtered here" in info.value]
    assert notes and "model = no-such-model (/views/signals)" in notes[0] and "/diagnosis" not in notes[0]
    # The slowest requests, chosen next, come filtered by class: the choice follows the page.
    calls.clear()
    _run_page(app, "Slowest requests")
    assert not app.exception
    requests = [params for path, params in calls if path == "/api/v1/requests"]
    assert requests and requests[0]["endpoint_class"] == "interactive"


def test_the_diagnosis_page_says_when_the_engines_histograms_judged(
    fed_server: FedServer, tmp_path, shared_data, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM scraped and not traced (the live capture's scrapes alone, a day before the copy the
    # fed server holds: one chDB folder per process): the verdict comes from its TTFT,
    # queue-time and E2E histograms, and the page says so beside the count and the causes.
    import shutil
    from pathlib import Path

    import httpx
    from streamlit.testing.v1 import AppTest

    from inferpath.collectors.recording import import_recording, open_recording

    folder = tmp_path / "scrapes"
    folder.mkdir()
    for path in (shared_data / "vllm_live_capture").glob("metrics_*.prom"):
        shutil.copy(path, folder)
    with httpx.Client(base_url=fed_server.url, timeout=120.0) as client:
        result = import_recording(open_recording(folder), client, offset_ns=-86_400 * 10**9)
    assert result.start is not None and result.end is not None
    monkeypatch.setenv("INFERPATH_SERVER_URL", fed_server.url)
    app = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py"), default_timeout=120)
    app.query_params.update(
        {"start": result.start.isoformat(), "end": result.end.isoformat(), "refresh": "0", "tz": "UTC"}
    )
    app.run()
    _run_page(app, "Diagnosis")
    assert not app.exception
    captions = [c.value for c in app.caption]
    assert "226 requests in the window (counted by the engine's own histograms: see the notes)" in captions
    assert any(c.startswith("note: judged from the engine's own latency histograms") for c in captions)
    headers = [h.value for h in app.subheader]
    assert any(h.startswith("gpu_memory: 100% of the mean request's time (") for h in headers), headers
