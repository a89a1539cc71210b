"""The HTTP face of the server: OTLP/HTTP receiver, read API, health and self-metrics.

Endpoints (OpenAPI document at ``/openapi.json``, browsable at ``/docs``):

- ``POST /v1/traces``, ``POST /v1/metrics``: OTLP/HTTP, protobuf or JSON, optional gzip.
  200 with an ``Export*ServiceResponse`` in the request's encoding (``partial_success`` when
  items were rejected) only once the rows are committed to the store; 400 for a malformed
  body (or rows the store refuses), 408 when the body has not arrived within
  ``settings.body_read_timeout_seconds``, 413 over ``settings.max_body_bytes`` (or a compressed
  body inflating past ``MAX_DECOMPRESSED_BYTES``, 64 MiB), 415 for another
  media type or encoding, 503 with ``Retry-After`` when too many exports are in flight or
  the store is unavailable (:mod:`inferpath.server.ingest`). A JSON body that is not the
  path's export (a logs export's ``resourceLogs`` posted to ``/v1/traces``) is a 400 naming
  what it holds; ``{}`` is a valid empty export.
- ``POST /v1/logs``: 501 (gRPC's UNIMPLEMENTED) with a message that logs are not accepted.
  Error bodies are ``google.rpc.Status`` in the request's encoding (JSON when unknown), as
  the OTLP specification asks, with a message naming the problem.
- ``GET /api/v1/...``: the read API (:mod:`inferpath.server.read_api`).
- ``GET /healthz`` (never guarded), ``GET /metrics`` (Prometheus text).

With ``settings.token`` set, every endpoint except ``/healthz`` and the OpenAPI pages needs
``Authorization: Bearer <token>`` (401 otherwise).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from google.rpc import status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect

import inferpath
from inferpath.ratelimited_log import RateLimitedLog
from inferpath.server.ingest import CommitResult, dedup_token
from inferpath.server.otlp import (
    BodyTooLargeError,
    DecodedMetrics,
    DecodedSpans,
    OTLPDecodeError,
    UnsupportedMediaTypeError,
    decode_metrics_request,
    decode_trace_request,
)
from inferpath.server.otlp_body import BodyFormat, body_format, encode_message
from inferpath.server.read_api import router as read_router
from inferpath.server.selfmetrics import make_registry

if TYPE_CHECKING:  # the runtime imports this module to serve it
    from inferpath.server.runtime import ServerRuntime

__all__ = ["create_app"]

logger = logging.getLogger(__name__)

_MEDIA_TYPES = {"protobuf": "application/x-protobuf", "json": "application/json"}
# google.rpc.Code values used in error bodies.
_INVALID_ARGUMENT, _DEADLINE_EXCEEDED, _RESOURCE_EXHAUSTED, _UNAVAILABLE, _UNAUTHENTICATED = 3, 4, 8, 14, 16
_UNIMPLEMENTED = 12
# Exceptions of decoding an export → (HTTP status, google.rpc.Code) of its refusal.
_DECODE_REFUSALS: tuple[tuple[type[Exception], int, int], ...] = (
    (UnsupportedMediaTypeError, 415, _INVALID_ARGUMENT),
    (BodyTooLargeError, 413, _RESOURCE_EXHAUSTED),
    (OTLPDecodeError, 400, _INVALID_ARGUMENT),
)

LOGS_NOT_ACCEPTED = (
    "inferpath does not accept OTLP logs: it stores traces (POST /v1/traces) and metrics "
    "(POST /v1/metrics); send logs to an OpenTelemetry Collector or a log backend instead"
)


class _BodyTooLarge(Exception):
    pass


def _format_or_none(request: Request) -> BodyFormat | None:
    """The encoding of the request's body for an error body; ``None`` (JSON) when unsupported."""
    try:
        return body_format(request.headers.get("content-type"))
    except UnsupportedMediaTypeError:
        return None


