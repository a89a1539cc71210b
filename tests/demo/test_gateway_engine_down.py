"""The demo gateway in front of a model server that fails: one that is not listening (down,
or still loading, as vLLM is for its first minute) is answered 503 with a sentence naming it,
before any byte of a stream; one that breaks off mid-stream gets an error event and no
``[DONE]`` (502 when not streaming). The caller sees a failed request, never a 200 cut short,
and the gateway logs no traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _gateway(engine_url: str) -> Iterator[tuple[str, list[str]]]:
    """A real gateway process in front of ``engine_url``; yields its URL and, after the block,
    fills the list with its stderr lines."""
    port = _closed_port()
    gateway = subprocess.Popen(
        [sys.executable, "-m", "inferpath.demo.gateway", "--port", str(port), "--engine-url", engine_url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr: list[str] = []
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert gateway.poll() is None, gateway.stderr.read() if gateway.stderr else "gateway exited"
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the gateway did not answer /health in 90 s"
            time.sleep(0.2)
        yield base, stderr
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
        stderr.extend((gateway.stderr.read() if gateway.stderr else "").splitlines())


def test_gateway_answers_503_naming_the_model_server_that_is_down() -> None:
    engine_url = f"http://127.0.0.1:{_closed_port()}"
    with _gateway(engine_url) as (base, stderr):
        for stream in (True, False):
            response = httpx.post(f"{base}/v1/chat/completions", json={**BODY, "stream": stream}, timeout=30)
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert error["message"] == f"the model server at {engine_url} is not reachable (ConnectError)"
            assert error["code"] == 503
    assert not any("Traceback" in line for line in stderr), stderr


def _engine_that_breaks_off(stop: threading.Event) -> tuple[str, threading.Thread]:
    """A real TCP server on loopback that answers every request with a 200 event stream
    announcing 100 kB, sends one completion chunk and closes the connection."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    chunk = json.dumps({"choices": [{"index": 0, "text": "hi"}]})
    reply = (
        f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 100000\r\n\r\ndata: {chunk}\n\n"
    ).encode()

    def serve() -> None:
        with server:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(5)
                    request = b""
                    while b"\r\n\r\n" not in request:
                        request += conn.recv(65536)
                    head, _, rest = request.partition(b"\r\n\r\n")
                    length = next(
                        (
                            int(line.split(b":")[1])
                            for line in head.split(b"\r\n")
                            if line.lower().startswith(b"content-length")
                        ),
                        0,
                    )
                    while len(rest) < length:
                        rest += conn.recv(65536)
                    conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{server.getsockname()[1]}", thread


def test_a_model_server_that_breaks_off_mid_stream_is_an_error_not_a_short_answer() -> None:
    stop = threading.Event()
    engine_url, thread = _engine_that_breaks_off(stop)
    try:
        with _gateway(engine_url) as (base, stderr):
            streamed = httpx.post(f"{base}/v1/chat/completions", json={**BODY, "stream": True}, timeout=30)
            events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
            assert streamed.status_code == 200 and "[DONE]" not in events, streamed.text
            assert json.loads(events[1])["choices"][0]["delta"]["content"] == "hi"
            error = json.loads(events[-1])["error"]
            assert error["message"].startswith(f"the model server at {engine_url} broke off the stream")
            whole = httpx.post(f"{base}/v1/chat/completions", json={**BODY, "stream": False}, timeout=30)
            assert whole.status_code == 502, whole.text
            assert whole.json()["error"]["message"].startswith(f"the model server at {engine_url} broke off")
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not any("Traceback" in line for line in stderr), stderr
