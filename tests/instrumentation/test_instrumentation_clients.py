"""stream_chat_completion against a scripted SSE server on 127.0.0.1.

The server writes raw bytes at scripted times (ms after the request arrived), so chunk
boundaries inside JSON, role-only, finish-only and usage-only chunks are exactly as a
real OpenAI-compatible server sends them.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from inferpath.instrumentation.clients import stream_chat_completion

ROLE = {
    "id": "c1",
    "object": "chat.completion.chunk",
    "model": "emulated-7b",
    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
}


def content(text: str) -> dict:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "emulated-7b",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }


FINISH = {
    "id": "c1",
    "object": "chat.completion.chunk",
    "model": "emulated-7b",
    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
}
USAGE = {
    "id": "c1",
    "object": "chat.completion.chunk",
    "model": "emulated-7b",
    "choices": [],
    "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
}


def frame(chunk: dict | str) -> bytes:
    data = chunk if isinstance(chunk, str) else json.dumps(chunk)
    return f"data: {data}\n\n".encode()


LO = frame(content("lo"))
SPLIT = LO.index(b'"lo"') + 2  # inside the JSON string

TTFT_SCRIPT = [
    (5, frame(ROLE)),
    (800, frame(content("Hel"))),
    (840, LO[:SPLIT]),
    (850, LO[SPLIT:]),
    (900, frame(FINISH)),
    (905, frame(USAGE)),
    (906, frame("[DONE]")),
]
NO_TOKEN_SCRIPT = [(5, frame(ROLE)), (60, frame(FINISH)), (65, frame(USAGE)), (66, frame("[DONE]"))]
# A token every 20 ms for 2 s: a consumer that waited for the end would take > 2 s.
LONG_SCRIPT = (
    [(5, frame(ROLE))] + [(20 + 20 * i, frame(content(f"t{i}"))) for i in range(100)] + [(2020, frame("[DONE]"))]
)


class ScriptedSSEServer:
    """HTTP/1.1 on a raw socket: reads one request, writes ``script`` at its times, closes."""

    def __init__(self, script: list[tuple[int, bytes]], status_line: bytes = b"HTTP/1.1 200 OK") -> None:
        self.script = script
        self.status_line = status_line
        self.requests: list[bytes] = []
        self.written_at: list[float] = []  # perf_counter() as each scripted write began
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def __aenter__(self) -> ScriptedSSEServer:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
        )
        self.requests.append(head + await reader.readexactly(length))
        arrived = time.perf_counter()
        writer.write(
            self.status_line + b"\r\ncontent-type: text/event-stream\r\n"
            b"cache-control: no-cache\r\nconnection: close\r\n\r\n"
        )
        await writer.drain()
        try:
            for at_ms, data in self.script:
                delay = arrived + at_ms / 1000 - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                # Stamped as the bytes go to the kernel: the client, on this loop, can read
                # them before drain() returns here.
                self.written_at.append(time.perf_counter())
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


PAYLOAD = {"model": "emulated-7b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


def client_spans(spans) -> list:
    return [s for s in spans.finished(wait_for=1) if s.kind is SpanKind.CLIENT]


LOOP_LATE_SECONDS = 0.05
"""How late the event loop may read bytes after they were written, on a host where another
process is busy; the stamps' accuracy on a quiet host is measured by ``bench/bench_accuracy.py``."""


