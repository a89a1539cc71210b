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
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, Awaitable, Callable, MutableMapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from inferpath.instrumentation import provider
from inferpath.instrumentation import semconv as sc
from inferpath.instrumentation.streaming import ChatStreamMeter

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["InferpathASGIMiddleware", "open_requests"]

_logger = logging.getLogger(__name__)
_PROPAGATION_HEADERS = (b"traceparent", b"tracestate")
# Probes and scrapes are not requests of the service: tracing them would add a "request" row
# per health check (as OTel's own instrumentations allow via excluded URLs).
#: Bound on the span flush done when the ASGI server shuts the application down.
SHUTDOWN_FLUSH_SECONDS = 2.0
DEFAULT_EXCLUDED_PATHS = frozenset({"/health", "/healthz", "/ready", "/readyz", "/livez", "/metrics"})


# Started/ended request spans; itertools counters need no lock (atomic under the GIL).
_started = itertools.count()
_ended = itertools.count()


def open_requests() -> int:
    """Request spans started by the middleware and not yet ended (0 when idle); for leak
    checks after disconnects and cancellations."""
    return int(repr(_started)[6:-1]) - int(repr(_ended)[6:-1])


def _route_of(scope: Scope) -> str | None:
    """The matched route template (``/v1/chat/completions``, ``/items/{id}``), if routed.

    Starlette's router writes the matched route into the request scope before calling the
    endpoint; the ASGI middleware shares that dict, so it is readable at response start.
    """
    route = scope.get("route")
    if route is None:
        return None
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    if not isinstance(template, str):
        return None
    root_path = scope.get("root_path") or ""
    if root_path and not template.startswith(root_path):
        # A mounted sub-application sees routes relative to its mount point.
        template = root_path.rstrip("/") + template
    return template


class _ServerRequest:
    """Telemetry state of one HTTP request; every method swallows telemetry errors."""

    __slots__ = ("span", "token", "start_wall_ns", "start_perf_ns", "method", "status_code",
                 "meter", "ended", "disconnected", "response_started", "endpoint",
                 "scope")

    def __init__(self, middleware: "InferpathASGIMiddleware", scope: Scope) -> None:
        self.start_perf_ns = time.perf_counter_ns()
        self.start_wall_ns = time.time_ns()
        self.scope = scope
        self.method = str(scope.get("method") or "GET").upper()
        self.status_code: int | None = None
        self.meter: ChatStreamMeter | None = None
        self.ended = False
        self.disconnected = False
        self.response_started = False
        self.endpoint = middleware.endpoint
        carrier: dict[str, str] = {}
        for name, value in scope.get("headers") or ():
            lowered = name.lower()
            if lowered in _PROPAGATION_HEADERS:
                carrier[lowered.decode("latin-1")] = value.decode("latin-1")
        parent = provider.PROPAGATOR.extract(carrier) if carrier else None
        attributes: dict[str, Any] = {
            sc.STAGE: "gateway",
            sc.HTTP_REQUEST_METHOD: self.method,
            sc.URL_PATH: str(scope.get("path") or ""),
            sc.URL_SCHEME: str(scope.get("scheme") or "http"),
        }
        endpoint_class = middleware.endpoint_class or provider.current_endpoint_class()
        if endpoint_class:
            attributes[sc.ENDPOINT_CLASS] = endpoint_class
        self.span: Span = provider.get_tracer().start_span(
            self.method, context=parent, kind=SpanKind.SERVER, attributes=attributes,
            start_time=self.start_wall_ns,
        )
        self.token = otel_context.attach(trace.set_span_in_context(self.span, parent))
        next(_started)

    def on_response_start(self, message: Message) -> None:
        self.response_started = True
        self.status_code = int(message.get("status", 200))
        route = _route_of(self.scope)
        span = self.span
        span.set_attribute(sc.HTTP_RESPONSE_STATUS_CODE, self.status_code)
        if route is not None:
            span.update_name(f"{self.method} {route}")
            span.set_attribute(sc.HTTP_ROUTE, route)
        endpoint = self.endpoint or route
        if endpoint is not None:
            span.set_attribute(sc.ENDPOINT, endpoint)
        if self.status_code >= 500:
            span.set_status(Status(StatusCode.ERROR))
            span.set_attribute(sc.ERROR_TYPE, str(self.status_code))
        for name, value in message.get("headers") or ():
            if name.lower() == b"content-type" and value.lower().startswith(b"text/event-stream"):
                # The gateway only measures what it sends: no chunk is decoded for a caller.
                self.meter = ChatStreamMeter(start_ns=self.start_perf_ns, decode_chunks=False)
                break

    def end(self, stream_status: str | None, reason: str | None,
            error: BaseException | None = None) -> None:
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
            if not self.response_started and error is not None and not _is_disconnect(error):
                attributes[sc.HTTP_RESPONSE_STATUS_CODE] = 500
            span.set_attributes(attributes)
            if error is not None and isinstance(error, Exception) and not _is_disconnect(error):
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
                span.set_attribute(sc.ERROR_TYPE, type(error).__qualname__)
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
    served untraced. ``websocket`` and ``lifespan`` scopes pass through untouched.
    """

    def __init__(self, app: ASGIApp, *, endpoint_class: str | None = None,
                 endpoint: str | None = None,
                 excluded_paths: frozenset[str] = DEFAULT_EXCLUDED_PATHS) -> None:
        self.app = app
        self.endpoint_class = endpoint_class
        self.endpoint = endpoint
        self.excluded_paths = frozenset(excluded_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") == "lifespan":
            await self.app(scope, receive, self._flushing_on_shutdown(send))
            return
        if scope.get("type") != "http" or scope.get("path") in self.excluded_paths:
            await self.app(scope, receive, send)
            return
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
            if kind == "http.response.start":
                try:
                    request.on_response_start(message)
                except Exception:
                    _logger.warning("inferpath: response start not recorded", exc_info=True)
                await send(message)
                return
            if kind == "http.response.pathsend":
                # The server sends a whole file for us: the response ends with this message.
                await send(message)
                request.end(None, None)
                return
            if kind != "http.response.body":
                await send(message)
                return
            meter = request.meter
            body = message.get("body") or b""
            if meter is not None and body:
                try:
                    # Timestamp when the app hands the chunk over: the server-side view.
                    meter.feed(body, time.perf_counter_ns())
                except Exception:
                    _logger.warning("inferpath: SSE chunk not measured", exc_info=True)
            await send(message)
            if not message.get("more_body", False):
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
                reason = (sc.REASON_CLIENT_DISCONNECT if request.disconnected
                          else sc.REASON_RESPONSE_NOT_FINISHED)
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
