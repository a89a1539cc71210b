"""A body of the wrong OTLP signal is refused by name, on a real server on loopback.

The report: OTLP logs posted to ``/v1/traces`` as JSON were answered ``200 {}`` (the JSON
parser ignores the unknown ``resourceLogs`` field and saw an empty trace export) while the
protobuf form of the same body got a clear 400; ``/v1/logs`` was a bare 404.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread

JSON = {"content-type": "application/json"}
PROTOBUF = {"content-type": "application/x-protobuf"}
NOW_NS = time.time_ns()

# An OTLP/JSON logs export as an SDK's logs exporter sends it.
LOGS_EXPORT = {
    "resourceLogs": [
        {
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "gateway"}}]},
            "scopeLogs": [
                {
                    "scope": {"name": "app"},
                    "logRecords": [
                        {
                            "timeUnixNano": str(NOW_NS),
                            "severityNumber": 9,
                            "severityText": "INFO",
                            "body": {"stringValue": "request served"},
                            "traceId": "5b8efff798038103d269b633813fc60c",
                            "spanId": "eee19b7ec3c1b174",
                        }
                    ],
                }
            ],
        }
    ]
}
TRACES_EXPORT = {
    "resourceSpans": [
        {
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "gateway"}}]},
            "scopeSpans": [
                {
                    "spans": [
                        {
                            "traceId": "5b8efff798038103d269b633813fc60c",
                            "spanId": "eee19b7ec3c1b174",
                            "name": "POST /v1/chat/completions",
                            "kind": 2,
                            "startTimeUnixNano": str(NOW_NS),
                            "endTimeUnixNano": str(NOW_NS + 10**6),
                        }
                    ]
                }
            ],
        }
    ]
}


@pytest.fixture
def server(store_url: str):
    with serve_in_thread(Settings(store_url=store_url), port=0) as running:
        with httpx.Client(base_url=running.url, timeout=30.0) as http:
            yield running, http


def _status(response: httpx.Response) -> status_pb2.Status:
    if response.headers["content-type"].startswith("application/json"):
        return json_format.ParseDict(response.json(), status_pb2.Status())
    return status_pb2.Status.FromString(response.content)


def test_a_json_logs_export_to_the_traces_path_is_a_400_naming_it(server) -> None:
    running, http = server
    response = http.post("/v1/traces", content=json.dumps(LOGS_EXPORT), headers=JSON)
    assert response.status_code == 400
    message = _status(response).message
    assert "not an ExportTraceServiceRequest" in message and "'resourceLogs'" in message
    assert "an OTLP logs export, which belongs at /v1/logs" in message
    # The protobuf form of the same body was refused already; both answer 400 now.
    body = json_format.ParseDict(
        json.loads(
            json.dumps(LOGS_EXPORT)
            .replace("5b8efff798038103d269b633813fc60c", "W47/95gDgQPSabYzgT/GDA==")
            .replace("eee19b7ec3c1b174", "7uGbfsPBsXQ=")
        ),
        ExportLogsServiceRequest(),
    )
    assert http.post("/v1/traces", content=body.SerializeToString(), headers=PROTOBUF).status_code == 400
    assert http.post("/api/v1/flush", timeout=120).json()["ok"]
    assert running.runtime.store.query("SELECT count() FROM otel_traces") == [(0,)]


def test_a_json_body_without_resource_spans_is_a_400_and_an_empty_one_is_accepted(server) -> None:
    _, http = server
    response = http.post("/v1/traces", content=json.dumps({"spans": [{"name": "x"}], "service": "gw"}), headers=JSON)
    assert response.status_code == 400
    assert "no resourceSpans at the top level, found 'service', 'spans'" in _status(response).message
    assert http.post("/v1/traces", content=b"{}", headers=JSON).status_code == 200  # a valid empty export
    assert http.post("/v1/metrics", content=b"{}", headers=JSON).status_code == 200
    extra = dict(TRACES_EXPORT, futureField=1)  # unknown fields beside resourceSpans stay ignored
    assert http.post("/v1/traces", content=json.dumps(extra), headers=JSON).status_code == 200


def test_a_body_that_is_not_metrics_to_the_metrics_path_is_a_400(server) -> None:
    _, http = server
    for export, signal, path in ((TRACES_EXPORT, "traces", "/v1/traces"), (LOGS_EXPORT, "logs", "/v1/logs")):
        response = http.post("/v1/metrics", content=json.dumps(export), headers=JSON)
        assert response.status_code == 400
        message = _status(response).message
        assert "not an ExportMetricsServiceRequest: no resourceMetrics" in message
        assert f"an OTLP {signal} export, which belongs at {path}" in message


@pytest.mark.parametrize("headers", [JSON, PROTOBUF])
def test_logs_are_answered_not_accepted_with_a_status_body(server, headers: dict) -> None:
    _, http = server
    body = json.dumps(LOGS_EXPORT).encode() if headers is JSON else b"\x0a\x00"
    response = http.post("/v1/logs", content=body, headers=headers)
    assert response.status_code == 501  # gRPC UNIMPLEMENTED: not retried by OTLP exporters
    assert response.headers["content-type"] == headers["content-type"]
    status = _status(response)
    assert status.code == 12
    assert status.message.startswith("inferpath does not accept OTLP logs")
    assert "/v1/traces" in status.message and "/v1/metrics" in status.message
