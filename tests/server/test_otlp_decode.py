"""OTLP/HTTP body decoding on the recorded vLLM capture and the OTLP spec's JSON examples."""

from __future__ import annotations

import base64
import gzip
import json
import re
from pathlib import Path

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from inferpath.server.attributes import any_value_to_string, format_double
from inferpath.server.otlp import (
    MAX_METRIC_NAME_CHARS,
    OTLPDecodeError,
    UnsupportedMediaTypeError,
    decode_metrics_request,
    decode_trace_request,
)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


def _capture_files(shared_data: Path, folder: str) -> list[Path]:
    files = sorted((shared_data / "vllm_live_capture" / folder).glob("*.pb"))
    assert files, f"no recorded OTLP bodies in {folder}"
    return files


def _to_otlp_json(request: ExportTraceServiceRequest) -> dict:
    """OTLP/JSON as an SDK would send it: proto3 JSON with ids re-encoded as hex."""
    document = json_format.MessageToDict(request)
    for resource in document.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex().upper()
    return document


def test_vllm_capture_decodes_every_llm_request_span(shared_data: Path) -> None:
    spans = []
    for path in _capture_files(shared_data, "otlp") + _capture_files(shared_data, "startup_otlp"):
        decoded = decode_trace_request(path.read_bytes(), content_type=PROTOBUF, content_encoding=None)
        assert decoded.rejected_spans == 0 and decoded.error_message == ""
        spans.extend(decoded.spans)
    engine = [s for s in spans if s.span_name == "llm_request"]
    assert len(engine) >= 100
    for span in engine:
        assert span.span_kind == "Server"
        assert span.status_code == "Unset"
        assert len(span.trace_id) == 32 and len(span.span_id) == 16
        # ints stay decimal, doubles are Go-formatted (no exponent above 1e-6)
        assert span.span_attributes["gen_ai.usage.prompt_tokens"].isdigit()
        assert "e" not in span.span_attributes["gen_ai.latency.time_in_queue"]
        assert span.duration_ns > 0
    services = {s.service_name for s in spans}
    assert {"vllm-tiny", "unknown_service:python"} <= services
    # The start-up requests carried a W3C traceparent: vLLM kept its trace id and parent.
    propagated = [s for s in engine if s.trace_id == "0af7651916cd43dd8448eb211c80319c"]
    assert len(propagated) == 3 and {s.parent_span_id for s in propagated} == {"b7ad6b7169203331"}


def test_spec_json_example_uses_hex_ids_and_exporter_strings(shared_data: Path) -> None:
    body = (shared_data / "otlp_traces" / "otel_proto_examples_trace.json").read_bytes()
    decoded = decode_trace_request(body, content_type="application/json; charset=utf-8", content_encoding=None)
    assert decoded.rejected_spans == 0
    (span,) = decoded.spans
    assert span.trace_id == "5b8efff798038103d269b633813fc60c"
    assert span.span_id == "eee19b7ec3c1b174" and span.parent_span_id == "eee19b7ec3c1b173"
    assert span.span_kind == "Server" and span.service_name == "my.service"
    assert span.scope_name == "my.library" and span.scope_version == "1.0.0"
    assert span.duration_ns == 1_000_000_000
    assert span.start_ns == 1544712660000000000
    assert span.span_attributes == {"my.span.attr": "some value"}


def test_json_and_protobuf_of_the_same_export_give_the_same_rows(shared_data: Path) -> None:
    raw = _capture_files(shared_data, "startup_otlp")[-1].read_bytes()
    request = ExportTraceServiceRequest()
    request.ParseFromString(raw)
    from_pb = decode_trace_request(raw, content_type=PROTOBUF, content_encoding=None).spans
    body = json.dumps(_to_otlp_json(request)).encode()
    from_json = decode_trace_request(body, content_type=JSON, content_encoding=None).spans
    assert from_pb == from_json and len(from_pb) == 3


