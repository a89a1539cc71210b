"""Property-based fuzzing of the OTLP receiver (hypothesis) and of the read API (schemathesis),
against the real server on loopback and embedded chDB.

Properties: no answer is a 5xx (a 503 would mean the store was blamed for bad input), the
server stays up, every 400 carries a ``google.rpc.Status`` whose message says what is wrong,
and every item rejected inside a 200 is counted in ``partial_success`` with a reason.
Kept to about 30 s in all (``max_examples`` below).
"""

from __future__ import annotations

import copy
import json
import math
import time

import httpx
import pytest
from google.rpc import status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread

from .otlp_factory import trace_body

pytestmark = pytest.mark.e2e

PROTOBUF = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}
FUZZ = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    store = tmp_path_factory.mktemp("fuzz") / "store"
    running = serve_in_thread(Settings(store_url=f"chdb://{store}", assembly_settle_seconds=0.5), port=0)
    with httpx.Client(base_url=running.url, timeout=60.0) as http:
        yield http
    running.stop()


def _check(response: httpx.Response, response_type=ExportTraceServiceResponse) -> object | None:
    """The receiver's contract for any input; returns the parsed 200 body (or None)."""
    assert response.status_code in (200, 400, 413, 415), (response.status_code, response.text[:500])
    fmt_json = response.headers["content-type"].startswith("application/json")
    if response.status_code != 200:
        status = status_pb2.Status()
        if fmt_json:
            status.message = json.loads(response.content)["message"]
        else:
            status.ParseFromString(response.content)
        assert status.message.strip(), "a rejection must say why"
        return None
    parsed = response_type()
    if fmt_json:
        from google.protobuf import json_format

        json_format.Parse(response.content, parsed)
    else:
        parsed.ParseFromString(response.content)
    if parsed.HasField("partial_success"):
        assert parsed.partial_success.error_message.strip()
    return parsed


# --- protobuf bodies ------------------------------------------------------------------------

VALID_BODY, _ = trace_body(spans_per_trace=5, traces=2)


@FUZZ
@given(cut=st.integers(min_value=0, max_value=len(VALID_BODY) - 1))
def test_truncated_protobuf_is_a_400_or_a_clean_prefix(server: httpx.Client, cut: int) -> None:
    _check(server.post("/v1/traces", content=VALID_BODY[:cut], headers=PROTOBUF))


@FUZZ
@given(body=st.binary(min_size=1, max_size=2048))
def test_random_bytes_never_make_a_5xx(server: httpx.Client, body: bytes) -> None:
    _check(server.post("/v1/traces", content=body, headers=PROTOBUF))
    _check(server.post("/v1/metrics", content=body, headers=PROTOBUF), ExportMetricsServiceResponse)


@FUZZ
@given(position=st.integers(min_value=0, max_value=len(VALID_BODY) - 1), value=st.integers(min_value=0, max_value=255))
def test_flipped_bytes_never_make_a_5xx(server: httpx.Client, position: int, value: int) -> None:
    body = bytearray(VALID_BODY)
    body[position] = value
    _check(server.post("/v1/traces", content=bytes(body), headers=PROTOBUF))


def _one_span_request(name: str = "op", **span_fields) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    span = scope.spans.add(
        trace_id=b"\x01" * 16,
        span_id=b"\x02" * 8,
        name=name,
        start_time_unix_nano=time.time_ns(),
        end_time_unix_nano=time.time_ns() + 1000,
    )
    for key, value in span_fields.items():
        setattr(span, key, value)
    return request


def test_invalid_utf8_in_a_string_field_is_a_400_naming_it(server: httpx.Client) -> None:
    body = _one_span_request("SPANNAME").SerializeToString().replace(b"SPANNAME", b"\xff\xfe\xc3(\xed\xa0\x80x")
    response = server.post("/v1/traces", content=body, headers=PROTOBUF)
    assert response.status_code == 400
    message = status_pb2.Status.FromString(response.content).message
    assert "utf-8" in message.lower() or "parse" in message.lower()


@FUZZ
@given(value=st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 5e-324]))
def test_nan_and_infinite_attributes_are_stored_as_text_and_such_metric_points_rejected(
    server: httpx.Client, value: float
) -> None:
    request = _one_span_request()
    request.resource_spans[0].scope_spans[0].spans[0].span_id = b"\x03" * 8
    request.resource_spans[0].scope_spans[0].spans[0].attributes.append(
        KeyValue(key="x", value=AnyValue(double_value=value))
    )
    parsed = _check(server.post("/v1/traces", content=request.SerializeToString(), headers=PROTOBUF))
    assert parsed is not None and not parsed.HasField("partial_success")
    metrics = ExportMetricsServiceRequest()
    metric = metrics.resource_metrics.add().scope_metrics.add().metrics.add(name="fuzz_gauge")
    metric.gauge.data_points.add(time_unix_nano=time.time_ns(), as_double=value)
    metric.gauge.data_points.add(time_unix_nano=time.time_ns(), as_double=1.5)
    parsed = _check(
        server.post("/v1/metrics", content=metrics.SerializeToString(), headers=PROTOBUF), ExportMetricsServiceResponse
    )
    assert parsed is not None
    if math.isfinite(value):  # extremes, subnormals and -0.0 are measurements
        assert not parsed.HasField("partial_success")
    else:  # not a measurement (it would blank every aggregate of its series): rejected, the finite one kept
        assert parsed.partial_success.rejected_data_points == 1
        assert "dataPoints[0]: asDouble is" in parsed.partial_success.error_message
        assert "not a finite number" in parsed.partial_success.error_message


