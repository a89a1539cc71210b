"""httpx integration: every OpenAI-compatible model call as one GenAI CLIENT span.

Wraps ``HTTPTransport.handle_request`` and ``AsyncHTTPTransport.handle_async_request`` of
``httpx`` and, when installed, ``httpx2`` (the layer every ``Client``/``AsyncClient`` sends
through; the ``openai`` SDK 1.x/2.x sends through httpx, 3.x through httpx2). A ``POST`` whose path ends in ``/chat/completions`` or ``/completions``
becomes a CLIENT span ``chat {model}`` / ``text_completion {model}`` with the GenAI
request attributes; its W3C ``traceparent`` is injected into the request, so the engine's
own spans (vLLM ``llm_request``) join the trace. Other requests pass through untouched.

The response body is observed as it passes, never copied or delayed:

* ``text/event-stream``: parsed as SSE by a :class:`ChatStreamMeter` (TTFT, ITL, token
  counts, definitions in ``streaming.py``); the span ends at the read that delivered the
  last JSON chunk (``[DONE]`` or end of body), so its duration is the E2E.
* JSON: buffered up to :data:`MAX_JSON_BODY_BYTES` and read for ``usage``, model and
  finish reasons when the body ends. No TTFT: a non-streamed answer has no first token.

A consumer that stops early (``break`` + ``close()``, a context manager left, the response
garbage-collected) ends the span ``incomplete`` / ``consumer_stopped``, TTFT kept if a
token was seen; a transport error ends it ``incomplete`` / ``error`` and is re-raised
unchanged. :func:`open_calls` counts spans still open, for leak checks.

Requests sent by :func:`inferpath.instrumentation.clients.stream_chat_completion` (which
makes its own span) carry the request extension ``inferpath.traced`` and are skipped, as
is everything sent while OTel instrumentation is suppressed (exporters).
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import SpanKind, Status, StatusCode

from inferpath.instrumentation import content, provider, receipt
from inferpath.instrumentation import semconv as sc
from inferpath.instrumentation.patching import unwrap_methods, wrap_methods
from inferpath.instrumentation.receipt import ReceiptClock, probe, receipt_clock, trace_connect
from inferpath.instrumentation.streaming import ChatStreamMeter

__all__ = [
    "instrument_library",
    "uninstrument_library",
    "open_calls",
    "ModelCall",
    "TRACED_EXTENSION",
    "MAX_JSON_BODY_BYTES",
]

_logger = logging.getLogger(__name__)

#: Request extension that marks a request already traced by inferpath.
TRACED_EXTENSION = "inferpath.traced"
#: Non-streamed answers larger than this are not parsed (span keeps its timing only).
MAX_JSON_BODY_BYTES = 4 * 1024 * 1024
_MAX_REQUEST_BODY_BYTES = 1024 * 1024

_lock = threading.Lock()
_owners: set[str] = set()
# Started/ended counters: ``next()`` on an itertools counter is atomic under the GIL and
# takes no lock, so ending a span from ``__del__`` (any thread, any moment) cannot deadlock.
_started = itertools.count()
_ended = itertools.count()


def _count(counter: itertools.count) -> int:
    # Reading a count without advancing it: its repr is "count(N)".
    return int(repr(counter)[6:-1])


def open_calls() -> int:
    """Model-call spans started by this integration and not yet ended (0 when idle)."""
    return _count(_started) - _count(_ended)


def _operation(path: str) -> str | None:
    path = path.rstrip("/")
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "text_completion"
    return None


def _suppressed() -> bool:
    """True inside ``suppress_instrumentation()`` (an exporter's own HTTP calls, for one)."""
    return not is_instrumentation_enabled()


_IN_A_TRACE = "in a trace"


class ModelCall:
    """Telemetry state of one model call, the one way a model-client span is made (this
    integration and :func:`~.clients.stream_chat_completion`): the CLIENT span started and
    its ``traceparent`` injected into ``request`` at construction, the response's stream
    metered, the span ended once. Every method but :meth:`feed` swallows telemetry errors.

    ``stage``: ``inferpath.stage`` of the span; by default ``"model"`` inside a trace and
    none at a trace's root. ``payload``: the request's JSON body when the caller has it
    (else it is read from ``request``). Clocks: wall for the span's timestamps, monotonic
    (``perf_counter_ns``) for every measure; the span's end is start + monotonic elapsed.
    ``status``/``reason`` are set when the span ends.
    """

    __slots__ = (
        "span",
        "start_wall_ns",
        "start_perf_ns",
        "meter",
        "json_body",
        "ended",
        "text_parts",
        "capture",
        "receipt",
        "status",
        "reason",
    )

    def __init__(
        self, request: httpx.Request, operation: str, *, stage: str | None = _IN_A_TRACE, payload: Any = None
    ) -> None:
        self.start_perf_ns = time.perf_counter_ns()
        self.start_wall_ns = time.time_ns()
        self.meter: ChatStreamMeter | None = None
        self.json_body: bytearray | None = None
        self.receipt: ReceiptClock | None = None
        self.ended = False
        self.status: str | None = None
        self.reason: str | None = None
        self.capture = content.content_capture_enabled()
        self.text_parts: list[str] = []
        if payload is None:
            payload = _request_payload(request)
        model = payload.get("model") if isinstance(payload, dict) else None
        attributes: dict[str, Any] = {
            sc.GEN_AI_OPERATION_NAME: operation,
            sc.SERVER_ADDRESS: request.url.host,
            sc.SERVER_PORT: request.url.port or (443 if request.url.scheme == "https" else 80),
            sc.HTTP_REQUEST_METHOD: request.method,
        }
        if isinstance(model, str) and model:
            attributes[sc.GEN_AI_REQUEST_MODEL] = model
        if isinstance(payload, dict):
            max_tokens = payload.get("max_tokens", payload.get("max_completion_tokens"))
            if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
                attributes[sc.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
            if self.capture:
                messages = content.input_messages_attribute(payload)
                if messages is not None:
                    attributes[content.GEN_AI_INPUT_MESSAGES] = messages
        if stage is _IN_A_TRACE:
            # Inside a traced service the call is the model stage of the request; at the root
            # of a trace (an end-user client) it is the request itself, without a stage.
            stage = "model" if trace.get_current_span().get_span_context().is_valid else None
        if stage is not None:
            attributes[sc.STAGE] = stage
        name = f"{operation} {model}" if isinstance(model, str) and model else operation
        try:
            self.span = provider.get_tracer().start_span(
                name, kind=SpanKind.CLIENT, attributes=attributes, start_time=self.start_wall_ns
            )
            carrier: dict[str, str] = {}
            provider.PROPAGATOR.inject(carrier, context=trace.set_span_in_context(self.span))
            request.headers.update(carrier)
        except Exception:  # the call goes on, measured but untraced
            _logger.warning("inferpath: could not start the model-call span", exc_info=True)
            self.span = trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)
        next(_started)

    def on_response(self, response: httpx.Response, *, decode_chunks: bool = False) -> None:
        """Record the status; meter an SSE body (every body when ``decode_chunks``: the
        caller asked for a stream and wants its chunks decoded), buffer a JSON one."""
        try:
            status = response.status_code
            self.span.set_attribute(sc.HTTP_RESPONSE_STATUS_CODE, status)
            if status >= 400:
                self.span.set_status(Status(StatusCode.ERROR))
                self.span.set_attribute(sc.ERROR_TYPE, str(status))
            content_type = response.headers.get("content-type", "").lower()
            if decode_chunks or content_type.startswith("text/event-stream"):
                # Chunks are decoded only for a caller, or when their text is captured.
                self.meter = ChatStreamMeter(start_ns=self.start_perf_ns, decode_chunks=decode_chunks or self.capture)
                # Opt-in, async clients: stamp chunks at the kernel's receipt (receipt.py).
                self.receipt = receipt_clock(response)
            elif "json" in content_type:
                self.json_body = bytearray()
        except Exception:
            _logger.warning("inferpath: model-call response not recorded", exc_info=True)

    def before_read(self) -> None:
        """Opt-in receipt stamps: note other streams' bytes that arrived meanwhile."""
        if self.receipt is not None:
            probe()

    def stamp_ns(self, now_ns: int) -> int:
        """The receipt time of the body piece just read at ``now_ns`` (``perf_counter_ns``):
        ``now_ns`` itself by default, the kernel's receipt with the opt-in (receipt.py)."""
        clock = self.receipt
        if clock is None:
            return now_ns
        probe()
        return clock.stamp_ns(now_ns, self.start_perf_ns)

    def feed(self, data: bytes, received_ns: int) -> Sequence[dict[str, Any]]:
        """Meter one network read stamped ``received_ns``; the SSE chunks it completed
        (decoded only when asked for). Raises what the meter raises, and ``RuntimeError``
        when the response was not metered (``on_response`` set no meter)."""
        meter = self.meter
        if meter is None:
            raise RuntimeError("inferpath: a body read fed to a model call whose response has no stream meter")
        chunks = meter.feed(data, received_ns)
        if self.capture:
            self.text_parts.extend(_delta_texts(chunks))
        return chunks

    def on_bytes(self, data: bytes, received_ns: int) -> None:
        """One network read, stamped at receipt (before any parsing); ends the span at the
        last chunk."""
        if self.ended:
            return
        try:
            meter = self.meter
            if meter is not None:
                self.feed(data, received_ns)
                if meter.done:
                    end_ns = meter.timeline.last_chunk_ns or received_ns
                    self.end(None, None, at_ns=end_ns)
            elif self.json_body is not None:
                if len(self.json_body) + len(data) <= MAX_JSON_BODY_BYTES:
                    self.json_body += data
                else:
                    self.json_body = None
        except Exception:
            _logger.warning("inferpath: model-call chunk not measured", exc_info=True)

    def end(
        self, status: str | None, reason: str | None, *, at_ns: int | None = None, error: BaseException | None = None
    ) -> None:
        """End the span once. ``status`` None: the body ended normally."""
        if self.ended:
            return
        self.ended = True
        next(_ended)
        self.status, self.reason = status, reason
        end_ns = time.perf_counter_ns() if at_ns is None else at_ns
        try:
            span = self.span
            meter = self.meter
            if meter is not None:
                if status is None:
                    meter.close(end_ns)
                    end_ns = meter.timeline.last_chunk_ns or end_ns
                    status, reason = sc.finished_stream_status(meter)
                    self.status, self.reason = status, reason
                meter.timeline.finish(end_ns)
                span.set_attributes(sc.stream_result_attributes(meter, status, reason))
                if self.capture and self.text_parts:
                    output = content.output_messages_attribute("".join(self.text_parts))
                    if output is not None:
                        span.set_attribute(content.GEN_AI_OUTPUT_MESSAGES, output)
            else:
                if status is None:
                    status = self.status = sc.STATUS_COMPLETE
                span.set_attribute(sc.STREAM_STATUS, status)
                if reason is not None:
                    span.set_attribute(sc.STREAM_INCOMPLETE_REASON, reason)
                if self.json_body is not None and status == sc.STATUS_COMPLETE:
                    span.set_attributes(_json_answer_attributes(bytes(self.json_body), self.capture))
            if error is not None and isinstance(error, Exception):
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
                span.set_attribute(sc.ERROR_TYPE, type(error).__qualname__)
            span.end(end_time=self.start_wall_ns + (end_ns - self.start_perf_ns))
        except Exception:
            _logger.warning("inferpath: could not end the model-call span", exc_info=True)


def _request_payload(request: httpx.Request) -> Any:
    try:
        body = request.content  # raises for a streamed (unread) request body
    except Exception:
        return None
    if not body or len(body) > _MAX_REQUEST_BODY_BYTES:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def _delta_texts(chunks: Iterable[dict[str, Any]]) -> list[str]:
    texts: list[str] = []
    for chunk in chunks:
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(text, str) and text:
                texts.append(text)
    return texts


def _json_answer_attributes(body: bytes, capture: bool) -> dict[str, Any]:
    try:
        answer = json.loads(body)
    except ValueError:
        return {}
    if not isinstance(answer, dict):
        return {}
    attributes: dict[str, Any] = {}
    usage = answer.get("usage")
    if isinstance(usage, dict):
        for key, attribute in (
            ("completion_tokens", sc.GEN_AI_USAGE_OUTPUT_TOKENS),
            ("prompt_tokens", sc.GEN_AI_USAGE_INPUT_TOKENS),
        ):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                attributes[attribute] = value
    if isinstance(answer.get("model"), str) and answer["model"]:
        attributes[sc.GEN_AI_RESPONSE_MODEL] = answer["model"]
    reasons: list[str] = []
    texts: list[str] = []
    for choice in answer.get("choices") or ():
        if isinstance(choice, dict):
            if isinstance(choice.get("finish_reason"), str):
                reasons.append(choice["finish_reason"])
            message = choice.get("message")
            text = message.get("content") if isinstance(message, dict) else choice.get("text")
            if isinstance(text, str):
                texts.append(text)
    if reasons:
        attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = list(dict.fromkeys(reasons))
    if capture and texts:
        output = content.output_messages_attribute("".join(texts))
        if output is not None:
            attributes[content.GEN_AI_OUTPUT_MESSAGES] = output
    return attributes


class _TracedSyncStream:
    """The response body of a sync call, observed read by read (mixed into the library's
    ``SyncByteStream``, see :func:`_stream_classes`)."""

    def __init__(self, inner: Any, call: ModelCall) -> None:
        self._inner = inner
        self._call = call

    def __iter__(self) -> Any:
        call = self._call
        iterator = iter(self._inner)
        while True:
            try:
                data = next(iterator)
            except StopIteration:
                call.end(None, None)
                return
            except BaseException as error:
                call.end(sc.STATUS_INCOMPLETE, sc.REASON_ERROR, error=error)
                raise
            call.on_bytes(data, time.perf_counter_ns())
            yield data

    def close(self) -> None:
        self._call.end(sc.STATUS_INCOMPLETE, sc.REASON_CONSUMER_STOPPED)
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        try:
            self._call.end(sc.STATUS_INCOMPLETE, sc.REASON_CONSUMER_STOPPED)
        except Exception:
            pass


class _TracedAsyncStream:
    """The response body of an async call, observed read by read (mixed into the library's
    ``AsyncByteStream``)."""

    def __init__(self, inner: Any, call: ModelCall) -> None:
        self._inner = inner
        self._call = call

    async def __aiter__(self) -> Any:
        call = self._call
        iterator = self._inner.__aiter__()
        while True:
            try:
                data = await iterator.__anext__()
            except StopAsyncIteration:
                call.end(None, None)
                return
            except BaseException as error:
                reason = sc.REASON_CANCELLED if _is_cancel(error) else sc.REASON_ERROR
                call.end(sc.STATUS_INCOMPLETE, reason, error=error)
                raise
            call.on_bytes(data, call.stamp_ns(time.perf_counter_ns()))
            yield data

    async def aclose(self) -> None:
        self._call.end(sc.STATUS_INCOMPLETE, sc.REASON_CONSUMER_STOPPED)
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()

    def __del__(self) -> None:
        try:
            self._call.end(sc.STATUS_INCOMPLETE, sc.REASON_CONSUMER_STOPPED)
        except Exception:
            pass


def _is_cancel(error: BaseException) -> bool:
    import asyncio

    return isinstance(error, asyncio.CancelledError)


def _start_call(request: Any) -> ModelCall | None:
    if request.method != "POST" or request.extensions.get(TRACED_EXTENSION) or _suppressed():
        return None
    operation = _operation(request.url.path)
    if operation is None:
        return None
    try:
        return ModelCall(request, operation)
    except Exception:
        _logger.warning("inferpath: could not start a model-call span", exc_info=True)
        return None


def _stream_classes(library: Any) -> tuple[type, type]:
    # httpx checks ``isinstance(stream, SyncByteStream)`` of its own module when closing a
    # response, so each library gets wrappers that subclass its own base classes.
    return (
        type("TracedSyncStream", (_TracedSyncStream, library.SyncByteStream), {}),
        type("TracedAsyncStream", (_TracedAsyncStream, library.AsyncByteStream), {}),
    )


def _traced_sync(stream_class: type) -> Any:
    """wrapt wrapper of ``HTTPTransport.handle_request``."""

    def handle_request(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
        request = args[0] if args else kwargs["request"]
        call = _start_call(request)
        if call is None:
            return wrapped(*args, **kwargs)
        try:
            response = wrapped(*args, **kwargs)
        except BaseException as error:
            call.end(sc.STATUS_INCOMPLETE, sc.REASON_ERROR, error=error)
            raise
        call.on_response(response)
        response.stream = stream_class(response.stream, call)
        return response

    return handle_request


def _traced_async(stream_class: type) -> Any:
    """wrapt wrapper of ``AsyncHTTPTransport.handle_async_request``."""

    async def handle_async_request(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
        request = args[0] if args else kwargs["request"]
        call = _start_call(request)
        if call is None:
            return await wrapped(*args, **kwargs)
        if receipt.enabled:  # opt-in: a connection this call opens is stamped from its first read
            try:
                request.extensions["trace"] = trace_connect(request.extensions.get("trace"))
            except Exception:
                pass
        try:
            response = await wrapped(*args, **kwargs)
        except BaseException as error:
            reason = sc.REASON_CANCELLED if _is_cancel(error) else sc.REASON_ERROR
            call.end(sc.STATUS_INCOMPLETE, reason, error=error)
            raise
        call.on_response(response)
        response.stream = stream_class(response.stream, call)
        return response

    return handle_async_request


def _libraries() -> list[Any]:
    """httpx, and httpx2 (its successor, which the openai SDK 3.x sends through) if present."""
    libraries = [httpx]
    try:
        import httpx2

        libraries.append(httpx2)
    except ImportError:
        pass
    return libraries


def instrument_library(*, owner: str = "httpx", **_options: Any) -> None:
    """Wrap the sync and async transports of httpx (and httpx2 when installed); idempotent.
    ``owner`` names who asked, so that the ``openai`` integration and the ``httpx`` one can
    be turned off separately: the wrap is removed when the last owner leaves."""
    with _lock:
        _owners.add(owner)
        for library in _libraries():
            sync_stream, async_stream = _stream_classes(library)
            wrap_methods(library.HTTPTransport, {"handle_request": _traced_sync(sync_stream)})
            wrap_methods(library.AsyncHTTPTransport, {"handle_async_request": _traced_async(async_stream)})


def uninstrument_library(*, owner: str = "httpx") -> None:
    """Remove ``owner``'s claim; unwrap the transports when no owner is left."""
    with _lock:
        _owners.discard(owner)
        if _owners:
            return
        for library in _libraries():
            unwrap_methods(library.HTTPTransport)
            unwrap_methods(library.AsyncHTTPTransport)
