"""The dashboard's view routes (``/api/v1/views/...``) on a real server and embedded chDB.

Fed with the recorded vLLM capture (its OTLP trace bodies and its ``/metrics`` scrapes,
parsed by the collectors' catalog), plus one hand-built two-hop trace whose hop overhead
is known exactly.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from inferpath.config import Settings

CAPTURE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "vllm_live_capture"
PROTOBUF = {"Content-Type": "application/x-protobuf"}
HOP_TRACE_ID = "5" * 32
# Recent, so it is inside the store's retention whenever the test runs.
HOP_START = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)


def _capture_time(path: Path) -> datetime:
    # File names carry the wall-clock time in unix nanoseconds.
    return datetime.fromtimestamp(int(path.stem.split("_")[-1]) / 1e9, tz=timezone.utc)


def _metrics_body(samples: list) -> bytes:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    request = ExportMetricsServiceRequest()
    resource_metrics = request.resource_metrics.add()
    resource_metrics.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="vllm")))
    scope = resource_metrics.scope_metrics.add()
    for sample in samples:
        metric = scope.metrics.add()
        metric.name, metric.unit = sample.signal, sample.unit
        if sample.kind == "gauge":
            point = metric.gauge.data_points.add()
        else:
            metric.sum.is_monotonic = True
            metric.sum.aggregation_temporality = 2  # cumulative
            point = metric.sum.data_points.add()
        point.time_unix_nano = int(sample.timestamp.timestamp() * 1e9)
        point.as_double = sample.value
        for key, value in sorted(sample.attributes.items()):
            point.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    return request.SerializeToString()


def _span(service: str, span_id: str, parent: str, kind: int, start: datetime, seconds: float) -> dict:
    start_ns = int(start.timestamp() * 1e9)
    return {
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
        "scopeSpans": [
            {
                "spans": [
                    {
                        "traceId": HOP_TRACE_ID,
                        "spanId": span_id,
                        "parentSpanId": parent,
                        "name": f"{service} call",
                        "kind": kind,
                        "startTimeUnixNano": str(start_ns),
                        "endTimeUnixNano": str(start_ns + int(seconds * 1e9)),
                    }
                ]
            }
        ],
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    if not CAPTURE.is_dir():
        pytest.skip(f"recorded vLLM capture {CAPTURE} is not present")
    from inferpath.collectors.prometheus import scrape_samples
    from inferpath.server.runtime import serve_in_thread

    store = tmp_path_factory.mktemp("views") / "store"
    running = serve_in_thread(Settings(store_url=f"chdb://{store}", assembly_settle_seconds=0.2), port=0)
    try:
        with httpx.Client(base_url=running.url, timeout=60.0) as http:
            traces = sorted((CAPTURE / "otlp").glob("*.pb"))
            for path in traces:
                assert http.post("/v1/traces", content=path.read_bytes(), headers=PROTOBUF).status_code == 200
            scrapes = sorted(CAPTURE.glob("metrics_*.prom"))
            samples = [
                s for path in scrapes for s in scrape_samples(path.read_text(), "vllm", timestamp=_capture_time(path))
            ]
            assert http.post("/v1/metrics", content=_metrics_body(samples), headers=PROTOBUF).status_code == 200
            # A client call of 1.5 s whose server side took 1.2 s: 300 ms of hop overhead.
            hop = {
                "resourceSpans": [
                    _span("caller", "a" * 16, "", 3, HOP_START, 1.5),
                    _span("callee", "b" * 16, "a" * 16, 2, HOP_START + timedelta(milliseconds=100), 1.2),
                ]
            }
            assert http.post("/v1/traces", json=hop).status_code == 200
            assert http.post("/api/v1/flush", timeout=120).json()["ok"]
        start = min(_capture_time(scrapes[0]), _capture_time(traces[0])) - timedelta(minutes=1)
        end = max(_capture_time(scrapes[-1]), _capture_time(traces[-1])) + timedelta(minutes=1)
        yield running.url, start, end
    finally:
        running.stop()


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def test_latency_view_per_class_matches_the_summary_and_respects_max_points(server) -> None:
    url, start, end = server
    with httpx.Client(base_url=url, timeout=60.0) as http:
        window = {"start": _iso(start), "end": _iso(end)}
        body = http.get("/api/v1/views/latency", params={**window, "max_points": 10}).json()
        summary = http.get("/api/v1/summary", params=window).json()
        fine = http.get("/api/v1/views/latency", params={**window, "step_seconds": 1, "max_points": 10_000}).json()
    duration = (end - start).total_seconds()
    # Downsampled on the server: the step widened so at most 10 buckets cover the window.
    assert body["step_seconds"] == -(-int(duration) // 10)
    assert len({p["bucket"] for p in body["points"]}) <= 10
    assert sum(p["requests"] for p in body["points"]) == summary["request_count"] >= 100
    assert all(p["errors"] == 0 for p in body["points"])
    assert fine["step_seconds"] == 1 and len(fine["points"]) > len(body["points"])
    for point in body["points"]:
        assert point["ttft_p50_seconds"] <= point["ttft_p95_seconds"] <= point["ttft_p99_seconds"]
        assert point["e2e_p99_seconds"] >= point["ttft_p99_seconds"] > 0
    # Bucket means recombine into the window's mean TTFT.
    weighted = sum(p["ttft_avg_seconds"] * p["requests"] for p in body["points"])
    ttft = next(m for m in summary["measures"] if m["measure"] == "ttft")
    assert weighted / summary["request_count"] == pytest.approx(ttft["avg_seconds"], rel=1e-9)


def test_correlate_view_puts_the_queue_burst_on_the_ttft_axis_and_marks_spikes(server) -> None:
    url, start, end = server
    with httpx.Client(base_url=url, timeout=60.0) as http:
        body = http.get(
            "/api/v1/views/correlate", params={"start": _iso(start), "end": _iso(end), "step_seconds": 2}
        ).json()
        coarse = http.get(
            "/api/v1/views/correlate", params={"start": _iso(start), "end": _iso(end), "max_points": 5}
        ).json()
    points = body["points"]
    assert body["step_seconds"] == 2 and len(points) == -(-int((end - start).total_seconds()) // 2)
    assert len(coarse["points"]) <= 5
    assert {
        "ttft_p99_seconds",
        "ttft_avg_seconds",
        "queue_depth",
        "running_requests",
        "kv_cache_usage_ratio",
        "preemptions_per_second",
        "gpu_utilization_ratio",
        "gpu_memory_used_bytes",
    } <= set(body["columns"])
    # The capture's burst: up to 56 waiting (as of step ends, 2-s steps may miss the peak).
    assert max(p["queue_depth"] or 0 for p in points) > 40
    # vLLM on a CPU exports no GPU signals: missing (null), never zero.
    assert all(p["gpu_utilization_ratio"] is None for p in points)
    # Before the first scrape nothing is known either.
    assert points[0]["queue_depth"] is None and points[0]["requests"] == 0
    for spike in body["spikes"]:
        assert spike["ratio"] > body["spike_factor"]
        assert spike["start"] < spike["end"]


def test_breakdown_view_has_bands_for_ttft_and_e2e_and_the_exact_hop_overhead(server) -> None:
    url, start, end = server
    with httpx.Client(base_url=url, timeout=60.0) as http:
        body = http.get("/api/v1/views/breakdown", params={"start": _iso(start), "end": _iso(end)}).json()
        hop = http.get(
            "/api/v1/views/breakdown",
            params={"start": _iso(HOP_START - timedelta(seconds=1)), "end": _iso(HOP_START + timedelta(seconds=5))},
        ).json()
    assert body["request_count"] >= 100
    for measure in ("ttft", "e2e"):
        bands = body["bands"][measure]
        assert [b["group"] for b in bands] == ["p0-50", "p50-90", "p90-99", "p99+"]
        assert sum(b["count"] for b in bands) == body["request_count"]
        for band in bands:
            assert sum(band["stage_share"].values()) == pytest.approx(1.0)
    assert "decode" not in body["bands"]["ttft"][0]["stage_share"]
    assert body["hops"] == []  # vLLM alone: no caller/callee pairs
    assert hop["hops"] == [
        {
            "caller_service": "caller",
            "callee_service": "callee",
            "callee_span": "callee call",
            "count": 1,
            "avg_seconds": pytest.approx(0.3),
            "p50_seconds": pytest.approx(0.3),
            "p95_seconds": pytest.approx(0.3),
            "p99_seconds": pytest.approx(0.3),
        }
    ]


def test_fleet_view_lists_series_and_the_catalog_that_explains_missing_signals(server) -> None:
    url, start, end = server
    with httpx.Client(base_url=url, timeout=60.0) as http:
        body = http.get("/api/v1/views/fleet", params={"start": _iso(start), "end": _iso(end)}).json()
        empty = http.get(
            "/api/v1/views/fleet", params={"start": "2001-01-01T00:00:00Z", "end": "2001-01-01T01:00:00Z"}
        ).json()
    by_signal = {row["signal"]: row for row in body["series"]}
    assert {"queue_depth", "running_requests", "kv_cache_usage_ratio", "preemptions_total"} <= set(by_signal)
    queue = by_signal["queue_depth"]
    assert queue["max_value"] == 56 and queue["min_value"] == 0 and queue["samples"] > 10
    assert queue["attributes"].get("engine") == "0"
    assert by_signal["preemptions_total"]["kind"] == "sum" and "increase" in by_signal["preemptions_total"]
    assert "gpu_utilization_ratio" not in by_signal
    assert "batch_size" not in body["sources"]["vllm"]  # vLLM does not export one
    assert body["sources"]["dcgm"]["gpu_utilization_ratio"] == ["DCGM_FI_DEV_GPU_UTIL"]
    assert body["signals"]["kv_cache_usage_ratio"]["unit"] == "1"
    assert empty["series"] == []


def test_view_parameters_are_validated_with_the_field_named(server) -> None:
    url, start, end = server
    with httpx.Client(base_url=url, timeout=30.0) as http:
        too_many = http.get("/api/v1/views/correlate", params={"max_points": 10_001})
        reversed_window = http.get("/api/v1/views/latency", params={"start": _iso(end), "end": _iso(start)})
        future = http.get("/api/v1/diagnosis", params={"start": "2099-01-01T00:00:00Z"})
    assert too_many.status_code == 422 and too_many.json()["detail"][0]["loc"] == ["query", "max_points"]
    assert reversed_window.status_code == 422
    assert reversed_window.json()["detail"][0]["loc"] == ["query", "end"]
    # a start after now with no end is named as the CLI names it (not "end must be after start")
    assert future.status_code == 422 and future.json()["detail"][0]["loc"] == ["query", "start"]
    assert "is in the future: no data can be in the window" in future.json()["detail"][0]["msg"]


def test_an_unknown_query_parameter_is_refused_with_its_name(server) -> None:
    url, start, end = server
    window = {"start": _iso(start), "end": _iso(end)}
    with httpx.Client(base_url=url, timeout=30.0) as http:
        # A misspelt filter would otherwise answer for every endpoint class, as if filtered.
        misspelt = http.get("/api/v1/views/breakdown", params={**window, "endpoint-class": "interactive"})
        spelt = http.get("/api/v1/views/breakdown", params={**window, "endpoint_class": "interactive"})
        two = http.get("/api/v1/summary", params={**window, "zz": "1", "aa": "2"})
        trace = http.get(f"/api/v1/traces/{HOP_TRACE_ID}", params={"start": _iso(start)})
    assert misspelt.status_code == 422
    (problem,) = misspelt.json()["detail"]
    assert problem["loc"] == ["query", "endpoint-class"]
    assert "endpoint_class" in problem["msg"] and "unknown query parameter" in problem["msg"]
    assert spelt.status_code == 200
    assert [d["loc"] for d in two.json()["detail"]] == [["query", "aa"], ["query", "zz"]]
    assert trace.status_code == 422 and "takes none" in trace.json()["detail"][0]["msg"]


def test_a_single_valued_parameter_given_twice_is_refused_not_overwritten(server) -> None:
    url, start, end = server
    window = [("start", _iso(start)), ("end", _iso(end))]
    with httpx.Client(base_url=url, timeout=30.0) as http:
        # Otherwise the last value wins: a filter for two classes would answer for one.
        twice = http.get(
            "/api/v1/views/breakdown", params=window + [("endpoint_class", "interactive"), ("endpoint_class", "batch")]
        )
        once = http.get("/api/v1/views/breakdown", params=window + [("endpoint_class", "interactive")])
        start_twice = http.get("/api/v1/summary", params=window + [("start", _iso(start))])
    assert twice.status_code == 422
    (problem,) = twice.json()["detail"]
    assert problem["loc"] == ["query", "endpoint_class"] and "given 2 times" in problem["msg"]
    assert once.status_code == 200
    assert start_twice.status_code == 422 and start_twice.json()["detail"][0]["loc"] == ["query", "start"]


@pytest.mark.parametrize(
    "window",
    [
        {"end": "-62135596800"},
        {"end": "0001-01-01T00:05:00Z"},
        {"end": "9999-12-31T23:00:00-23:59"},
        {"start": "0001-01-01T00:00:00+23:59", "end": "0001-01-02T00:00:00Z"},
        {"end": "9999-12-31T23:59:59Z"},
        {"start": "2263-01-01T00:00:00Z", "end": "2263-01-02T00:00:00Z"},
        {"start": "0", "end": "9999999999"},
        {"start": "1850-01-01T00:00:00Z", "end": "1850-01-02T00:00:00Z"},
    ],
)
def test_times_outside_what_the_store_holds_are_refused_naming_the_parameter(server, window) -> None:
    url, _, _ = server
    paths = [
        "/api/v1/summary",
        "/api/v1/requests",
        "/api/v1/requests/count",
        "/api/v1/timeseries/ttft",
        "/api/v1/diagnosis",
        "/api/v1/views/latency",
        "/api/v1/views/correlate",
        "/api/v1/views/breakdown",
        "/api/v1/views/fleet",
        "/api/v1/alerts",
    ]
    with httpx.Client(base_url=url, timeout=60.0) as http:
        for path in paths:
            answer = http.get(path, params=window)
            assert answer.status_code == 422, (path, window, answer.status_code, answer.text[:300])
            (problem,) = answer.json()["detail"]
            assert problem["loc"][1] in window and "out of range" in problem["msg"], (path, problem)


def test_an_unencoded_plus_and_a_time_in_nanoseconds_are_explained(server) -> None:
    url, _, _ = server
    with httpx.Client(base_url=url, timeout=60.0) as http:
        # As a shell or a browser sends it: the query string reads the '+' as a space.
        answer = http.get("/api/v1/summary?start=2026-12-03T16:00:00+00:00&end=2026-12-03T16:10:00Z")
    assert answer.status_code == 422
    (problem,) = answer.json()["detail"]
    assert (
        problem["loc"] == ["query", "start"]
        and "must be sent as %2B (or give the time in UTC with Z)" in problem["msg"]
    )
    with httpx.Client(base_url=url, timeout=60.0) as http:
        # A recording's ground truth gives nanoseconds: the 422 says so.
        answer = http.get("/api/v1/summary", params={"start": "1796306790826543231", "end": "1796306869888134145"})
    (problem,) = answer.json()["detail"]
    assert problem["loc"] == ["query", "start"]
    assert problem["msg"].endswith("Unix times are seconds, and this looks like nanoseconds (1796306790.826543231 s)")


def test_the_widest_window_allowed_answers_without_a_server_error(server) -> None:
    url, _, _ = server
    widest = {"start": "1970-01-01T00:00:00Z", "end": "2100-01-01T00:00:00Z"}
    with httpx.Client(base_url=url, timeout=120.0) as http:
        for path in [
            "/api/v1/views/latency",
            "/api/v1/views/correlate",
            "/api/v1/views/breakdown",
            "/api/v1/views/fleet",
            "/api/v1/diagnosis",
            "/api/v1/summary",
        ]:
            answer = http.get(path, params=widest)
            # 200, or 422 naming why (the summary's 31-day bound, a baseline before 1970).
            assert answer.status_code in (200, 422), (path, answer.status_code, answer.text[:300])
        baseline = http.get(
            "/api/v1/diagnosis", params={"start": "1970-01-01T00:10:00Z", "end": "1970-01-01T00:20:00Z"}
        )
        assert baseline.status_code == 422


def test_the_diagnosis_window_defaults_to_the_last_15_minutes(server) -> None:
    url, _, _ = server
    with httpx.Client(base_url=url, timeout=60.0) as http:
        answer = http.get("/api/v1/diagnosis")
    # The stored requests are an hour old: the default window (now − 15 min, now) holds none,
    # which is judged and found too thin, not refused for a missing parameter.
    assert answer.status_code == 422, answer.text[:300]
    (problem,) = answer.json()["detail"]
    assert problem["loc"] == ["query", "start"] and "insufficient data" in problem["msg"], problem
