"""The real server on loopback: uvicorn + FastAPI + embedded chDB, fed recorded OTLP bodies."""

from __future__ import annotations

import gzip
import json
import re
import socket
import threading
import time
import zlib
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from inferpath.collectors.prometheus import scrape_samples
from inferpath.config import Settings
from inferpath.server.otlp import decode_trace_request
from inferpath.server.otlp_body import MAX_DECOMPRESSED_BYTES
from inferpath.server.runtime import RunningServer, serve_in_thread

from .otlp_factory import trace_body

pytestmark = pytest.mark.e2e

PROTOBUF = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}
# The vLLM capture was recorded on 2026-11-30 (UTC).
CAPTURE_WINDOW = {"start": "2026-11-29T00:00:00Z", "end": "2026-12-02T00:00:00Z"}
MEASURES = [
    "client_ttft",
    "client_e2e",
    "ttft",
    "e2e",
    "itl",
    "gateway",
    "tokenize",
    "retrieval",
    "queue",
    "prefill",
    "decode",
    "model",
    "network",
    "postprocess",
]


def start(store_url: str, **settings: object) -> RunningServer:
    return serve_in_thread(Settings(store_url=store_url, assembly_settle_seconds=0.2, **settings), port=0)


@pytest.fixture()
def server(store_url: str):
    running = start(store_url)
    yield running
    running.stop()


@pytest.fixture()
def client(server: RunningServer):
    with httpx.Client(base_url=server.url, timeout=30.0) as http:
        yield http


def capture(shared_data: Path, folder: str) -> list[Path]:
    files = sorted((shared_data / "vllm_live_capture" / folder).glob("*.pb"))
    assert files
    return files


def llm_traces(files: list[Path]) -> dict[str, int]:
    """trace id → span count, for traces holding an llm_request span."""
    spans = defaultdict(list)
    for path in files:
        for s in decode_trace_request(
            path.read_bytes(), content_type="application/x-protobuf", content_encoding=None
        ).spans:
            spans[s.trace_id].append(s)
    return {t: len(v) for t, v in spans.items() if any(s.span_name == "llm_request" for s in v)}


def recent(body: bytes, offset_ns: int) -> bytes:
    """Shift every ``*UnixNano`` time of an OTLP/JSON example by ``offset_ns``: the spec's
    examples date from 2018, and rows older than the store's TTL are dropped on insert."""

    def shift(node):
        if isinstance(node, dict):
            return {
                k: str(int(v) + offset_ns) if k.endswith("UnixNano") and int(v) else shift(v) for k, v in node.items()
            }
        if isinstance(node, list):
            return [shift(item) for item in node]
        return node

    return json.dumps(shift(json.loads(body))).encode()


EXAMPLE_START_NS = 1_544_712_660_000_000_000  # 2018-12-13T14:51:00Z in the spec examples
RECENT_START_NS = 1_796_037_400_000_000_000  # 2026-11-30T11:16:40Z, inside CAPTURE_WINDOW


def flush(http: httpx.Client) -> dict:
    result = http.post("/api/v1/flush", timeout=120).json()
    assert result["ok"] is True and result["pending_traces"] == 0
    return result


def test_recorded_vllm_export_is_stored_and_assembled(shared_data: Path, client: httpx.Client) -> None:
    files = capture(shared_data, "otlp") + capture(shared_data, "startup_otlp")
    for path in files:
        response = client.post("/v1/traces", content=path.read_bytes(), headers=PROTOBUF)
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-protobuf"
        parsed = ExportTraceServiceResponse.FromString(response.content)
        assert not parsed.HasField("partial_success")
    expected = llm_traces(files)
    flush(client)
    count = client.get("/api/v1/requests/count", params=CAPTURE_WINDOW).json()["count"]
    assert count == len(expected) >= 100
    rows = client.get("/api/v1/requests", params={**CAPTURE_WINDOW, "limit": 1000}).json()["requests"]
    assert {r["trace_id"] for r in rows} == set(expected)
    for row in rows:
        assert row["queue_ns"] is not None and row["prefill_ns"] is not None and row["decode_ns"] is not None
        assert row["span_count"] == expected[row["trace_id"]]
    trace_id = "0af7651916cd43dd8448eb211c80319c"  # three requests sharing one traceparent
    spans = client.get(f"/api/v1/traces/{trace_id.upper()}").json()["spans"]
    assert [s["span_name"] for s in spans] == ["llm_request"] * 3
    assert all(s["parent_span_id"] == "b7ad6b7169203331" and s["span_kind"] == "Server" for s in spans)


