"""Pure-ASGI middleware: one SERVER span per HTTP request, streaming included.

The span (``{method} {route}``, ``inferpath.stage=gateway``) is the child of the caller's
W3C ``traceparent`` and stays open until the last body message has been handed to the
server, so a streamed response is covered whole. When the response is
``text/event-stream`` the outgoing bytes are read as SSE, without copying or delaying them,
to set the server-side TTFT, mean ITL, chunk and token counts (definitions in
``streaming.py``). No span is made per chunk.

On the ASGI ``lifespan`` shutdown the queued spans are flushed (at most
:data:`SHUTDOWN_FLUSH_SECONDS`) before the server is told the shutdown is complete.

If the client disconnects or the request task is cancelled, the span ends with
``inferpath.stream.status=incomplete`` and ``inferpath.stream.incomplete_reason``.
Exceptions of the application are recorded and re-raised unchanged; telemetry errors are
logged and swallowed.

Clocks: the span's start is the wall clock at entry; its end is start + the monotonic time
elapsed, so the span duration equals the E2E measured on the monotonic clock.

Cost (``bench/bench_gateway.py``): the span is the SDK's own (``Tracer.start_span``). Around
it the middleware reads only the ``traceparent``/``tracestate`` headers
(``traceparent.py``), gives the span its sampler-relevant attributes at start and the rest
in one ``set_attributes`` at the end, looks the span name up in a per-route cache, and
wraps ``receive``/``send`` once per request (no per-message allocation besides the awaited
call). A body message of a non-SSE response is forwarded untouched.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.http import get_excluded_urls

from inferpath.instrumentation import provider
from inferpath.instrumentation import semconv as sc
from inferpath.instrumentation.streaming import ChatStreamMeter
from inferpath.instrumentation.traceparent import parent_context

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["InferpathASGIMiddleware", "open_requests"]

_logger = logging.getLogger(__name__)
#: Bound on the span flush done when the ASGI server shuts the application down.
SHUTDOWN_FLUSH_SECONDS = 2.0
# Probes and scrapes are not requests of the service: tracing them would add a "request" row
# per health check. Other routes (an admin API) are excluded as OTel's own instrumentations
# exclude them: OTEL_PYTHON_FASTAPI_EXCLUDED_URLS, else OTEL_PYTHON_EXCLUDED_URLS.
DEFAULT_EXCLUDED_PATHS = frozenset({"/health", "/healthz", "/ready", "/readyz", "/livez", "/metrics"})


_FASTAPI_TELEMETRY_KEY = "fastapi.telemetry"

# Started/ended request spans; itertools counters need no lock (atomic under the GIL).
_started = itertools.count()
_ended = itertools.count()


def open_requests() -> int:
    """Request spans started by the middleware and not yet ended (0 when idle); for leak
    checks after disconnects and cancellations."""
    return int(repr(_started)[6:-1]) - int(repr(_ended)[6:-1])


#: Entries of a middleware's route-name cache before it is cleared (a bound for apps that
#: create routes at run time; a normal app has a few dozen (method, route) pairs).
ROUTE_CACHE_SIZE = 1024


def _route_template(route: Any, root_path: str) -> str | None:
    """The route template (``/v1/chat/completions``, ``/items/{id}``) of a matched route.

    Starlette's router writes the matched route into the request scope before calling the
    endpoint; the ASGI middleware shares that dict, so it is readable when the span ends.
    """
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    if not isinstance(template, str):
        return None
    if root_path and not template.startswith(root_path):
        # A mounted sub-application sees routes relative to its mount point.
        template = root_path.rstrip("/") + template
    return template


class _ServerRequest:
    """Telemetry state of one HTTP request; every method swallows telemetry errors.

    The span gets the attributes a sampler may look at (stage, method, path, scheme,
    endpoint class) when it starts and everything learnt later (status, route, endpoint,
    stream measures, error) in one ``set_attributes`` call when it ends: one lock and one
    validation pass instead of one per attribute.
    """

    __slots__ = (
        "span",
        "token",
        "start_wall_ns",
        "start_perf_ns",
        "method",
        "status_code",
        "meter",
        "ended",
        "disconnected",
        "middleware",
        "scope",
    )

    def __init__(self, middleware: InferpathASGIMiddleware, scope: Scope) -> None:
        # Wall clock for the span's timestamps, monotonic for its duration (module docstring).
        self.start_perf_ns = time.perf_counter_ns()
        self.start_wall_ns = start_wall_ns = time.time_ns()
        self.scope = scope
        self.middleware = middleware
        method = scope.get("method") or "GET"
        if not isinstance(method, str) or not method.isupper():
            method = str(method).upper()
        self.method = method
        self.status_code: int | None = None
        self.meter: ChatStreamMeter | None = None
        self.ended = False
        self.disconnected = False
        # Only the two propagation headers are read; nothing else of the request is decoded.
        parent = parent_context(scope.get("headers") or ())
        attributes = dict(middleware.start_attributes())
        attributes[sc.HTTP_REQUEST_METHOD] = method
        attributes[sc.URL_PATH] = str(scope.get("path") or "")
        attributes[sc.URL_SCHEME] = str(scope.get("scheme") or "http")
        self.span: Span = provider.get_tracer().start_span(
            method, context=parent, kind=SpanKind.SERVER, attributes=attributes, start_time=start_wall_ns
        )
        self.token = otel_context.attach(trace.set_span_in_context(self.span, parent))
        next(_started)

    def on_response_start(self, message: Message) -> None:
        self.status_code = int(message.get("status", 200))
        for name, value in message.get("headers") or ():
            if name.lower() == b"content-type":
                if value.lower().startswith(b"text/event-stream"):
                    # The gateway only measures what it sends: no chunk is decoded for a caller.
                    self.meter = ChatStreamMeter(start_ns=self.start_perf_ns, decode_chunks=False)
                break

    def end(self, stream_status: str | None, reason: str | None, error: BaseException | None = None) -> None:
        """End the span once: stream attributes, status, error; ``stream_status`` None
        means a complete non-streamed response."""
        if self.ended:
            return
        self.ended = True
        next(_ended)
        now_ns = time.perf_counter_ns()
        try:
            span = self.span
            attributes: dict[str, Any] = {}
            status_code = self.status_code
            if status_code is not None:
                attributes[sc.HTTP_RESPONSE_STATUS_CODE] = status_code
            route = self.scope.get("route")
            if route is not None:
                names = self.middleware.route_names(self.method, route, self.scope.get("root_path") or "")
                if names is not None:
                    span.update_name(names[0])
                    attributes[sc.HTTP_ROUTE] = names[1]
            endpoint = self.middleware.endpoint or attributes.get(sc.HTTP_ROUTE)
            if endpoint is not None:
                attributes[sc.ENDPOINT] = endpoint
            meter = self.meter
            if meter is not None:
                meter.close(now_ns)
                meter.timeline.finish(now_ns)
                if stream_status is None:
                    stream_status, reason = sc.finished_stream_status(meter, only_if_chat=True)
                attributes.update(sc.stream_result_attributes(meter, stream_status, reason))
            elif stream_status is not None:
                attributes[sc.STREAM_STATUS] = stream_status
                if reason is not None:
                    attributes[sc.STREAM_INCOMPLETE_REASON] = reason
            app_error = error is not None and isinstance(error, Exception) and not _is_disconnect(error)
            if status_code is None and error is not None and not _is_disconnect(error):
                attributes[sc.HTTP_RESPONSE_STATUS_CODE] = 500
            if app_error:
                attributes[sc.ERROR_TYPE] = type(error).__qualname__
            elif status_code is not None and status_code >= 500:
                attributes[sc.ERROR_TYPE] = str(status_code)
            span.set_attributes(attributes)
            if app_error and error is not None:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            elif status_code is not None and status_code >= 500:
                span.set_status(Status(StatusCode.ERROR))
            span.end(end_time=self.start_wall_ns + (now_ns - self.start_perf_ns))
        except Exception:
            _logger.warning("inferpath: could not end the request span", exc_info=True)

    def detach(self) -> None:
        try:
            otel_context.detach(self.token)
        except Exception:  # pragma: no cover - context mismatch, never fatal
            pass


def _is_disconnect(error: BaseException) -> bool:
    # Starlette raises ClientDisconnect (ASGI spec >= 2.4 servers surface OSError on send).
    return isinstance(error, OSError) or type(error).__name__ == "ClientDisconnect"


class InferpathASGIMiddleware:
    """ASGI middleware that traces each ``http`` request as one SERVER span.

    ``endpoint_class`` overrides the provider's endpoint class on the span;
    ``endpoint`` fixes ``inferpath.endpoint`` (default: the matched route template).
    ``excluded_paths`` (exact request paths, default :data:`DEFAULT_EXCLUDED_PATHS`) are
    served untraced, and so are paths that a pattern of OpenTelemetry's
    ``OTEL_PYTHON_FASTAPI_EXCLUDED_URLS`` (else ``OTEL_PYTHON_EXCLUDED_URLS``: comma-separated
    regular expressions, read when the middleware is built) finds in the request path.
    ``websocket`` and ``lifespan`` scopes pass through untouched.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        endpoint_class: str | None = None,
        endpoint: str | None = None,
        excluded_paths: frozenset[str] = DEFAULT_EXCLUDED_PATHS,
    ) -> None:
        self.app = app
        self.endpoint_class = endpoint_class
        self.endpoint = endpoint
        self.excluded_paths = frozenset(excluded_paths)
        self._excluded_urls = get_excluded_urls("FASTAPI")
        self._start_attributes: tuple[str | None, dict[str, Any]] = (None, {})
        self._route_names: dict[tuple[int, str, str], tuple[Any, str, str]] = {}

    def start_attributes(self) -> dict[str, Any]:
        """The request-independent attributes every span of this middleware starts with
        (``inferpath.stage``, ``inferpath.endpoint_class``); built again only when the
        configured endpoint class changes. Callers copy it before adding to it."""
        endpoint_class = self.endpoint_class or provider.current_endpoint_class()
        cached_class, attributes = self._start_attributes
        if cached_class != endpoint_class or not attributes:
            attributes = {sc.STAGE: "gateway"}
            if endpoint_class:
                attributes[sc.ENDPOINT_CLASS] = endpoint_class
            self._start_attributes = (endpoint_class, attributes)
        return attributes

    def route_names(self, method: str, route: Any, root_path: str) -> tuple[str, str] | None:
        """``("{method} {template}", template)`` for a matched route, or ``None`` when the
        route has no string template. Cached per (route, method, root path): the key holds
        the route's ``id`` (Starlette routes are unhashable) and the entry the route itself,
        so a recycled id is never mistaken for another route."""
        key = (id(route), method, root_path)
        entry = self._route_names.get(key)
        if entry is not None and entry[0] is route:
            return entry[1], entry[2]
        template = _route_template(route, root_path)
        if template is None:
            return None
        if len(self._route_names) >= ROUTE_CACHE_SIZE:
            self._route_names.clear()
        self._route_names[key] = (route, f"{method} {template}", template)
        return f"{method} {template}", template

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope_type = scope.get("type")
        if scope_type != "http":
            if scope_type == "lifespan":
                send = self._flushing_on_shutdown(send)
            await self.app(scope, receive, send)
            return
        path = scope.get("path") or ""
        if path in self.excluded_paths or self._excluded_urls.url_disabled(path):
            await self.app(scope, receive, send)
            return
        if _FASTAPI_TELEMETRY_KEY not in scope:
            # A FastAPI app mounted inside this one would otherwise trace the request
            # natively: a second SERVER span for one hop. FastAPI skips its native
            # telemetry when an outer app already claimed the request with this key (the
            # value it uses for excluded requests is None).
            scope[_FASTAPI_TELEMETRY_KEY] = None
        try:
            request = _ServerRequest(self, scope)
        except Exception:
            _logger.warning("inferpath: could not start the request span", exc_info=True)
            await self.app(scope, receive, send)
            return

        async def receive_traced() -> Message:
            message = await receive()
            if message.get("type") == "http.disconnect":
                request.disconnected = True
            return message

        async def send_traced(message: Message) -> None:
            kind = message.get("type")
            if kind == "http.response.body":
                # Body messages first: a streamed response sends hundreds of them.
                meter = request.meter
                if meter is not None:
                    body = message.get("body")
                    if body:
                        try:
                            # Timestamp when the app hands the chunk over: the server-side view.
                            meter.feed(body, time.perf_counter_ns())
                        except Exception:
                            _logger.warning("inferpath: SSE chunk not measured", exc_info=True)
                await send(message)
                if not message.get("more_body", False):
                    request.end(None, None)
                return
            if kind == "http.response.start":
                try:
                    request.on_response_start(message)
                except Exception:
                    _logger.warning("inferpath: response start not recorded", exc_info=True)
                await send(message)
                return
            await send(message)
            if kind == "http.response.pathsend":
                # The server sends a whole file for us: the response ends with this message.
                request.end(None, None)

        try:
            await self.app(scope, receive_traced, send_traced)
        except asyncio.CancelledError as error:
            request.end(sc.STATUS_INCOMPLETE, sc.REASON_CANCELLED, error)
            raise
        except BaseException as error:
            if _is_disconnect(error):
                request.end(sc.STATUS_INCOMPLETE, sc.REASON_CLIENT_DISCONNECT, error)
            elif request.meter is not None:
                request.end(sc.STATUS_INCOMPLETE, sc.REASON_ERROR, error)
            else:
                request.end(None, None, error)
            raise
        else:
            if not request.ended:
                reason = sc.REASON_CLIENT_DISCONNECT if request.disconnected else sc.REASON_RESPONSE_NOT_FINISHED
                request.end(sc.STATUS_INCOMPLETE, reason)
        finally:
            request.detach()

    @staticmethod
    def _flushing_on_shutdown(send: Send) -> Send:
        """Wrap the lifespan ``send`` so the queued spans are exported (bounded by
        :data:`SHUTDOWN_FLUSH_SECONDS`) before the server is told shutdown is complete:
        servers such as uvicorn re-raise SIGTERM after a graceful shutdown, so the process
        may end without running ``atexit`` hooks."""

        async def send_lifespan(message: Message) -> None:
            if message.get("type") in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                try:
                    loop = asyncio.get_running_loop()
                    await loop.run_in_executor(None, provider.force_flush, SHUTDOWN_FLUSH_SECONDS)
                except Exception:
                    _logger.warning("inferpath: span flush at shutdown failed", exc_info=True)
            await send(message)

        return send_lifespan