@pytest.mark.parametrize("year, reason", [(1970, "retention"), (2300, "2262")])
def test_timestamps_out_of_store_range_are_rejected_with_the_reason(
    server: httpx.Client, year: int, reason: str
) -> None:
    start_ns = (year - 1970) * 365 * 86_400 * 10**9 + 10**9
    request = _one_span_request(start_time_unix_nano=start_ns, end_time_unix_nano=start_ns + 10)
    parsed = _check(server.post("/v1/traces", content=request.SerializeToString(), headers=PROTOBUF))
    assert parsed.partial_success.rejected_spans == 1
    assert reason in parsed.partial_success.error_message
    metrics = ExportMetricsServiceRequest()
    metric = metrics.resource_metrics.add().scope_metrics.add().metrics.add(name="fuzz_gauge")
    metric.gauge.data_points.add(time_unix_nano=start_ns, as_double=1.0)
    parsed = _check(
        server.post("/v1/metrics", content=metrics.SerializeToString(), headers=PROTOBUF), ExportMetricsServiceResponse
    )
    assert parsed.partial_success.rejected_data_points == 1
    assert reason in parsed.partial_success.error_message


def test_one_megabyte_values_and_a_hundred_thousand_attributes_are_stored(server: httpx.Client) -> None:
    big = _one_span_request()
    span = big.resource_spans[0].scope_spans[0].spans[0]
    span.span_id = b"\x04" * 8
    span.attributes.append(KeyValue(key="prompt", value=AnyValue(string_value="é" * (512 * 1024))))
    parsed = _check(server.post("/v1/traces", content=big.SerializeToString(), headers=PROTOBUF))
    assert parsed is not None and not parsed.HasField("partial_success")
    many = _one_span_request()
    span = many.resource_spans[0].scope_spans[0].spans[0]
    span.span_id = b"\x05" * 8
    span.attributes.extend(KeyValue(key=f"k{i}", value=AnyValue(int_value=i)) for i in range(100_000))
    parsed = _check(server.post("/v1/traces", content=many.SerializeToString(), headers=PROTOBUF))
    assert parsed is not None and not parsed.HasField("partial_success")
    # A 200 means logged durably; the insert follows within a moment (server/span_log.py).
    assert server.post("/api/v1/flush", timeout=120).json()["ok"]
    stored = server.get(f"/api/v1/traces/{'01' * 16}").json()["spans"]
    by_id = {s["span_id"]: s for s in stored}
    assert len(by_id["0404040404040404"]["span_attributes"]["prompt"]) == 512 * 1024
    assert len(by_id["0505050505050505"]["span_attributes"]) == 100_000


# --- JSON bodies with wrong types --------------------------------------------------------------

TEMPLATE = {
    "resourceSpans": [
        {
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "fuzz"}}]},
            "scopeSpans": [
                {
                    "scope": {"name": "s"},
                    "spans": [
                        {
                            "traceId": "5b8efff798038103d269b633813fc60c",
                            "spanId": "eee19b7ec3c1b174",
                            "name": "op",
                            "kind": 2,
                            "startTimeUnixNano": "1796037400000000000",
                            "endTimeUnixNano": "1796037400100000000",
                            "attributes": [{"key": "a", "value": {"intValue": "3"}}],
                            "events": [{"timeUnixNano": "1796037400050000000", "name": "e"}],
                            "status": {"code": 2, "message": "m"},
                        }
                    ],
                }
            ],
        }
    ]
}
PATHS = [
    ("resourceSpans",),
    ("resourceSpans", 0, "resource"),
    ("resourceSpans", 0, "scopeSpans"),
    ("resourceSpans", 0, "resource", "attributes", 0, "value"),
    ("resourceSpans", 0, "scopeSpans", 0, "spans"),
    *[
        ("resourceSpans", 0, "scopeSpans", 0, "spans", 0, key)
        for key in TEMPLATE["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    ],
    ("resourceSpans", 0, "scopeSpans", 0, "spans", 0, "attributes", 0, "value", "intValue"),
    ("resourceSpans", 0, "scopeSpans", 0, "spans", 0, "events", 0, "timeUnixNano"),
]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)


@FUZZ
@given(path=st.sampled_from(PATHS), value=JSON_VALUES)
def test_json_fields_of_the_wrong_type_never_make_a_5xx(server: httpx.Client, path: tuple, value) -> None:
    body = copy.deepcopy(TEMPLATE)
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    _check(server.post("/v1/traces", content=json.dumps(body).encode(), headers=JSON))


def test_the_server_is_still_healthy_after_fuzzing(server: httpx.Client) -> None:
    assert server.get("/healthz").json()["status"] == "ok"
    body, ids = trace_body(spans_per_trace=3)
    assert server.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 200
    metrics = server.get("/metrics").text
    assert "inferpath_server_otlp_bad_requests_total" in metrics