def test_summary_returns_the_fourteen_measures(shared_data: Path, client: httpx.Client) -> None:
    for path in capture(shared_data, "otlp"):
        assert client.post("/v1/traces", content=path.read_bytes(), headers=PROTOBUF).status_code == 200
    flush(client)
    summary = client.get("/api/v1/summary", params=CAPTURE_WINDOW).json()
    assert [m["measure"] for m in summary["measures"]] == MEASURES
    by_name = {m["measure"]: m for m in summary["measures"]}
    n = summary["request_count"]
    assert n == len(llm_traces(capture(shared_data, "otlp")))
    for measure in ("ttft", "e2e", "queue", "prefill", "decode", "itl"):
        assert by_name[measure]["count"] == n
        assert 0 <= by_name[measure]["p50_seconds"] <= by_name[measure]["p99_seconds"]
    assert by_name["client_ttft"]["count"] == 0 and by_name["client_ttft"]["p50_seconds"] is None
    # The same window as Unix seconds gives the same answer.
    unix = {"start": "1796000000", "end": "1796100000"}
    assert client.get("/api/v1/summary", params=unix).json()["request_count"] == n


def test_spec_json_example_lands_and_reads_back(shared_data: Path, client: httpx.Client) -> None:
    body = recent(
        (shared_data / "otlp_traces" / "otel_proto_examples_trace.json").read_bytes(),
        RECENT_START_NS - EXAMPLE_START_NS,
    )
    response = client.post("/v1/traces", content=body, headers=JSON)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    assert response.json() == {}
    flush(client)
    (span,) = client.get("/api/v1/traces/5B8EFFF798038103D269B633813FC60C").json()["spans"]
    assert span["span_name"] == "I'm a server span" and span["service_name"] == "my.service"
    assert span["span_attributes"] == {"my.span.attr": "some value"}
    assert span["end_ns"] - span["start_ns"] == 1_000_000_000 and span["start_ns"] == RECENT_START_NS


def test_malformed_bodies_get_400_naming_the_problem_then_valid_ones_land(
    shared_data: Path, client: httpx.Client
) -> None:
    bad = client.post("/v1/traces", content=b"\xff\xff\xff\xff", headers=PROTOBUF)
    assert bad.status_code == 400
    assert "not a valid protobuf ExportTraceServiceRequest" in status_pb2.Status.FromString(bad.content).message
    wrong_id = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "abc", "spanId": "0102030405060708"}]}]}]}
    bad_json = client.post("/v1/traces", json=wrong_id)
    assert bad_json.status_code == 400
    assert "resourceSpans[0].scopeSpans[0].spans[0].traceId" in bad_json.json()["message"]
    bad_gzip = client.post("/v1/traces", content=b"nope", headers={**JSON, "content-encoding": "gzip"})
    assert bad_gzip.status_code == 400 and "not valid gzip" in bad_gzip.json()["message"]

    good = capture(shared_data, "otlp")[5]  # the first body holding llm_request spans
    assert client.post("/v1/traces", content=good.read_bytes(), headers=PROTOBUF).status_code == 200
    flush(client)
    trace_id = next(iter(llm_traces([good])))
    assert client.get(f"/api/v1/traces/{trace_id}").status_code == 200
    assert "inferpath_server_otlp_bad_requests_total 3.0" in client.get("/metrics").text