def test_ttft_itl_and_tokens_follow_aiperf_and_match_the_callers_clock(spans) -> None:
    async def main() -> tuple[Any, float, list, bytes, list[float], float]:
        async with ScriptedSSEServer(TTFT_SCRIPT) as server, httpx.AsyncClient() as client:
            caller_start = time.perf_counter()
            caller_ttft = None
            chunks = []
            received: list[tuple[dict, int]] = []
            stream = stream_chat_completion(
                client, server.url, PAYLOAD, stage=None, on_chunk=lambda chunk, at_ns: received.append((chunk, at_ns))
            )
            async for chunk in stream:
                if caller_ttft is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    caller_ttft = time.perf_counter() - caller_start
                chunks.append(chunk)
            return stream, caller_ttft, chunks, server.requests[0], server.written_at, caller_start, received

    stream, caller_ttft, chunks, request, written_at, caller_start, received = asyncio.run(main())
    assert len(chunks) == 5
    timeline = stream.timeline
    # Against the schedule (loose: a loaded machine may stall the loop) and against the
    # moments the bytes were actually written (same process, same monotonic clock): never
    # before, and after by what the loop took to read them (13 ms once beside a process
    # burning a core; under 10 ms on a quiet host).
    hel_written, lo_written = written_at[1] - caller_start, written_at[3] - caller_start
    assert 0.795 <= timeline.ttft_seconds < 1.3  # never before the scripted 800 ms
    assert hel_written - 0.001 <= timeline.ttft_seconds < hel_written + LOOP_LATE_SECONDS
    # A caller with clock reads of its own brackets the span's (its start before, its stamp
    # after): it can only see a later TTFT, by whatever ran in between.
    assert 0 <= caller_ttft - timeline.ttft_seconds < 0.025
    # A caller on the span's own stamps (request start, on_chunk's receipt time) agrees exactly.
    first_content_ns = next(
        at_ns for chunk, at_ns in received if chunk["choices"] and chunk["choices"][0]["delta"].get("content")
    )
    assert (first_content_ns - timeline.start_ns) / 1e9 == timeline.ttft_seconds
    assert [chunk for chunk, _ in received] == chunks
    assert timeline.itl_list_seconds == [pytest.approx(lo_written - hel_written, abs=LOOP_LATE_SECONDS)]
    assert timeline.itl_seconds == timeline.itl_list_seconds[0]
    assert timeline.output_tokens == 2
    assert stream.status == "complete" and stream.reason is None

    [span] = client_spans(spans)
    assert span.name == "chat emulated-7b"
    attributes = span.attributes
    assert "inferpath.stage" not in attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "emulated-7b"
    assert attributes["gen_ai.request.max_tokens"] == 16
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["gen_ai.response.time_to_first_chunk"] == timeline.ttft_seconds
    assert attributes["inferpath.itl_seconds"] == timeline.itl_seconds
    assert attributes["gen_ai.usage.output_tokens"] == 2
    assert attributes["gen_ai.usage.input_tokens"] == 7
    assert attributes["inferpath.stream.status"] == "complete"
    assert attributes["inferpath.stream.chunks"] == 5
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    # The span ends at the last chunk: its duration is the E2E of the monotonic clock.
    assert (span.end_time - span.start_time) == pytest.approx(timeline.e2e_seconds * 1e9, abs=1)
    assert (
        written_at[-1] - caller_start - 0.001
        <= timeline.e2e_seconds
        < written_at[-1] - caller_start + LOOP_LATE_SECONDS
    )
    # The request carried this span's W3C context and asked for a stream.
    head, _, body = request.partition(b"\r\n\r\n")
    traceparent = (
        f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-{span.context.trace_flags:02x}"
    ).encode()
    assert b"traceparent: " + traceparent in head.lower()
    assert json.loads(body)["stream"] is True


def test_stream_without_visible_token_has_no_ttft_and_says_so(spans) -> None:
    async def main() -> Any:
        async with ScriptedSSEServer(NO_TOKEN_SCRIPT) as server, httpx.AsyncClient() as client:
            stream = stream_chat_completion(client, server.url, PAYLOAD)
            assert len([chunk async for chunk in stream]) == 3
            return stream

    stream = asyncio.run(main())
    assert stream.timeline.ttft_seconds is None and stream.timeline.itl_seconds is None
    [span] = client_spans(spans)
    assert span.attributes["inferpath.stage"] == "model"
    assert span.attributes["inferpath.stream.status"] == "incomplete"
    assert span.attributes["inferpath.stream.incomplete_reason"] == "no_visible_token"
    assert "gen_ai.response.time_to_first_chunk" not in span.attributes


