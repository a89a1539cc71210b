"""Model-client calls over httpx: a streamed OpenAI-compatible completion as one CLIENT span.

    stream = stream_chat_completion(client, "http://engine:8000/v1/chat/completions",
                                    {"model": "m", "messages": [...], "max_tokens": 64})
    async with stream:                      # or plain ``async for`` (see below)
        async for chunk in stream:          # parsed JSON chunks
            ...
    stream.timeline.ttft_seconds, stream.timeline.itl_seconds

The span is the httpx integration's (:class:`~.genai_http.ModelCall`, the one way a
model-client span is made; this call marks its request so the integration does not make a
second one): ``chat {model}`` (``text_completion {model}`` for ``/completions``) carries the
GenAI request attributes, the W3C ``traceparent`` of the span is sent with the request,
and at the end the span gets TTFT, mean ITL, token counts and ``inferpath.stream.status``
(definitions in ``streaming.py``). Its end is the receipt of the last chunk, so span
duration == E2E on the monotonic clock.

Early stop: leaving ``async with`` or calling :meth:`ChatCompletionStream.aclose` ends
the span as ``incomplete`` with reason ``consumer_stopped``; a ``break`` out of a bare
``async for`` does the same when the stream object is released.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx

from inferpath.instrumentation import receipt
from inferpath.instrumentation import semconv as sc
from inferpath.instrumentation.genai_http import TRACED_EXTENSION, ModelCall, _operation
from inferpath.instrumentation.receipt import trace_connect
from inferpath.instrumentation.streaming import ChatStreamMeter, TokenTimeline
from inferpath.vocabulary import STAGES

__all__ = ["stream_chat_completion", "ChatCompletionStream"]

_logger = logging.getLogger(__name__)
# Closing tasks scheduled from __del__ must stay referenced until they run.
_closing_tasks: set[asyncio.Task[Any]] = set()

OnChunk = Callable[[dict[str, Any], int], Any]


class ChatCompletionStream:
    """Async iterator over the JSON chunks of one streamed completion, traced as one span.

    Built by :func:`stream_chat_completion`. The request is sent on the first
    ``__anext__``. Attributes, valid once the stream ended (and partly while it runs):
    ``timeline`` (:class:`TokenTimeline`, monotonic clock), ``meter`` (parser state),
    ``status`` (``complete`` / ``incomplete`` / ``None`` while running), ``reason``,
    ``response`` (the ``httpx.Response``).
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        payload: dict[str, Any],
        *,
        stage: str | None,
        headers: dict[str, str] | None,
        on_chunk: OnChunk | None,
    ) -> None:
        if not isinstance(payload, dict):
            raise TypeError(f"payload must be a dict (the JSON request body), got {type(payload)!r}")
        if stage is not None and stage not in STAGES:
            raise ValueError(f"stage must be None or one of {', '.join(STAGES)}; got {stage!r}")
        self._client = client
        self._request = client.build_request(
            "POST",
            url,
            json=payload if payload.get("stream") is True else {**payload, "stream": True},
            headers=headers,
        )
        # This call makes its own span; the httpx integration must not make a second one.
        self._request.extensions[TRACED_EXTENSION] = True
        if receipt.enabled:  # opt-in: a connection this call opens is stamped from its first read
            self._request.extensions["trace"] = trace_connect(self._request.extensions.get("trace"))
        self._payload = payload
        self._stage = stage
        self._on_chunk = on_chunk
        self._pending: collections.deque[dict[str, Any]] = collections.deque()
        self._bytes: Any = None
        self._call: ModelCall | None = None
        self._last_read_ns: int | None = None
        self._last_chunk_ns: int | None = None
        self._needs_drain = False
        self._finish_at_ns: int | None = None
        self._exhausted = False
        self.response: httpx.Response | None = None

    @property
    def meter(self) -> ChatStreamMeter | None:
        """The parser state (``None`` before the response arrived)."""
        return None if self._call is None else self._call.meter

    @property
    def status(self) -> str | None:
        """``complete`` / ``incomplete`` once the stream ended, ``None`` while it runs."""
        return None if self._call is None else self._call.status

    @property
    def reason(self) -> str | None:
        """Why the stream is ``incomplete`` (``semconv.REASON_*``), else ``None``."""
        return None if self._call is None else self._call.reason

    @property
    def trace_id(self) -> str | None:
        """The call's trace id as 32 lowercase hex digits (``None`` before the request was sent
        or when tracing is off)."""
        if self._call is None:
            return None
        context = self._call.span.get_span_context()
        return format(context.trace_id, "032x") if context.is_valid else None

    @property
    def http_status(self) -> int | None:
        """The HTTP status code of the response (``None`` before it arrived)."""
        return None if self.response is None else self.response.status_code

    @property
    def timeline(self) -> TokenTimeline | None:
        """The token timeline (``None`` before the request was sent)."""
        return None if self.meter is None else self.meter.timeline

    # -- iteration ---------------------------------------------------------------------
    def __aiter__(self) -> ChatCompletionStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._pending:
            return self._pending.popleft()
        if self._finish_at_ns is not None:
            finish_at_ns, self._finish_at_ns = self._finish_at_ns, None
            self._finish_complete(finish_at_ns)
        if self._exhausted:
            if self._needs_drain:
                # Only now, after the caller has had every chunk: reading the end of the body
                # must not delay the last chunk the caller sees.
                self._needs_drain = False
                await self._drain()
            raise StopAsyncIteration
        if self._call is None:
            await self._open()
        call = self._call
        assert call is not None  # _open() sets it or raises
        try:
            while not self._pending:
                call.before_read()
                try:
                    data = await self._bytes.__anext__()
                except StopAsyncIteration:
                    self._finish_complete(self._last_chunk_ns or self._last_read_ns)
                    break
                received_ns = self._last_read_ns = call.stamp_ns(time.perf_counter_ns())
                chunks = call.feed(data, received_ns)
                if chunks:
                    self._last_chunk_ns = received_ns
                if self._on_chunk is not None:
                    for chunk in chunks:
                        self._on_chunk(chunk, received_ns)
                self._pending.extend(chunks)
                if call.meter is not None and call.meter.done:
                    # E2E ends at the read that delivered the last JSON chunk; ``[DONE]`` is
                    # a sentinel, not part of the answer. The span is ended (SDK work) only once
                    # the caller has had every chunk, with that read's time as its end.
                    self._finish_at_ns = self._last_chunk_ns or received_ns
                    self._needs_drain = True
                    break
        except asyncio.CancelledError as error:
            await self._abandon(sc.REASON_CANCELLED, error)
            raise
        except BaseException as error:
            await self._abandon(sc.REASON_ERROR, error)
            raise
        if self._pending:
            return self._pending.popleft()
        if self._finish_at_ns is not None:
            finish_at_ns, self._finish_at_ns = self._finish_at_ns, None
            self._finish_complete(finish_at_ns)
        if self._needs_drain:
            self._needs_drain = False
            await self._drain()
        raise StopAsyncIteration

    async def _open(self) -> None:
        request = self._request
        self._call = call = ModelCall(
            request, _operation(request.url.path) or "chat", stage=self._stage, payload=self._payload
        )
        try:
            self.response = await self._client.send(request, stream=True)
            call.on_response(self.response, decode_chunks=True)
            if self.response.status_code >= 400:
                self.response.raise_for_status()
        except asyncio.CancelledError as error:
            await self._abandon(sc.REASON_CANCELLED, error)
            raise
        except BaseException as error:
            await self._abandon(sc.REASON_ERROR, error)
            raise
        self._bytes = self.response.aiter_bytes()

    async def _drain(self) -> None:
        # After [DONE] only the end of the HTTP body is left; reading it lets httpx
        # return the connection to the pool instead of closing it.
        try:
            async for _ in self._bytes:
                pass
        except Exception:
            pass
        await self._close_response()

    # -- ending --------------------------------------------------------------------------
    def _finish_complete(self, last_read_ns: int | None) -> None:
        self._exhausted = True
        if self._call is not None:
            self._call.end(None, None, at_ns=last_read_ns)

    async def _abandon(self, reason: str, error: BaseException | None = None) -> None:
        self._exhausted = True
        call = self._call
        if call is not None:
            if call.meter is None:  # no response: the meter measures the time to the error
                call.meter = ChatStreamMeter(start_ns=call.start_perf_ns)
            call.end(sc.STATUS_INCOMPLETE, reason, error=error)
        self._pending.clear()
        await self._close_response()

    async def _close_response(self) -> None:
        response = self.response
        if response is not None:
            try:
                await response.aclose()
            except Exception:
                pass

    async def aclose(self) -> None:
        """Stop reading: the span ends ``incomplete`` / ``consumer_stopped`` unless the stream
        already ended; the HTTP response is closed. Safe to call twice."""
        if self._finish_at_ns is not None:  # the stream ended; only the span was still open
            finish_at_ns, self._finish_at_ns = self._finish_at_ns, None
            self._finish_complete(finish_at_ns)
        if self._call is not None and self.status is None:
            await self._abandon(sc.REASON_CONSUMER_STOPPED)
        else:
            # Chunks already read but not taken (the whole body can arrive in one read) are
            # dropped too: after aclose() the iteration ends.
            self._pending.clear()
            self._exhausted = True
            await self._close_response()

    async def __aenter__(self) -> ChatCompletionStream:
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # A ``break`` out of a bare ``async for`` never calls aclose(); end the span here
        # (synchronously, cheap) and close the response on the loop if one is running.
        try:
            if self._call is None or self.status is not None:
                return
            if self._finish_at_ns is not None:  # every chunk was read; only the span was open
                self._finish_complete(self._finish_at_ns)
            else:
                self._call.end(sc.STATUS_INCOMPLETE, sc.REASON_CONSUMER_STOPPED)
            response = self.response
            if response is not None:
                loop = asyncio.get_running_loop()
                task = loop.create_task(response.aclose())
                _closing_tasks.add(task)
                task.add_done_callback(_closing_tasks.discard)
        except Exception:
            pass