def test_gzip_body_decodes_like_identity(shared_data: Path) -> None:
    raw = _capture_files(shared_data, "otlp")[3].read_bytes()
    plain = decode_trace_request(raw, content_type=PROTOBUF, content_encoding="identity")
    zipped = decode_trace_request(gzip.compress(raw), content_type=PROTOBUF, content_encoding="gzip")
    assert zipped == plain and plain.spans
    # Several gzip members (RFC 1952) are one body; bytes after the stream that are not
    # another member, or a stream cut short, are an error.
    half = len(raw) // 2
    members = gzip.compress(raw[:half]) + gzip.compress(raw[half:])
    assert decode_trace_request(members, content_type=PROTOBUF, content_encoding="gzip") == plain
    for bad, problem in (
        (gzip.compress(raw) + b"trailing", "8 bytes follow the end of the stream"),
        (gzip.compress(raw)[:-4], "stream is truncated"),
    ):
        with pytest.raises(OTLPDecodeError, match=problem):
            decode_trace_request(bad, content_type=PROTOBUF, content_encoding="gzip")


@pytest.mark.parametrize(
    ("body", "content_type", "encoding", "expected"),
    [
        (b"not gzip at all", PROTOBUF, "gzip", "not valid gzip"),
        (b"\xff\xff\xff\xff", PROTOBUF, None, "not a valid protobuf ExportTraceServiceRequest"),
        (b"[1, 2]", JSON, None, "JSON body must be an object"),
        (b"{", JSON, None, "not valid JSON"),
        (b'{"resourceSpans": {"a": 1}}', JSON, None, "resourceSpans: expected an array"),
        (b'{"resourceSpans": {}}', JSON, None, "^resourceSpans: expected an array, got dict$"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "abcd", "spanId": "0102030405060708"}]}]}]}',
            JSON,
            None,
            "resourceSpans[0].scopeSpans[0].spans[0].traceId: expected 32 hex digits, got 4",
        ),
        (
            b'{"resourceSpans": [{"scopeSpans": [{}, {"spans": [{}, {"spanId": "zz02030405060708"}]}]}]}',
            JSON,
            None,
            "resourceSpans[0].scopeSpans[1].spans[1].spanId: not a hex string",
        ),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}',
            JSON,
            None,
            "startTimeUnixNano",
        ),
    ],
)
def test_malformed_bodies_raise_naming_the_problem(body, content_type, encoding, expected) -> None:
    with pytest.raises(OTLPDecodeError) as info:
        decode_trace_request(body, content_type=content_type, content_encoding=encoding)
    if expected.startswith("^"):  # the whole message
        assert re.fullmatch(expected[1:].rstrip("$"), str(info.value))
    else:
        assert expected in str(info.value)


def test_wrong_protobuf_id_length_names_the_span() -> None:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id = b"\x01" * 16, b"\x02" * 5
    with pytest.raises(OTLPDecodeError, match=r"resourceSpans\[0\]\.scopeSpans\[0\]\.spans\[0\]\.spanId"):
        decode_trace_request(request.SerializeToString(), content_type=PROTOBUF, content_encoding=None)


def test_unknown_media_type_and_encoding_are_unsupported() -> None:
    with pytest.raises(UnsupportedMediaTypeError, match="Content-Type"):
        decode_trace_request(b"{}", content_type="text/plain", content_encoding=None)
    for missing in (None, "", "  "):
        with pytest.raises(UnsupportedMediaTypeError, match="^missing Content-Type"):
            decode_trace_request(b"{}", content_type=missing, content_encoding=None)
    for no_media in (" ; charset=utf-8", ";;;==="):  # sent, but without a media type: named as sent
        with pytest.raises(UnsupportedMediaTypeError, match=f"^unsupported Content-Type {re.escape(repr(no_media))}"):
            decode_trace_request(b"{}", content_type=no_media, content_encoding=None)
    with pytest.raises(UnsupportedMediaTypeError, match="Content-Encoding"):
        decode_trace_request(b"{}", content_type=JSON, content_encoding="br")


