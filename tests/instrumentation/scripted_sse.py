"""A scripted OpenAI-compatible SSE server on a raw socket, for exact chunk timing.

Each connection: read one HTTP/1.1 request, answer with the status line and SSE headers,
then write each ``(at_ms, bytes)`` of the script at ``at_ms`` after the request arrived
(TCP_NODELAY, so a write is one TCP segment and splits inside JSON reach the client as two
reads), then close. Runs its own asyncio loop in a thread, so sync and async clients can
use it. ``written_at[i]`` is ``perf_counter()`` as write ``i`` of the latest request began
(the same monotonic clock as the client, same process), ``all_written_at`` those lists of
every request in the order they finished; ``arrived_at`` when the latest request had been
read.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any


def chunk(delta: dict, *, finish: str | None = None, model: str = "emulated-7b") -> dict:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


ROLE = chunk({"role": "assistant", "content": ""})
FINISH = chunk({}, finish="stop")


def usage(completion_tokens: int, prompt_tokens: int = 7) -> dict:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "emulated-7b",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def frame(data: dict | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return f"data: {text}\n\n".encode()


def content(text: str) -> dict:
    return chunk({"content": text})


LO = frame(content("lo"))
SPLIT_AT = LO.index(b'"lo"') + 2  # inside the JSON string

#: Case 3 of the instrumentation issue, times in ms after the request arrived.
CASE3_SCRIPT = [
    (5, frame(ROLE)),
    (800, frame(content("Hel"))),
    (850, LO[:SPLIT_AT]),
    (851, LO[SPLIT_AT:]),
    (900, frame(FINISH)),
    (905, frame(usage(2))),
    (906, frame("[DONE]")),
]


def scaled(script: list[tuple[int, bytes]], factor: float) -> list[tuple[int, bytes]]:
    return [(int(at_ms * factor), data) for at_ms, data in script]


class ScriptedSSEServer:
    """``with ScriptedSSEServer(script) as server: server.url`` — see the module docstring.
    ``status_line`` replaces ``HTTP/1.1 200 OK``; ``json_body`` answers with one JSON body
    instead of SSE."""

    def __init__(
        self, script: list[tuple[int, bytes]], *, status_line: bytes = b"HTTP/1.1 200 OK", json_body: dict | None = None
    ) -> None:
        self.script = script
        self.status_line = status_line
        self.json_body = json_body
        self.requests: list[bytes] = []
        self.written_at: list[float] = []
        self.all_written_at: list[list[float]] = []
        self.arrived_at = 0.0  # perf_counter() when the latest request was read
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def __enter__(self) -> ScriptedSSEServer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("scripted server did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=256))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            self.requests.append(head + await reader.readexactly(length))
            arrived = time.perf_counter()
            self.arrived_at = arrived
            if self.json_body is not None:
                body = json.dumps(self.json_body).encode()
                writer.write(
                    self.status_line
                    + b"\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                return
            writer.write(
                self.status_line + b"\r\ncontent-type: text/event-stream\r\n"
                b"cache-control: no-cache\r\nconnection: close\r\n\r\n"
            )
            await writer.drain()
            written_at: list[float] = []
            for at_ms, data in self.script:
                delay = arrived + at_ms / 1000 - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                written_at.append(time.perf_counter())  # as the bytes go to the kernel
                writer.write(data)
                await writer.drain()
            self.written_at = written_at
            self.all_written_at.append(written_at)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