def test_gzip_body_and_partial_success(client: httpx.Client) -> None:
    valid = {
        "traceId": "0102030405060708090a0b0c0d0e0f10",
        "spanId": "0102030405060708",
        "name": "ok",
        "startTimeUnixNano": str(1_796_037_400_000_000_000),
        "endTimeUnixNano": str(1_796_037_400_500_000_000),
    }
    zero = dict(valid, traceId="0" * 32)
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [valid, zero]}]}]}).encode()
    response = client.post("/v1/traces", content=gzip.compress(body), headers={**JSON, "content-encoding": "gzip"})
    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert int(partial["rejectedSpans"]) == 1 and "traceId is all zeros" in partial["errorMessage"]
    flush(client)
    (span,) = client.get("/api/v1/traces/0102030405060708090a0b0c0d0e0f10").json()["spans"]
    assert span["duration_ns"] == 500_000_000
    assert "inferpath_server_spans_rejected_total 1.0" in client.get("/metrics").text
    # A warning alone: the span is kept, partial_success says why with a count of 0.
    odd = dict(valid, spanId="0102030405060709", kind="SPAN_KIND_SIDEWAYS")
    response = client.post(
        "/v1/traces", content=json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [odd]}]}]}).encode(), headers=JSON
    )
    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert int(partial.get("rejectedSpans", 0)) == 0
    assert "spans[0].kind: unknown span kind 'SPAN_KIND_SIDEWAYS', stored as the default" in partial["errorMessage"]
    flush(client)
    spans = client.get("/api/v1/traces/0102030405060708090a0b0c0d0e0f10").json()["spans"]
    assert {span["span_kind"] for span in spans if span["span_id"] == "0102030405060709"} == {"Unspecified"}
    assert "inferpath_server_spans_warned_total 1.0" in client.get("/metrics").text


def test_unsupported_media_and_oversized_bodies(store_url: str) -> None:
    running = start(store_url, max_body_bytes=1024)
    try:
        with httpx.Client(base_url=running.url, timeout=60.0) as http:
            assert http.post("/v1/traces", content=b"{}", headers={"content-type": "text/plain"}).status_code == 415
            assert http.post("/v1/traces", content=b"{}", headers={**JSON, "content-encoding": "br"}).status_code == 415
            big = http.post("/v1/traces", content=b" " * 4096, headers=JSON)
            assert big.status_code == 413 and "max_body_bytes=1024" in big.json()["message"]
            assert http.get("/healthz").json()["status"] == "ok"
    finally:
        running.stop()