def test_invalid_spans_are_rejected_and_counted_while_valid_ones_are_kept() -> None:
    good = {
        "traceId": "5B8EFFF798038103D269B633813FC60C",
        "spanId": "EEE19B7EC3C1B174",
        "name": "good",
        "startTimeUnixNano": "100",
        "endTimeUnixNano": 200,
        "kind": 3,
        "status": {"code": 2, "message": "boom"},
    }
    zero_trace = dict(good, traceId="0" * 32, name="zero")
    backwards = dict(good, spanId="EEE19B7EC3C1B175", startTimeUnixNano="300", name="backwards")
    no_trace = {key: value for key, value in good.items() if key != "traceId"}
    no_span = dict(good, spanId=None)
    body = json.dumps(
        {"resourceSpans": [{"scopeSpans": [{"spans": [zero_trace, good, backwards, no_trace, no_span]}]}]}
    ).encode()
    decoded = decode_trace_request(body, content_type=JSON, content_encoding=None)
    assert [s.span_name for s in decoded.spans] == ["good"]
    assert decoded.spans[0].span_kind == "Client" and decoded.spans[0].status_code == "Error"
    assert decoded.spans[0].status_message == "boom" and decoded.spans[0].duration_ns == 100
    assert decoded.rejected_spans == 4
    assert "spans[0]: traceId is all zeros" in decoded.error_message
    assert "spans[2]: endTimeUnixNano is before startTimeUnixNano" in decoded.error_message
    assert "spans[3]: traceId is missing" in decoded.error_message
    assert "spans[4]: spanId is missing" in decoded.error_message