def _status_response(
    http_status: int, code: int, message: str, fmt: BodyFormat | None, headers: Mapping[str, str] | None = None
) -> Response:
    fmt = fmt or "json"
    return Response(
        encode_message(status_pb2.Status(code=code, message=message), fmt),
        status_code=http_status,
        media_type=_MEDIA_TYPES[fmt],
        headers=headers,
    )


async def _read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _peer(request: Request) -> str:
    """The client's address as ``host:port`` (``"unknown"`` when the transport has none)."""
    client = request.client
    return f"{client.host}:{client.port}" if client is not None else "unknown"


def _auth_dependency(token: str | None):
    expected = token.encode() if token else None

    async def require_token(request: Request) -> None:
        if expected is None:
            return
        # The scheme is case-insensitive (RFC 9110 §11.1); the token is compared in constant time.
        scheme, _, credentials = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(credentials.strip().encode(), expected):
            raise HTTPException(
                status_code=401, detail="missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )

    return require_token


#: Longest text of a client's own input that an error body repeats back (characters).
MAX_ECHOED_CHARS = 256
#: Longest error message kept whole (characters): the server's own sentences (a refused
#: what-if explains itself in ~330) fit; a message quoting a 60 000-character input does not.
MAX_MESSAGE_CHARS = 1024


def _bounded(value, limit: int = MAX_ECHOED_CHARS):
    """``value`` (an error detail) with every string longer than ``limit`` cut there and
    marked with its full length, so that a 60 000-character parameter is not sent back whole
    in its 422. The server's own sentences, a validation error's ``msg`` and the ``template``
    it was written from (``ctx.template``, which the CLI words with its own option names), are
    cut at :data:`MAX_MESSAGE_CHARS` only."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}… ({len(value)} characters)"
    if isinstance(value, dict):
        return {
            key: _bounded(item, MAX_MESSAGE_CHARS if key in ("msg", "template") else MAX_ECHOED_CHARS)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_bounded(item, limit) for item in value]
    return value


def create_app(runtime: ServerRuntime) -> FastAPI:
    """Build the FastAPI application serving ``runtime`` (see the module docstring).

    The app only decodes and answers; storage, queues and loops belong to ``runtime``,
    whose lifecycle the caller manages.
    """
    settings = runtime.settings
    guard = Depends(_auth_dependency(settings.token))
    app = FastAPI(
        title="inferpath", version=inferpath.__version__, description="OTLP/HTTP receiver and read API of inferpath."
    )
    app.state.runtime = runtime
    registry = make_registry(runtime)
    # What the server refused or dropped of a client's exports, said in the server's log too
    # (the exporter's log is on another machine): one line per 10 s for each of the two logs
    # at most, each saying how many it did not print.
    refusals = RateLimitedLog(logger, interval_seconds=10.0)
    partial_rejections = RateLimitedLog(logger, interval_seconds=10.0)

    def _refused(
        request: Request,
        signal: str,
        http_status: int,
        code: int,
        message: str,
        fmt: BodyFormat | None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """Count and log a refusal (4xx, or the 501 of ``/v1/logs``) of an OTLP export, and build it."""
        runtime.count_bad_request()
        refusals.warning(
            "OTLP %s export from %s answered %d: %s", signal, _peer(request), http_status, _bounded(message)
        )
        return _status_response(http_status, code, message, fmt, headers=headers)

    @app.exception_handler(HTTPException)
    async def _otlp_status_errors(request: Request, exc: HTTPException) -> Response:
        # OTLP/HTTP error bodies are google.rpc.Status in the request's encoding (the 401 of
        # the token guard included); the read API keeps FastAPI's JSON errors.
        if not request.url.path.startswith("/v1/"):
            exc.detail = _bounded(exc.detail, MAX_MESSAGE_CHARS)
            return await http_exception_handler(request, exc)
        code = _UNAUTHENTICATED if exc.status_code == 401 else _INVALID_ARGUMENT
        if exc.status_code == 401:  # not a malformed export: logged, not counted as one
            refusals.warning("OTLP export to %s from %s answered 401: %s", request.url.path, _peer(request), exc.detail)
        return _status_response(exc.status_code, code, str(exc.detail), _format_or_none(request), headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_errors(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's 422, with over-long inputs cut (the messages name the parameter).
        return await request_validation_exception_handler(
            request, RequestValidationError(_bounded(list(exc.errors())), body=None)
        )

    async def _ingest(request: Request, signal: str) -> Response:
        content_type = request.headers.get("content-type")
        try:
            fmt = body_format(content_type)
        except UnsupportedMediaTypeError as exc:
            return _refused(request, signal, 415, _INVALID_ARGUMENT, str(exc), None)
        # Admission before the body is read: a refused export holds no memory here. A body
        # of unknown length reserves the most it may be.
        declared = request.headers.get("content-length", "")
        reserved = min(int(declared), settings.max_body_bytes) if declared.isdigit() else settings.max_body_bytes
        admission = runtime.ingest.admit(reserved)
        if isinstance(admission, CommitResult):
            return _unavailable(admission, fmt)
        with admission:
            try:
                body = await asyncio.wait_for(
                    _read_body(request, settings.max_body_bytes), settings.body_read_timeout_seconds
                )
            except TimeoutError:  # a stalled upload must not hold its in-flight slot
                message = f"body not received within body_read_timeout_seconds={settings.body_read_timeout_seconds:g}"
                return _refused(request, signal, 408, _DEADLINE_EXCEEDED, message, fmt, {"Connection": "close"})
            except _BodyTooLarge:
                message = f"body exceeds max_body_bytes={settings.max_body_bytes}"
                return _refused(request, signal, 413, _RESOURCE_EXHAUSTED, message, fmt)
            except ClientDisconnect:  # the exporter gave up mid-upload (its timeout): nothing to answer
                refusals.log(
                    logging.INFO,
                    "OTLP %s export from %s ended before its whole body arrived (client disconnected)",
                    signal,
                    _peer(request),
                )
                return Response(status_code=400)
            if signal != "traces":
                return await _decode_and_commit(request, signal, body, content_type, fmt)
            room = runtime.span_sink.reserve(len(body))  # a 503 now, not after decoding what cannot fit
            if isinstance(room, CommitResult):
                return _unavailable(room, fmt)
            with room:
                return await _decode_and_commit(request, signal, body, content_type, fmt)

    def _unavailable(result: CommitResult, fmt: BodyFormat | None) -> Response:
        return _status_response(
            503, _UNAVAILABLE, result.message, fmt, headers={"Retry-After": str(result.retry_after_seconds)}
        )

    async def _decode_and_commit(
        request: Request, signal: str, body: bytes, content_type: str | None, fmt: BodyFormat
    ) -> Response:
        content_encoding = request.headers.get("content-encoding")
        decode = decode_trace_request if signal == "traces" else decode_metrics_request
        # Items older than the table's TTL would vanish at insert: reject them with a reason.
        oldest_unix_ns = runtime.oldest_storable_unix_ns("otel_traces" if signal == "traces" else "otel_metrics_gauge")

        def decode_and_commit() -> tuple[DecodedSpans | DecodedMetrics, CommitResult] | Exception:
            # One worker-thread hop per export: decoding and committing are both blocking.
            try:
                decoded = decode(
                    body, content_type=content_type, content_encoding=content_encoding, oldest_unix_ns=oldest_unix_ns
                )
            except Exception as exc:  # noqa: BLE001 - answered below, never raised into the loop
                return exc
            token = dedup_token(signal, content_type, content_encoding, body)
            if isinstance(decoded, DecodedSpans):  # signal == "traces": decoded by decode_trace_request
                return decoded, runtime.ingest_spans(decoded, token, body, content_type, content_encoding)
            return decoded, runtime.ingest_metrics(decoded, token)

        outcome = await run_in_threadpool(decode_and_commit)
        if isinstance(outcome, Exception):
            for kind, http_status, code in _DECODE_REFUSALS:
                if isinstance(outcome, kind):
                    return _refused(request, signal, http_status, code, str(outcome), fmt)
            # A body must never take the server down.
            logger.error("unexpected error decoding an OTLP %s body", signal, exc_info=outcome)
            return _refused(request, signal, 400, _INVALID_ARGUMENT, f"could not decode body: {outcome}", fmt)
        decoded, result = outcome
        if result.status == "invalid":
            return _refused(request, signal, 400, _INVALID_ARGUMENT, result.message, fmt)
        if not result.ok:
            return _unavailable(result, fmt)
        if isinstance(decoded, DecodedSpans):
            rejected = decoded.rejected_spans
            response = ExportTraceServiceResponse()
            if rejected or decoded.error_message:  # a warning alone has a count of 0
                response.partial_success.rejected_spans = rejected
                response.partial_success.error_message = decoded.error_message
        else:
            rejected = decoded.rejected_data_points
            response = ExportMetricsServiceResponse()
            if rejected:
                response.partial_success.rejected_data_points = rejected
                response.partial_success.error_message = decoded.error_message
        if rejected:
            partial_rejections.warning(
                "OTLP %s export from %s stored without what it rejected: %s",
                signal,
                _peer(request),
                _bounded(decoded.error_message),
            )
        return Response(encode_message(response, fmt), media_type=_MEDIA_TYPES[fmt])

    @app.post("/v1/traces", dependencies=[guard], tags=["otlp"])
    async def otlp_traces(request: Request) -> Response:
        """OTLP/HTTP trace export (``ExportTraceServiceRequest``)."""
        return await _ingest(request, "traces")

    @app.post("/v1/metrics", dependencies=[guard], tags=["otlp"])
    async def otlp_metrics(request: Request) -> Response:
        """OTLP/HTTP metrics export (``ExportMetricsServiceRequest``)."""
        return await _ingest(request, "metrics")

    # OTLP/HTTP names no status for a signal the server does not take; OTLP/gRPC does: a
    # server without the service answers UNIMPLEMENTED, which its table lists as not
    # retryable, and google.rpc.Code maps UNIMPLEMENTED to HTTP 501. OTLP/HTTP exporters
    # retry only 429, 502, 503 and 504, so a 501 ends each logs export at once; unlike a
    # 404 (what a mistyped path gets, and what a Collector without a logs pipeline answers,
    # with no body) it says that the path is right and names the signal as what is refused.
    @app.post("/v1/logs", dependencies=[guard], tags=["otlp"], status_code=501)
    async def otlp_logs(request: Request) -> Response:
        """OTLP/HTTP logs export: not accepted; 501 with a ``google.rpc.Status`` (code
        UNIMPLEMENTED) saying so, in the request's encoding. The body is not read."""
        return _refused(request, "logs", 501, _UNIMPLEMENTED, LOGS_NOT_ACCEPTED, _format_or_none(request))

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict:
        """Liveness: 200 with ``{"status": "ok"}`` while the server runs; ``store`` is
        ``"unavailable"`` while inserts back off after a store error; ``span_log`` is ``on``,
        ``off``, or why the configured log could not be opened."""
        if runtime.closed:
            raise HTTPException(status_code=503, detail="shutting down")
        return {
            "status": "ok",
            "version": inferpath.__version__,
            "store": "available" if runtime.ingest.store_available else "unavailable",
            "span_log": runtime.span_log_state,
        }

    @app.get("/metrics", dependencies=[guard], tags=["ops"])
    async def metrics() -> Response:
        """The server's own metrics in Prometheus text format."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(read_router, dependencies=[guard])

    return app
