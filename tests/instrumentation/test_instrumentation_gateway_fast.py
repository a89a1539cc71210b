"""The gateway span's cheap paths: the traceparent reader against the SDK propagator, the
per-route name cache, and the attributes written at span end, on real FastAPI apps served
by uvicorn on 127.0.0.1."""

from __future__ import annotations

import random

import httpx
import pytest
from fastapi import FastAPI, HTTPException
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from starlette.routing import Route

import inferpath
from inferpath.instrumentation import asgi, provider
from inferpath.instrumentation.traceparent import parent_context

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def propagator_view(headers: list[tuple[bytes, bytes]]):
    """What the SDK's TraceContext propagator makes of the same headers (None: no parent)."""
    carrier: dict[str, object] = {}
    states = [v.decode("latin-1") for n, v in headers if n.lower() == b"tracestate"]
    for name, value in headers:
        if name.lower() == b"traceparent":
            carrier["traceparent"] = value.decode("latin-1")
    if states:
        carrier["tracestate"] = states
    context = trace.get_current_span(provider.PROPAGATOR.extract(carrier)).get_span_context()
    return context if context.is_valid else None


def our_view(headers: list[tuple[bytes, bytes]]):
    context = parent_context(headers)
    return None if context is None else trace.get_current_span(context).get_span_context()


def same(ours, reference) -> bool:
    if ours is None or reference is None:
        return ours is None and reference is None
    return (ours.trace_id, ours.span_id, ours.is_remote, int(ours.trace_flags), ours.trace_state.to_header()) == (
        reference.trace_id,
        reference.span_id,
        reference.is_remote,
        int(reference.trace_flags),
        reference.trace_state.to_header(),
    )


EDGE_TRACEPARENTS = [
    f"00-{TRACE_ID}-{PARENT_ID}-01",
    f"00-{TRACE_ID}-{PARENT_ID}-00",
    f"00-{TRACE_ID.upper()}-{PARENT_ID}-01",  # upper-case hex is invalid
    f"00-{'0' * 32}-{PARENT_ID}-01",
    f"00-{TRACE_ID}-{'0' * 16}-01",
    f"ff-{TRACE_ID}-{PARENT_ID}-01",
    f"01-{TRACE_ID}-{PARENT_ID}-01",
    f"01-{TRACE_ID}-{PARENT_ID}-01-future-fields",
    f"00-{TRACE_ID}-{PARENT_ID}-01-extra",  # version 00 allows nothing after the flags
    f"  00-{TRACE_ID}-{PARENT_ID}-01\t",
    f"00-{TRACE_ID}-{PARENT_ID}-1",
    f"00-{TRACE_ID[:-1]}-{PARENT_ID}-01",
    f"00_{TRACE_ID}_{PARENT_ID}_01",
    f"00-{TRACE_ID}-{PARENT_ID}-0x",
    f"00-{TRACE_ID}-{PARENT_ID}-01" + " " * 600,
    "",
    "garbage",
]
EDGE_TRACESTATES = [
    None,
    ["congo=t61rcWkgMzE"],
    ["rojo=00f067aa0ba902b7", "congo=t61rcWkgMzE"],
    ["not a valid = entry"],
    ["a=" + "x" * 600],
]


@pytest.mark.parametrize("traceparent", EDGE_TRACEPARENTS)
@pytest.mark.parametrize("tracestate", EDGE_TRACESTATES)
def test_traceparent_reader_agrees_with_the_sdk_propagator(traceparent, tracestate) -> None:
    headers = [(b"host", b"gateway"), (b"traceparent", traceparent.encode("latin-1"))]
    headers += [(b"tracestate", state.encode()) for state in tracestate or ()]
    assert same(our_view(headers), propagator_view(headers))


@settings(max_examples=300, deadline=None)
@given(
    version=st.sampled_from(["00", "01", "ff", "0g", "a0"]),
    trace_id=st.one_of(
        st.integers(0, 2**128 - 1).map(lambda i: f"{i:032x}"),
        st.text("0123456789abcdefABCDEF-x ", min_size=30, max_size=34),
    ),
    span_id=st.one_of(
        st.integers(0, 2**64 - 1).map(lambda i: f"{i:016x}"),
        st.text("0123456789abcdefABCDEF", min_size=15, max_size=17),
    ),
    flags=st.one_of(st.integers(0, 255).map(lambda i: f"{i:02x}"), st.text(max_size=3)),
    suffix=st.sampled_from(["", "-", "-x", " ", "\t", "\n"]),
    name=st.sampled_from([b"traceparent", b"Traceparent", b"TRACEPARENT"]),
)
def test_traceparent_reader_agrees_on_generated_headers(version, trace_id, span_id, flags, suffix, name) -> None:
    value = f"{version}-{trace_id}-{span_id}-{flags}{suffix}".encode()
    headers = [(b"accept", b"*/*"), (name, value)]
    assert same(our_view(headers), propagator_view(headers))


def test_no_traceparent_or_several_mean_no_parent() -> None:
    assert parent_context([(b"host", b"x"), (b"tracestate", b"a=b")]) is None
    assert parent_context([]) is None
    # W3C test suite, "traceparent duplicated": the joined value is invalid, a new trace.
    other = f"00-{'1' * 32}-{'2' * 16}-01".encode()
    headers = [(b"traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01".encode()), (b"Traceparent", other)]
    assert parent_context(headers) is None
    assert parent_context(headers[:1]) is not None