def test_unknown_span_kinds_and_status_codes_keep_the_span_with_a_warning() -> None:
    base = {
        "traceId": "5B8EFFF798038103D269B633813FC60C",
        "name": "s",
        "startTimeUnixNano": "100",
        "endTimeUnixNano": "200",
    }
    spans = [
        dict(base, spanId="EEE19B7EC3C1B171", kind="SPAN_KIND_SERVER", status={"code": "STATUS_CODE_ERROR"}),
        dict(base, spanId="EEE19B7EC3C1B172", kind="SPAN_KIND_BOGUS"),
        dict(base, spanId="EEE19B7EC3C1B173", kind=9, status={"code": "STATUS_CODE_MAYBE"}),
        dict(base, spanId="EEE19B7EC3C1B174", kind="3", status={"code": 7}),
        dict(base, spanId="EEE19B7EC3C1B175", kind=2.0, status={"code": None}),
        # rejected for its time: its unknown kind is not also reported as kept
        dict(base, spanId="EEE19B7EC3C1B176", kind="SPAN_KIND_BOGUS", startTimeUnixNano="0"),
    ]
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()
    decoded = decode_trace_request(body, content_type=JSON, content_encoding=None)
    assert [(s.span_kind, s.status_code) for s in decoded.spans] == [
        ("Server", "Error"),
        ("Unspecified", "Unset"),
        ("Unspecified", "Unset"),
        ("Client", "Unset"),
        ("Server", "Unset"),
    ]
    assert decoded.rejected_spans == 1
    prefix = "resourceSpans[0].scopeSpans[0]"
    assert decoded.error_message == (
        f"1 span rejected: {prefix}.spans[5]: startTimeUnixNano is missing. 3 spans kept with a warning: "
        f"{prefix}.spans[1].kind: unknown span kind 'SPAN_KIND_BOGUS', stored as the default; "
        # one span, two fields: one warning naming both
        f"{prefix}.spans[2].status.code: unknown status code 'STATUS_CODE_MAYBE', stored as the default; "
        f"{prefix}.spans[2].kind: unknown span kind 9, stored as the default; "
        f"{prefix}.spans[3].status.code: unknown status code 7, stored as the default"
    )
    # The same numbers in a protobuf body, with a rejected span beside them: both are said.
    request = ExportTraceServiceRequest()
    json_format.ParseDict(
        {
            "resourceSpans": [
                {
                    "scopeSpans": [
                        {
                            "spans": [
                                dict(
                                    base,
                                    traceId=base64.b64encode(bytes.fromhex(base["traceId"])).decode(),
                                    spanId=base64.b64encode(bytes.fromhex("EEE19B7EC3C1B17" + str(n))).decode(),
                                    kind=kind,
                                    startTimeUnixNano=start,
                                )
                                for n, kind, start in ((1, 6, "100"), (2, 1, "0"))
                            ]
                        }
                    ]
                }
            ]
        },
        request,
    )
    decoded = decode_trace_request(request.SerializeToString(), content_type=PROTOBUF, content_encoding=None)
    assert [s.span_kind for s in decoded.spans] == ["Unspecified"] and decoded.rejected_spans == 1
    assert decoded.error_message == (
        f"1 span rejected: {prefix}.spans[1]: startTimeUnixNano is missing. "
        f"1 span kept with a warning: {prefix}.spans[0].kind: unknown span kind 6, stored as the default"
    )


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("kind", 3.5, "spans[0].kind: expected a span kind name or integer, got float (3.5)"),
        ("kind", True, "spans[0].kind: expected a span kind name or integer, got bool"),
        ("kind", {"a": 1}, "spans[0].kind: expected a span kind name or integer, got dict"),
        ("kind", 4294967298, "spans[0].kind: span kind 4294967298 is outside the int32 range of an enum"),
        ("kind", "3" * 4299, "spans[0].kind: unknown span kind '" + "3" * 64 + "'"),  # not a number: a name
        ("kind", 1e308, "spans[0].kind: expected a span kind name or integer, got float"),
        ("status", 2, "spans[0].status: expected an object, got int"),
        ("status", {"code": True}, "spans[0].status.code: expected a status code name or integer, got bool"),
        ("name", 5, "spans[0].name: expected string or bytes-like object"),
        (
            "attributes",
            [{"key": "a", "value": {"intValue": "abc"}}],
            "spans[0].attributes.value.intValue: invalid literal",
        ),
    ],
)
def test_wrong_types_are_a_400_naming_the_span_and_field(field: str, value, says: str) -> None:
    span = {
        "traceId": "5B8EFFF798038103D269B633813FC60C",
        "spanId": "EEE19B7EC3C1B171",
        "name": "s",
        "startTimeUnixNano": "100",
        "endTimeUnixNano": "200",
        field: value,
    }
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()
    if "unknown span kind" in says:  # the one kept, with a warning cut to 64 characters
        decoded = decode_trace_request(body, content_type=JSON, content_encoding=None)
        assert says in decoded.error_message and len(decoded.error_message) < 300
        return
    with pytest.raises(OTLPDecodeError) as error:
        decode_trace_request(body, content_type=JSON, content_encoding=None)
    assert f"resourceSpans[0].scopeSpans[0].{says}" in str(error.value) and len(str(error.value)) < 400


@pytest.mark.parametrize("where", ["resource", "scope"])
def test_a_resource_or_scope_that_is_not_an_object_is_a_400(where: str) -> None:
    span = {
        "traceId": "5B8EFFF798038103D269B633813FC60C",
        "spanId": "EEE19B7EC3C1B171",
        "name": "s",
        "startTimeUnixNano": "100",
        "endTimeUnixNano": "200",
    }
    scope_spans = {"spans": [span], **({"scope": "x"} if where == "scope" else {})}
    resource_spans = {"scopeSpans": [scope_spans], **({"resource": "x"} if where == "resource" else {})}
    body = json.dumps({"resourceSpans": [resource_spans]}).encode()
    path = "resourceSpans[0].resource" if where == "resource" else "resourceSpans[0].scopeSpans[0].scope"
    with pytest.raises(OTLPDecodeError, match=re.escape(f"{path}: expected an object, got str")):
        decode_trace_request(body, content_type=JSON, content_encoding=None)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (0.0, "0"),
        (2.5e-05, "0.000025"),
        (1e-07, "1e-7"),
        (1.5e-07, "1.5e-7"),
        (1e21, "1e+21"),
        (123456789.125, "123456789.125"),
        (-0.5, "-0.5"),
        # either side of where Python's repr switches to e-notation (1e-4 and 1e16)
        (0.0001, "0.0001"),
        (9.999e-05, "0.00009999"),
        (1e15, "1000000000000000"),
        (1e16, "10000000000000000"),
        (-0.0, "-0"),
        (100.0, "100"),
        (0.015, "0.015"),
    ],
)
def test_doubles_are_formatted_like_the_collector(value: float, text: str) -> None:
    assert format_double(value) == text


