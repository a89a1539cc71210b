"""The lean gateway span exports what the SDK's own span exports for the same calls.

Each scenario runs twice on the same configured provider, once on ``start_server_span``'s
lean span and once on ``Tracer.start_span``'s SDK span, and every exported field but the
random ids is compared.
"""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from inferpath.instrumentation import provider
from inferpath.instrumentation.server_span import LeanServerSpan, lean_parts, start_server_span
from inferpath.instrumentation.traceparent import parent_context

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
START_NS = 1_700_000_000_000_000_000
START_ATTRIBUTES = {"inferpath.stage": "gateway", "http.request.method": "POST",
                    "url.path": "/v1/chat/completions", "url.scheme": "http"}


def remote_parent(flags: str = "01", state: bytes | None = b"congo=t61rcWkgMzE"):
    headers = [(b"traceparent", f"00-{TRACE_ID}-{PARENT_ID}-{flags}".encode())]
    if state is not None:
        headers.append((b"tracestate", state))
    return parent_context(headers)


def plain(span) -> None:
    span.set_attributes({"http.response.status_code": 200, "http.route": "/v1/chat/completions"})
    span.update_name("POST /v1/chat/completions")


def odd_values(span) -> None:
    span.set_attribute("list", [1, 2, 3])
    span.set_attribute("strings", ("a", "b"))
    span.set_attribute("none", None)
    span.set_attribute("object", object())
    span.set_attributes({"nested": {"k": "v"}, "ratio": 0.5, "flag": True, "raw": b"\x01"})
    span.set_attribute("", "empty key is dropped")


def statuses(span) -> None:
    span.set_status(StatusCode.UNSET)
    span.set_status(Status(StatusCode.ERROR, "first"))
    span.set_status(StatusCode.ERROR, "second")
    span.set_status(Status(StatusCode.OK))
    span.set_status(Status(StatusCode.ERROR, "ignored after OK"))


def events_and_links(span) -> None:
    span.add_event("queued", {"depth": 3}, timestamp=START_NS + 5)
    try:
        raise ValueError("bad input")
    except ValueError as error:
        span.record_exception(error, {"extra": "x"}, timestamp=START_NS + 6, escaped=True)
    link_context = trace.get_current_span(remote_parent()).get_span_context()
    span.add_link(link_context, {"why": "batch"})
    span.add_link(trace.INVALID_SPAN_CONTEXT)  # dropped: invalid and empty


def after_end_is_ignored(span) -> None:
    span.set_attribute("before", 1)


def exported_view(span):
    """Every exported field except the random ids."""
    context = span.context
    return {
        "name": span.name, "kind": span.kind, "start": span.start_time, "end": span.end_time,
        "parent": None if span.parent is None else (span.parent.trace_id, span.parent.span_id,
                                                    span.parent.is_remote),
        "trace_from_parent": span.parent is not None and context.trace_id == span.parent.trace_id,
        "flags": int(context.trace_flags), "state": context.trace_state.to_header(),
        "remote": context.is_remote,
        "attributes": dict(span.attributes), "dropped_attributes": span.dropped_attributes,
        "events": [(e.name, dict(e.attributes), e.timestamp) for e in span.events],
        "links": [(link.context.span_id, dict(link.attributes)) for link in span.links],
        "status": (span.status.status_code, span.status.description),
        "resource": dict(span.resource.attributes),
        "scope": (span.instrumentation_scope.name, span.instrumentation_scope.version),
    }


def run_both(spans, scenario, parent):
    tracer = provider.get_tracer()
    views = []
    for lean in (True, False):
        spans.exporter.clear()
        if lean:
            span = start_server_span(tracer, "POST", parent, START_ATTRIBUTES, START_NS)
            assert isinstance(span, LeanServerSpan)
        else:
            span = tracer.start_span("POST", context=parent, kind=SpanKind.SERVER,
                                     attributes=START_ATTRIBUTES, start_time=START_NS)
            assert not isinstance(span, LeanServerSpan)
        scenario(span)
        span.end(end_time=START_NS + 1_000)
        span.set_attribute("after", "end")  # ignored by both, with a warning
        span.end(end_time=START_NS + 2_000)  # ignored by both
        [exported] = spans.finished(wait_for=1)
        views.append(exported_view(exported))
    return views