def test_stream_cut_after_its_first_token_is_incomplete(spans) -> None:
    # The server closes its close-delimited body after one token: no finish_reason, no [DONE].
    async def main() -> Any:
        async with (
            ScriptedSSEServer([(5, frame(ROLE)), (20, frame(content("Hel")))]) as server,
            httpx.AsyncClient() as client,
        ):
            stream = stream_chat_completion(client, server.url, PAYLOAD)
            assert len([chunk async for chunk in stream]) == 2
            return stream

    stream = asyncio.run(main())
    assert stream.status == "incomplete" and stream.timeline.ttft_seconds > 0
    [span] = client_spans(spans)
    assert span.attributes["inferpath.stream.status"] == "incomplete"
    assert span.attributes["inferpath.stream.incomplete_reason"] == "stream_not_finished"
    assert span.attributes["gen_ai.response.time_to_first_chunk"] == stream.timeline.ttft_seconds


@pytest.mark.parametrize("how", ["break", "aclose", "async_with"])
def test_consumer_stopping_early_ends_one_span_incomplete(spans, how: str) -> None:
    async def main() -> None:
        async with ScriptedSSEServer(LONG_SCRIPT) as server, httpx.AsyncClient() as client:
            if how == "break":
                async for chunk in stream_chat_completion(client, server.url, PAYLOAD):
                    if chunk["choices"][0]["delta"].get("content") == "t2":
                        break
            elif how == "aclose":
                stream = stream_chat_completion(client, server.url, PAYLOAD)
                for _ in range(3):
                    await stream.__anext__()
                await stream.aclose()
                await stream.aclose()
                with pytest.raises(StopAsyncIteration):
                    await stream.__anext__()
            else:
                async with stream_chat_completion(client, server.url, PAYLOAD) as stream:
                    async for _ in stream:
                        break
            await asyncio.sleep(0.05)

    started = time.perf_counter()
    asyncio.run(main())
    assert time.perf_counter() - started < 1.5  # did not wait for the rest of the stream (2 s)
    [span] = client_spans(spans)
    assert span.attributes["inferpath.stream.status"] == "incomplete"
    assert span.attributes["inferpath.stream.incomplete_reason"] == "consumer_stopped"


def test_refused_connection_is_recorded_and_raised(spans) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket is closed

    async def main() -> None:
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.ConnectError):
                async for _ in stream_chat_completion(client, f"http://127.0.0.1:{port}/v1/completions", PAYLOAD):
                    pass

    asyncio.run(main())
    [span] = client_spans(spans)
    assert span.name == "text_completion emulated-7b"
    assert span.attributes["gen_ai.operation.name"] == "text_completion"
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["inferpath.stream.status"] == "incomplete"
    assert span.attributes["inferpath.stream.incomplete_reason"] == "error"


def test_http_error_status_is_recorded_and_raised(spans) -> None:
    async def main() -> None:
        server = ScriptedSSEServer([], status_line=b"HTTP/1.1 503 Service Unavailable")
        async with server, httpx.AsyncClient() as client:
            with pytest.raises(httpx.HTTPStatusError):
                async for _ in stream_chat_completion(client, server.url, PAYLOAD):
                    pass

    asyncio.run(main())
    [span] = client_spans(spans)
    assert span.attributes["http.response.status_code"] == 503
    assert span.attributes["error.type"] == "HTTPStatusError"
    assert span.attributes["inferpath.stream.incomplete_reason"] == "error"


def test_setup_errors_name_the_argument() -> None:
    client = httpx.AsyncClient()
    with pytest.raises(ValueError, match="stage"):
        stream_chat_completion(client, "http://127.0.0.1:1/v1/chat/completions", PAYLOAD, stage="inference")
    with pytest.raises(TypeError, match="payload"):
        stream_chat_completion(client, "http://127.0.0.1:1/v1/chat/completions", "{}")  # type: ignore[arg-type]
