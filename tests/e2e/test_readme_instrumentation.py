"""The README's one-line setup on a real path: a FastAPI gateway of the user's own (a
subprocess), instrumented as the README shows, streaming from the demo engine (a subprocess
exporting its own engine spans), into a real inferpath server. One request row per request,
with the engine's parts joined to it, and the admin route the README excludes left out."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from inferpath.config import Settings
from inferpath.demo.processes import free_port, start_module
from inferpath.server.runtime import serve_in_thread

pytestmark = pytest.mark.e2e

GATEWAY = """
import os

import httpx
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

import inferpath

app = FastAPI()
inferpath.instrument(app, service_name="gateway", endpoint_class="interactive", integrations=True)
ENGINE = os.environ["ENGINE_URL"]


@app.post("/v1/chat/completions")
async def chat(body: dict) -> StreamingResponse:
    client = httpx.AsyncClient(timeout=60)

    async def relay():
        async with client.stream("POST", f"{ENGINE}/v1/chat/completions", json=body) as response:
            async for chunk in response.aiter_raw():
                yield chunk
        await client.aclose()

    return StreamingResponse(relay(), media_type="text/event-stream")


@app.post("/admin/reload")
async def reload() -> dict:
    return {"ok": True}
"""


def test_the_readme_setup_gives_one_row_per_request_with_the_engine_joined(tmp_path: Path) -> None:
    server = serve_in_thread(Settings(store_url=f"chdb://{tmp_path / 'store'}", assembly_settle_seconds=0.5), port=0)
    engine = gateway = None
    try:
        engine_port = free_port()
        engine = start_module(
            "engine",
            "inferpath.demo.engine",
            ["--port", str(engine_port), "--otlp-endpoint", server.url, "--time-scale", "0.05"],
            port=engine_port,
            log_path=str(tmp_path / "engine.log"),
        )
        engine.wait_ready("/health")
        (tmp_path / "gateway_app.py").write_text(GATEWAY)
        gateway_port = free_port()
        env = {
            **os.environ,
            "ENGINE_URL": engine.url,
            "INFERPATH_OTLP_ENDPOINT": server.url,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_PYTHON_FASTAPI_EXCLUDED_URLS": "^/admin/",
        }
        gateway = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "gateway_app:app", "--port", str(gateway_port), "--log-level", "warning"],
            cwd=tmp_path,
            env=env,
        )
        base = f"http://127.0.0.1:{gateway_port}"
        deadline = time.monotonic() + 60
        while True:
            assert gateway.poll() is None and time.monotonic() < deadline, "the gateway did not start"
            try:
                httpx.get(f"{base}/healthz", timeout=1.0)  # any answer will do; probes are not traced
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        body = {
            "model": "llama2-70b",
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for _ in range(5):
            with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as response:
                assert response.status_code == 200
                assert "data:" in "".join(response.iter_text())
        assert httpx.post(f"{base}/admin/reload", timeout=10).json() == {"ok": True}
        gateway.terminate()  # its exporter flushes on shutdown
        gateway.wait(30)
        rows: list[dict] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            server.runtime.flush()
            rows = server.runtime.store.query_dicts(
                "SELECT service_name, endpoint, ttft_ns, queue_ns, prefill_ns, missing_measures FROM inferpath_requests FINAL"
            )
            if len(rows) >= 5 and all(r["queue_ns"] is not None for r in rows):
                break
            time.sleep(0.5)
        assert len(rows) == 5, [
            (r["service_name"], r["endpoint"], r["missing_measures"]) for r in rows
        ]  # not 10 (the engine's own rows), not 6 (the admin route)
        assert all(r["ttft_ns"] and r["queue_ns"] is not None and r["prefill_ns"] for r in rows), rows
        assert {r["service_name"] for r in rows} == {"gateway"}, rows
    finally:
        if gateway is not None and gateway.poll() is None:
            gateway.kill()
            gateway.wait(10)
        if engine is not None:
            engine.stop()
        server.stop()
