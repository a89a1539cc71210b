"""The demo gateway in front of a model server that is not listening (down, or still loading,
as vLLM is for its first minute): each call is answered 503 with a sentence naming the model
server, before any byte of a stream, so that the caller sees a failed request and its
gateway span an error with that status (not a 200 cut off mid-stream)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_gateway_answers_503_naming_the_model_server_that_is_down() -> None:
    port, engine_port = _closed_port(), _closed_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    gateway = subprocess.Popen(
        [sys.executable, "-m", "inferpath.demo.gateway", "--port", str(port), "--engine-url", engine_url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
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
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
        for stream in (True, False):
            response = httpx.post(f"{base}/v1/chat/completions", json={**body, "stream": stream}, timeout=30)
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert error["message"] == f"the model server at {engine_url} is not reachable (ConnectError)"
            assert error["code"] == 503
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
    assert "Traceback" not in (gateway.stderr.read() if gateway.stderr else "")