def test_compound_values_flatten_to_go_json() -> None:
    value = json_format.ParseDict(
        {
            "kvlistValue": {
                "values": [
                    {"key": "z", "value": {"intValue": "7"}},
                    {
                        "key": "a",
                        "value": {
                            "arrayValue": {
                                "values": [{"boolValue": True}, {"doubleValue": 2.0}, {"stringValue": "<b>"}]
                            }
                        },
                    },
                ]
            }
        },
        AnyValue(),
    )
    assert any_value_to_string(value) == '{"a":[true,2,"\\u003cb\\u003e"],"z":7}'
    assert any_value_to_string(AnyValue(bool_value=False)) == "false"
    assert any_value_to_string(AnyValue(int_value=-3)) == "-3"
    assert any_value_to_string(AnyValue(bytes_value=b"\x00\x01")) == "AAE="
    assert any_value_to_string(AnyValue()) == ""


def test_metrics_example_gives_gauge_sum_histogram_rows(shared_data: Path) -> None:
    body = (shared_data / "otlp_traces" / "otel_proto_examples_metrics.json").read_bytes()
    decoded = decode_metrics_request(body, content_type=JSON, content_encoding=None)
    (gauge,) = decoded.gauges
    (counter,) = decoded.sums
    (histogram,) = decoded.histograms
    assert (gauge.metric_name, gauge.value, gauge.unit) == ("my.gauge", 10.0, "1")
    assert gauge.service_name == "my.service" and gauge.attributes == {"my.gauge.attr": "some value"}
    assert (counter.metric_name, counter.value, counter.aggregation_temporality, counter.is_monotonic) == (
        "my.counter",
        5.0,
        1,
        True,
    )
    assert histogram.bucket_counts == [1, 1] and histogram.explicit_bounds == [1.0]
    assert (histogram.count, histogram.sum, histogram.min, histogram.max) == (2, 2.0, 0.0, 2.0)
    # Exponential histograms have no table: counted as rejected, named in the message.
    assert decoded.rejected_data_points == 1
    assert "metrics[3].exponentialHistogram.dataPoints[0]" in decoded.error_message


def test_a_metric_name_the_read_api_cannot_ask_for_is_rejected_and_the_others_kept() -> None:
    now = 1_764_547_200_000_000_000  # 2025-12-01T00:00:00Z
    point = {"timeUnixNano": str(now), "asDouble": 1.0}
    long_name, longest = "n" * (MAX_METRIC_NAME_CHARS + 1), "m" * MAX_METRIC_NAME_CHARS
    body = json.dumps(
        {
            "resourceMetrics": [
                {
                    "scopeMetrics": [
                        {
                            "metrics": [
                                {"name": long_name, "gauge": {"dataPoints": [point, point]}},
                                {"name": longest, "gauge": {"dataPoints": [point]}},
                                {"name": "g", "sum": {"dataPoints": [point], "aggregationTemporality": 2}},
                                {
                                    "gauge": {"dataPoints": [point]}
                                },  # no name: the read API's metric parameter needs one
                            ]
                        }
                    ]
                }
            ]
        }
    ).encode()
    decoded = decode_metrics_request(body, content_type=JSON, content_encoding=None)
    assert [g.metric_name for g in decoded.gauges] == [longest]
    assert [s.metric_name for s in decoded.sums] == ["g"]
    assert decoded.rejected_data_points == 3
    assert decoded.error_message == (
        f"3 data points rejected: resourceMetrics[0].scopeMetrics[0].metrics[0].name: {MAX_METRIC_NAME_CHARS + 1}"
        f" characters, at most {MAX_METRIC_NAME_CHARS} (its 2 data points); "
        "resourceMetrics[0].scopeMetrics[0].metrics[3].name: missing (its 1 data point)"
    )