def test_route_names_are_cached_per_route_method_and_mount_point() -> None:
    middleware = asgi.InferpathASGIMiddleware(app=None)
    items = Route("/items/{item_id}", endpoint=lambda request: None)
    users = Route("/users/{name}", endpoint=lambda request: None)
    assert middleware.route_names("GET", items, "") == ("GET /items/{item_id}", "/items/{item_id}")
    assert middleware.route_names("POST", items, "") == ("POST /items/{item_id}", "/items/{item_id}")
    assert middleware.route_names("GET", items, "/api") == ("GET /api/items/{item_id}", "/api/items/{item_id}")
    assert middleware.route_names("GET", users, "") == ("GET /users/{name}", "/users/{name}")
    assert len(middleware._route_names) == 4
    # An entry whose route object is not this route (a recycled id) is never used.
    middleware._route_names[(id(users), "DELETE", "")] = (items, "DELETE /items/{item_id}", "/items/{item_id}")
    assert middleware.route_names("DELETE", users, "") == ("DELETE /users/{name}", "/users/{name}")


def test_route_name_cache_stays_bounded() -> None:
    middleware = asgi.InferpathASGIMiddleware(app=None)
    routes = [Route(f"/r{index}", endpoint=lambda request: None) for index in range(asgi.ROUTE_CACHE_SIZE + 10)]
    for route in routes:
        middleware.route_names("GET", route, "")
    assert 0 < len(middleware._route_names) <= asgi.ROUTE_CACHE_SIZE
    assert middleware.route_names("GET", routes[0], "") == ("GET /r0", "/r0")


def build_app() -> FastAPI:
    app = FastAPI()
    api = FastAPI()

    @api.get("/items/{item_id}")
    async def item(item_id: int) -> dict:
        return {"id": item_id}

    @app.get("/unavailable")
    async def unavailable() -> dict:
        raise HTTPException(status_code=503, detail="draining")

    @app.get("/boom/{code}")
    async def boom(code: int) -> dict:
        raise ValueError(f"bad code {code}")

    app.mount("/api", api)
    return app


@pytest.fixture()
def served(spans, serve_app):
    app = build_app()
    inferpath.instrument(app, service_name="gateway-fast-test", span_exporter=spans.exporter)
    with serve_app(app) as base_url:
        yield base_url, spans
    inferpath.uninstrument(app)


def only_server_span(spans):
    # Exactly one SERVER span per hop: a mounted FastAPI sub-app must not add its own.
    [server] = [s for s in spans.finished(wait_for=1) if s.kind is SpanKind.SERVER]
    return server


def test_span_of_a_mounted_route_carries_every_contract_attribute_and_the_parent(served) -> None:
    base_url, spans = served
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": "congo=t61rcWkgMzE"}
    assert httpx.get(f"{base_url}/api/items/7", headers=headers, timeout=10).json() == {"id": 7}
    server = only_server_span(spans)
    assert server.name == "GET /api/items/{item_id}"
    assert server.parent is not None and server.parent.span_id == int(PARENT_ID, 16)
    assert server.parent.is_remote
    assert server.context.trace_id == int(TRACE_ID, 16)
    assert server.context.trace_state.get("congo") == "t61rcWkgMzE"
    assert dict(server.attributes) == {
        "inferpath.stage": "gateway",
        "inferpath.endpoint_class": "interactive",
        "http.request.method": "GET",
        "url.path": "/api/items/7",
        "url.scheme": "http",
        "http.response.status_code": 200,
        "http.route": "/api/items/{item_id}",
        "inferpath.endpoint": "/api/items/{item_id}",
    }
    assert server.status.status_code is StatusCode.UNSET
    assert server.end_time > server.start_time


def test_a_5xx_answer_marks_the_span_error_with_the_status_as_error_type(served) -> None:
    base_url, spans = served
    assert httpx.get(f"{base_url}/unavailable", timeout=10).status_code == 503
    server = only_server_span(spans)
    assert server.name == "GET /unavailable"
    assert server.status.status_code is StatusCode.ERROR
    assert server.attributes["http.response.status_code"] == 503
    assert server.attributes["error.type"] == "503"


def test_an_exception_before_the_response_keeps_the_route_and_records_the_error(served) -> None:
    base_url, spans = served
    assert httpx.get(f"{base_url}/boom/3", timeout=10).status_code == 500
    server = only_server_span(spans)
    # The route is read when the span ends, so a request that failed still names it.
    assert server.name == "GET /boom/{code}"
    assert server.attributes["http.route"] == "/boom/{code}"
    assert server.attributes["http.response.status_code"] == 500
    assert server.attributes["error.type"] == "ValueError"
    assert server.status.status_code is StatusCode.ERROR
    assert [event.name for event in server.events] == ["exception"]


def test_many_requests_with_random_parents_leave_no_span_open(served) -> None:
    base_url, spans = served
    rng = random.Random(7)
    parents = [(f"{rng.getrandbits(128) or 1:032x}", f"{rng.getrandbits(64) or 1:016x}") for _ in range(40)]
    with httpx.Client(base_url=base_url, timeout=10) as client:
        for trace_id, span_id in parents:
            response = client.get("/api/items/1", headers={"traceparent": f"00-{trace_id}-{span_id}-01"})
            assert response.status_code == 200
    servers = [s for s in spans.finished(wait_for=40) if s.kind is SpanKind.SERVER]
    assert sorted((f"{s.context.trace_id:032x}", f"{s.parent.span_id:016x}") for s in servers) == sorted(parents)
    assert asgi.open_requests() == 0