def stream_chat_completion(
    client: httpx.AsyncClient,
    url: str,
    payload: dict[str, Any],
    *,
    stage: str | None = "model",
    headers: dict[str, str] | None = None,
    on_chunk: OnChunk | None = None,
) -> ChatCompletionStream:
    """POST ``payload`` to an OpenAI-compatible ``url`` with ``stream: true`` and iterate the
    parsed JSON chunks (``async for chunk in stream_chat_completion(...)``).

    One CLIENT span per call; ``stage`` sets ``inferpath.stage`` (``"model"`` for a call
    inside a service; ``None`` for an end-user client at the root of a trace). ``headers``
    are sent with the request, plus ``traceparent``. ``on_chunk(chunk, received_ns)`` is
    called for each chunk with its receipt time (``time.perf_counter_ns``). The returned
    :class:`ChatCompletionStream` exposes ``timeline`` (TTFT, ITL, E2E, tokens) after the end.

    Raises ``TypeError``/``ValueError`` for a non-dict payload or unknown stage (setup
    errors); transport errors and HTTP statuses ≥ 400 (``httpx.HTTPStatusError``) are
    recorded on the span and re-raised from the iteration.
    """
    return ChatCompletionStream(client, url, payload, stage=stage, headers=headers, on_chunk=on_chunk)
