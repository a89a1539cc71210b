"""OpenTelemetry's own configuration is honoured by ``inferpath.instrument()`` with the SDK's
precedence: explicit argument, then the ``OTEL_*`` variables, then inferpath's defaults
(``INFERPATH_OTLP_ENDPOINT``). Spans go to a real OTLP/HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import inferpath
from inferpath.instrumentation import provider

OTEL_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "INFERPATH_OTLP_ENDPOINT",
)


class Receiver:
    """An OTLP/HTTP receiver on a free loopback port: what arrived, by path."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], ExportTraceServiceRequest]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append(
                    (
                        self.path,
                        {k.lower(): v for k, v in self.headers.items()},
                        ExportTraceServiceRequest.FromString(body),
                    )
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def resource(self) -> dict[str, str]:
        [(_, _, request)] = self.requests
        return {kv.key: kv.value.string_value for kv in request.resource_spans[0].resource.attributes}


@pytest.fixture()
def receivers(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Receiver, Receiver]]:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    provider.shutdown(2.0)
    pair = (Receiver(), Receiver())
    yield pair
    inferpath.uninstrument()
    provider.shutdown(2.0)
    for receiver in pair:
        receiver.server.shutdown()


def one_span() -> None:
    with provider.get_tracer().start_as_current_span("work"):
        pass
    provider.shutdown(5.0)


def test_the_generic_endpoint_gets_v1_traces_and_headers_service_and_resource_come_from_otel(
    receivers, monkeypatch
) -> None:
    otel, inferpaths = receivers
    monkeypatch.setenv("INFERPATH_OTLP_ENDPOINT", inferpaths.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otel.url + "/")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cret,x-team=search")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "checkout")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,service.instance.id=pod-7")
    inferpath.instrument(integrations=False)
    one_span()
    assert inferpaths.requests == []
    [(path, headers, _)] = otel.requests
    assert path == "/v1/traces"  # the generic variable is a base URL: the signal path is appended
    assert (headers["authorization"], headers["x-team"]) == ("Bearer s3cret", "search")
    resource = otel.resource()
    assert (resource["service.name"], resource["deployment.environment"], resource["service.instance.id"]) == (
        "checkout",
        "prod",
        "pod-7",
    )
    assert resource["inferpath.endpoint_class"] == "interactive"


def test_the_traces_endpoint_is_used_as_is_and_wins_over_the_generic_one(receivers, monkeypatch) -> None:
    traces, generic = receivers
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", generic.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces.url + "/otlp/spans")
    inferpath.instrument(service_name="svc", integrations=False)
    one_span()
    assert generic.requests == [] and [path for path, _, _ in traces.requests] == ["/otlp/spans"]
    assert traces.resource()["service.name"] == "svc"  # the explicit argument wins over OTEL_SERVICE_NAME's absence


def test_explicit_arguments_win_over_otel_variables(receivers, monkeypatch) -> None:
    explicit, otel = receivers
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otel.url + "/v1/traces")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=also-env,team=search")
    inferpath.instrument(service_name="from-code", otlp_endpoint=explicit.url, integrations=False)
    one_span()
    assert otel.requests == [] and [path for path, _, _ in explicit.requests] == ["/v1/traces"]
    resource = explicit.resource()
    assert (resource["service.name"], resource["team"]) == ("from-code", "search")
    assert len(resource["service.instance.id"]) == 36  # inferpath's default: a uuid4 per process


def test_without_otel_variables_inferpaths_own_endpoint_is_used(receivers, monkeypatch) -> None:
    inferpaths, _ = receivers
    monkeypatch.setenv("INFERPATH_OTLP_ENDPOINT", inferpaths.url)
    assert provider.traces_endpoint(None) == inferpaths.url + "/v1/traces"
    inferpath.instrument(service_name="svc", integrations=False)
    one_span()
    assert [path for path, _, _ in inferpaths.requests] == ["/v1/traces"]


def test_the_sampler_comes_from_otel_traces_sampler(receivers, monkeypatch) -> None:
    receiver, _ = receivers
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    inferpath.instrument(service_name="svc", integrations=False)
    with provider.get_tracer().start_as_current_span("dropped") as span:
        assert not span.is_recording()
    provider.shutdown(5.0)
    assert receiver.requests == []


@pytest.mark.parametrize("value", ["true", "TRUE"])
def test_otel_sdk_disabled_turns_instrument_into_a_no_op(receivers, monkeypatch, value) -> None:
    receiver, _ = receivers
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_SDK_DISABLED", value)
    inferpath.instrument(service_name="svc")
    assert not provider.is_configured()
    with provider.get_tracer().start_as_current_span("nothing"):
        pass
    assert receiver.requests == []