@pytest.mark.parametrize("scenario", [plain, odd_values, statuses, events_and_links,
                                      after_end_is_ignored])
@pytest.mark.parametrize("with_parent", [False, True])
def test_lean_span_exports_what_the_sdk_span_exports(spans, scenario, with_parent) -> None:
    lean, sdk = run_both(spans, scenario, remote_parent() if with_parent else None)
    assert lean == sdk
    assert lean["parent"] == ((int(TRACE_ID, 16), int(PARENT_ID, 16), True) if with_parent
                              else None)


class _Sink:
    """The exported spans of one provider, after a flush."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    def finished(self, wait_for: int = 0):
        provider.force_flush(2.0)
        return list(self.exporter.get_finished_spans())


def test_lean_span_honours_the_configured_span_limits(monkeypatch) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "3")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4")
    monkeypatch.setenv("OTEL_SPAN_EVENT_COUNT_LIMIT", "1")
    exporter = InMemorySpanExporter()
    provider.configure("limits-tests", span_exporter=exporter, schedule_delay_seconds=0.05)
    try:
        def many(span) -> None:
            span.set_attributes({"a": "long value", "b": 2, "c": 3, "d": 4})
            span.add_event("one", timestamp=START_NS + 1)
            span.add_event("two", timestamp=START_NS + 2)

        lean, sdk = run_both(_Sink(exporter), many, None)
        assert lean == sdk
        assert len(lean["attributes"]) == 3 and lean["dropped_attributes"] > 0
        assert [event[0] for event in lean["events"]] == ["two"]
    finally:
        provider.shutdown(2.0)


def test_an_unsampled_parent_gives_no_recording_span_on_either_path(spans) -> None:
    tracer = provider.get_tracer()
    parent = remote_parent(flags="00", state=None)
    lean = start_server_span(tracer, "GET", parent, START_ATTRIBUTES, START_NS)
    sdk = tracer.start_span("GET", context=parent, kind=SpanKind.SERVER,
                            attributes=START_ATTRIBUTES, start_time=START_NS)
    for span in (lean, sdk):
        assert not span.is_recording()
        assert span.get_span_context().trace_id == int(TRACE_ID, 16)
        assert int(span.get_span_context().trace_flags) == int(sdk.get_span_context().trace_flags)
        span.end()
    assert spans.finished() == []


def test_an_added_span_processor_switches_to_the_sdk_span(spans) -> None:
    tracer = provider.get_tracer()
    assert lean_parts(tracer) is not None
    extra = InMemorySpanExporter()
    provider.current_provider().add_span_processor(SimpleSpanProcessor(extra))
    assert lean_parts(tracer) is None  # its on_start would not see a lean span
    span = start_server_span(tracer, "GET", None, START_ATTRIBUTES, START_NS)
    assert not isinstance(span, LeanServerSpan)
    span.end()
    assert [s.name for s in extra.get_finished_spans()] == ["GET"]
    assert [s.name for s in spans.finished(wait_for=1)] == ["GET"]


def test_a_tracer_that_is_not_the_sdks_makes_its_own_span() -> None:
    tracer = trace.NoOpTracerProvider().get_tracer("not-the-sdk")
    assert lean_parts(tracer) is None
    span = start_server_span(tracer, "GET", None, START_ATTRIBUTES, START_NS)
    assert not isinstance(span, LeanServerSpan) and not span.is_recording()
    span.end()


def test_the_lean_span_is_the_current_span_for_user_code(spans) -> None:
    from opentelemetry import context as otel_context

    span = start_server_span(provider.get_tracer(), "GET", None, START_ATTRIBUTES, START_NS)
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        trace.get_current_span().set_attribute("user.tenant", "acme")
        with provider.get_tracer().start_as_current_span("child") as child:
            assert child.parent.span_id == span.get_span_context().span_id
    finally:
        otel_context.detach(token)
    span.end()
    finished = {s.name: s for s in spans.finished(wait_for=2)}
    assert finished["GET"].attributes["user.tenant"] == "acme"
    assert finished["child"].context.trace_id == finished["GET"].context.trace_id