def test_bodies_inflating_past_the_limit_are_413_as_oversized_raw_bodies_are(store_url: str) -> None:
    # 64 MiB + 1 byte: one gzip member, two members of half that each (RFC 1952 allows
    # several; the limit is on their sum), and zlib-wrapped deflate.
    limit = MAX_DECOMPRESSED_BYTES
    half = gzip.compress(b"\0" * (limit // 2 + 1))
    bodies = {"gzip": gzip.compress(b"\0" * (limit + 1)), "deflate": zlib.compress(b"\0" * (limit + 1))}
    running = start(store_url)
    try:
        with httpx.Client(base_url=running.url, timeout=60.0) as http:
            for path in ("/v1/traces", "/v1/metrics"):
                for encoding, body in [*bodies.items(), ("gzip", half + half)]:
                    answer = http.post(path, content=body, headers={**PROTOBUF, "content-encoding": encoding})
                    assert answer.status_code == 413, (path, encoding, answer.status_code)
                    status = status_pb2.Status.FromString(answer.content)
                    assert status.code == 8 and f"{encoding} body inflates past {limit} bytes" in status.message
                # At the limit exactly the body is decoded (and, all zeros, found malformed).
                exact = http.post(
                    path, content=gzip.compress(b"\0" * limit), headers={**PROTOBUF, "content-encoding": "gzip"}
                )
                assert exact.status_code == 400, exact.status_code
            trace, _ = trace_body(spans_per_trace=2)
            ok = http.post("/v1/traces", content=gzip.compress(trace), headers={**PROTOBUF, "content-encoding": "gzip"})
            assert ok.status_code == 200
    finally:
        running.stop()


def test_stalled_uploads_are_answered_408_and_free_their_in_flight_slots(store_url: str) -> None:
    running = start(store_url, max_inflight_requests=2, body_read_timeout_seconds=0.5)
    host, port = running.url.removeprefix("http://").split(":")
    stalled = []
    try:
        # Two exports that promise 100 bytes and send 3: together they fill the in-flight limit.
        for _ in range(2):
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(
                b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                b"Content-Length: 100\r\n\r\nabc"
            )
            stalled.append(sock)
        body, _ = trace_body(spans_per_trace=2)
        with httpx.Client(base_url=running.url, timeout=30.0) as http:
            deadline = time.monotonic() + 10.0
            while running.runtime.ingest.inflight_requests < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert http.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 503  # full
            for sock in stalled:  # each answered once its deadline passed, the connection closed
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
                head, _, payload = answer.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 408"), head
                status = status_pb2.Status.FromString(payload)
                assert status.code == 4 and "body_read_timeout_seconds=0.5" in status.message
            assert running.runtime.ingest.inflight_requests == 0
            assert http.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 200
    finally:
        for sock in stalled:
            sock.close()
        running.stop()


def test_body_read_timeout_is_a_validated_setting() -> None:
    from inferpath.config import ENV_BODY_READ_TIMEOUT_SECONDS

    assert Settings().body_read_timeout_seconds == 30.0
    assert Settings.from_env({ENV_BODY_READ_TIMEOUT_SECONDS: "5"}).body_read_timeout_seconds == 5.0
    for bad in ("0", "-1", "nan", "slow"):
        with pytest.raises(ValueError, match="body_read_timeout_seconds"):
            Settings.from_env({ENV_BODY_READ_TIMEOUT_SECONDS: bad})


def test_read_api_validates_parameters(client: httpx.Client) -> None:
    naive = client.get("/api/v1/summary", params={"start": "2026-11-30T00:00:00"})
    assert naive.status_code == 422 and naive.json()["detail"][0]["loc"] == ["query", "start"]
    backwards = client.get("/api/v1/requests", params={"start": "2026-11-30T00:00:00Z", "end": "2026-11-29T00:00:00Z"})
    assert backwards.status_code == 422 and backwards.json()["detail"][0]["loc"] == ["query", "end"]
    step = client.get("/api/v1/timeseries/ttft", params={"step_seconds": 0})
    assert step.status_code == 422 and "step_seconds" in step.json()["detail"][0]["loc"]
    # Too many buckets for the window: the reader's refusal names the parameter alone.
    buckets = client.get(
        "/api/v1/timeseries/ttft",
        params={"start": "2026-10-31T08:00:00Z", "end": "2026-12-01T08:00:00Z", "step_seconds": 1},
    )
    assert buckets.status_code == 422 and buckets.json()["detail"][0]["loc"] == ["query", "step_seconds"]
    assert client.get("/api/v1/traces/not-a-trace-id").status_code == 422
    assert client.get("/api/v1/traces/" + "ab" * 16).status_code == 404
    assert client.get("/api/v1/timeseries/gauge").status_code == 422  # metric is required
    assert "/api/v1/summary" in client.get("/openapi.json").json()["paths"]


def test_error_bodies_do_not_echo_long_inputs_whole(client: httpx.Client) -> None:
    # A 60 000-character path parameter, query parameter and time: each 422 names the
    # parameter and repeats at most 256 characters of what was sent, with its length.
    cases = [
        ("/api/v1/traces/" + "a" * 60_000, None, ["path", "trace_id"]),
        ("/api/v1/timeseries/gauge", {"metric": "m" * 60_000}, ["query", "metric"]),
        ("/api/v1/summary", {"start": "9" * 60_000}, ["query", "start"]),
    ]
    for path, params, loc in cases:
        response = client.get(path, params=params)
        assert response.status_code == 422, (path, response.text[:300])
        assert response.json()["detail"][0]["loc"] == loc
        assert len(response.content) < 2_000, (loc, len(response.content))
        assert re.search(r"… \(600\d\d characters\)", response.text), response.text[:600]


def test_restart_on_the_same_store_keeps_earlier_spans(shared_data: Path, store_url: str) -> None:
    first, second = capture(shared_data, "otlp")[5], capture(shared_data, "otlp")[6]
    first_traces, second_traces = llm_traces([first]), llm_traces([second])
    assert first_traces and second_traces
    running = start(store_url)
    with httpx.Client(base_url=running.url, timeout=60.0) as http:
        assert http.post("/v1/traces", content=first.read_bytes(), headers=PROTOBUF).status_code == 200
    running.stop()  # graceful: what was accepted is inserted and assembled before the store closes

    running = start(store_url)
    try:
        with httpx.Client(base_url=running.url, timeout=60.0) as http:
            count = http.get("/api/v1/requests/count", params=CAPTURE_WINDOW).json()["count"]
            assert count == len(first_traces)
            assert http.post("/v1/traces", content=second.read_bytes(), headers=PROTOBUF).status_code == 200
            flush(http)
            count = http.get("/api/v1/requests/count", params=CAPTURE_WINDOW).json()["count"]
            assert count == len(set(first_traces) | set(second_traces))
            for trace_id in (next(iter(first_traces)), next(iter(second_traces))):
                assert http.get(f"/api/v1/traces/{trace_id}").status_code == 200
    finally:
        running.stop()


def test_bearer_token_guards_ingest_and_reads(shared_data: Path, store_url: str) -> None:
    running = start(store_url, token="s3cret")
    body = capture(shared_data, "otlp")[0].read_bytes()
    try:
        with httpx.Client(base_url=running.url, timeout=60.0) as http:
            assert http.get("/healthz").status_code == 200
            refused = http.post("/v1/traces", content=body, headers=PROTOBUF)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
            # An OTLP client gets the OTLP error body: google.rpc.Status, in its own encoding.
            status = status_pb2.Status.FromString(refused.content)
            assert status.code == 16 and "bearer token" in status.message
            as_json = http.post("/v1/metrics", content=b"{}", headers=JSON)
            assert as_json.status_code == 401 and as_json.json()["code"] == 16
            assert http.get("/api/v1/summary").json()["detail"] == "missing or wrong bearer token"
            assert http.get("/api/v1/summary").status_code == 401
            assert http.get("/metrics", headers={"authorization": "Bearer wrong"}).status_code == 401
            auth = {"authorization": "Bearer s3cret"}
            assert http.post("/v1/traces", content=body, headers={**PROTOBUF, **auth}).status_code == 200
            assert http.get("/api/v1/summary", headers=auth).status_code == 200
            assert "inferpath_server_spans_received_total" in http.get("/metrics", headers=auth).text
            # The scheme is case-insensitive; the token is not, and nothing else passes.
            assert http.get("/api/v1/summary", headers={"authorization": "bearer s3cret"}).status_code == 200
            for wrong in ("Bearer S3CRET", "Basic s3cret", "Bearer", "s3cret", "Bearer s3cret extra", "Bearers3cret"):
                assert http.get("/api/v1/summary", headers={"authorization": wrong}).status_code == 401, wrong
    finally:
        running.stop()


def test_otlp_metrics_land_in_the_metric_tables(shared_data: Path, server: RunningServer, client: httpx.Client) -> None:
    body = recent(
        (shared_data / "otlp_traces" / "otel_proto_examples_metrics.json").read_bytes(),
        RECENT_START_NS - EXAMPLE_START_NS,
    )
    response = client.post("/v1/metrics", content=body, headers=JSON)
    assert response.status_code == 200
    assert int(response.json()["partialSuccess"]["rejectedDataPoints"]) == 1
    assert flush(client)["data_points_inserted_total"] == 3
    store = server.runtime.store
    assert store.query("SELECT MetricName, Value FROM otel_metrics_gauge") == [("my.gauge", 10.0)]
    assert store.query("SELECT MetricName, Value, IsMonotonic FROM otel_metrics_sum") == [("my.counter", 5.0, True)]
    assert store.query("SELECT BucketCounts, ExplicitBounds FROM otel_metrics_histogram") == [([1, 1], [1.0])]
    points = client.get("/api/v1/timeseries/gauge", params={"metric": "my.gauge", **CAPTURE_WINDOW}).json()["points"]
    assert [p["value"] for p in points] == [10.0]


class _PromHandler(BaseHTTPRequestHandler):
    text = b""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.text)

    def log_message(self, *args: object) -> None:
        pass


def test_scrape_loop_stores_canonical_signals(shared_data: Path, store_url: str) -> None:
    files = sorted((shared_data / "vllm_live_capture").glob("metrics_*.prom"))
    # The scrape with the deepest queue of the run.
    text = max(
        (p.read_text() for p in files),
        key=lambda t: next(s.value for s in scrape_samples(t, "vllm", timestamp=_now()) if s.signal == "queue_depth"),
    )
    handler = type("Handler", (_PromHandler,), {"text": text.encode()})
    engine = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{engine.server_address[1]}/metrics"
    running = start(store_url, scrape_targets=f"vllm={url}", scrape_interval_seconds=0.2)
    try:
        deadline = time.monotonic() + 20
        while running.runtime.scrape_loop.samples_total == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        with httpx.Client(base_url=running.url, timeout=60.0) as http:
            flush(http)
        rows = running.runtime.store.query_dicts(
            "SELECT ServiceName, Value, Attributes FROM otel_metrics_gauge WHERE MetricName = 'queue_depth'"
            " ORDER BY TimeUnix LIMIT 1"
        )
        expected = next(s for s in scrape_samples(text, "vllm", timestamp=_now()) if s.signal == "queue_depth")
        assert rows and rows[0]["ServiceName"] == "vllm" and rows[0]["Value"] == expected.value > 0
        assert rows[0]["Attributes"]["inferpath.source_metric"] == "vllm:num_requests_waiting"
        sums = running.runtime.store.query(
            "SELECT count() FROM otel_metrics_sum WHERE MetricName = 'preemptions_total'"
        )
        assert sums[0][0] >= 1
    finally:
        running.stop()
        engine.shutdown()


def _now():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def test_a_stop_with_work_left_says_what_it_does_and_how_long_it_took(store_url: str, caplog) -> None:
    caplog.set_level("INFO", logger="inferpath.server.runtime")
    # Settling takes 30 s: the trace is still logged or pending at the stop, right after its 200.
    running = serve_in_thread(Settings(store_url=store_url, assembly_settle_seconds=30.0), port=0)
    body, _ = trace_body(spans_per_trace=3, traces=2)
    with httpx.Client(base_url=running.url, timeout=30.0) as http:
        assert http.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 200
    running.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "inferpath.server.runtime"]
    stopping = [line for line in lines if line.startswith("stopping: ")]
    assert len(stopping) == 1, lines
    said = re.fullmatch(
        r"stopping: inserting (\d+) spans still in the span log, assembling (\d+) pending traces", stopping[0]
    )
    assert said and int(said[1]) + int(said[2]) > 0, stopping
    assert any(re.fullmatch(r"stopped in \d+\.\d s", line) for line in lines), lines