def test_nan_and_infinite_points_are_rejected_naming_them_and_the_finite_ones_kept() -> None:
    now = 1_764_547_200_000_000_000  # 2025-12-01T00:00:00Z

    def point(value) -> dict:
        return {"timeUnixNano": str(now), "asDouble": value}

    body = json.dumps(
        {
            "resourceMetrics": [
                {
                    "scopeMetrics": [
                        {
                            "metrics": [
                                {
                                    "name": "g",
                                    "gauge": {
                                        "dataPoints": [
                                            point(1.0),
                                            point("NaN"),
                                            point("Infinity"),
                                            point("-Infinity"),
                                            point(3.0),
                                        ]
                                    },
                                },
                                {
                                    "name": "s",
                                    "sum": {
                                        "dataPoints": [point("NaN"), point(2.0)],
                                        "isMonotonic": True,
                                        "aggregationTemporality": 2,
                                    },
                                },
                                {
                                    "name": "h",
                                    "histogram": {
                                        "dataPoints": [
                                            {
                                                "timeUnixNano": str(now),
                                                "count": "1",
                                                "sum": "NaN",
                                                "bucketCounts": ["1"],
                                            },
                                            {
                                                "timeUnixNano": str(now),
                                                "count": "1",
                                                "sum": 1.0,
                                                "bucketCounts": ["0", "1"],
                                                "explicitBounds": ["Infinity"],
                                            },
                                            {
                                                "timeUnixNano": str(now),
                                                "count": "1",
                                                "sum": 1.0,
                                                "bucketCounts": ["1"],
                                                "max": "-Infinity",
                                            },
                                            {"timeUnixNano": str(now), "count": "1", "sum": 1.0, "bucketCounts": ["1"]},
                                        ]
                                    },
                                },
                            ]
                        }
                    ]
                }
            ]
        }
    ).encode()
    decoded = decode_metrics_request(body, content_type=JSON, content_encoding=None)
    assert [g.value for g in decoded.gauges] == [1.0, 3.0]
    assert [s.value for s in decoded.sums] == [2.0]
    assert [h.sum for h in decoded.histograms] == [1.0]
    assert decoded.rejected_data_points == 7
    message = decoded.error_message
    assert "metrics[0].gauge.dataPoints[1]: asDouble is nan, not a finite number" in message
    assert "metrics[0].gauge.dataPoints[3]: asDouble is -inf" in message
    assert "metrics[2].histogram.dataPoints[0]: sum is not a finite number" in message
    assert message.endswith("and 2 more")  # the two other histogram points (bounds, max)


def test_a_type_error_outside_spans_is_located_too() -> None:
    span = {
        "traceId": "5B8EFFF798038103D269B633813FC60C",
        "spanId": "EEE19B7EC3C1B171",
        "name": "s",
        "startTimeUnixNano": "100",
        "endTimeUnixNano": "200",
    }
    # snake_case keys, a resource attribute of the wrong type: the resource is named
    body = json.dumps(
        {
            "resource_spans": [
                {
                    "resource": {"attributes": [{"key": "k", "value": {"intValue": "x"}}]},
                    "scope_spans": [{"spans": [span]}],
                }
            ]
        }
    ).encode()
    with pytest.raises(
        OTLPDecodeError, match=re.escape("resourceSpans[0].resource.attributes.value.intValue: invalid literal")
    ):
        decode_trace_request(body, content_type=JSON, content_encoding=None)
