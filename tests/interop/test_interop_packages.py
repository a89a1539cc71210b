"""The instrumentations teams already run, for real: an app instrumented with
opentelemetry-instrumentation-openai-v2, OpenLLMetry (traceloop-sdk), OpenInference or
Langfuse (``interop_app.py``, its own process) streams chat completions through the
``openai`` client from a scripted OpenAI-compatible server on 127.0.0.1 and exports its
spans over OTLP/HTTP to a real inferpath server (embedded chDB). Each stored row's TTFT, E2E
and tokens are checked against what the client measured itself: TTFT within 2 ms where the
source has a first-token or first-chunk time, else the row says why TTFT is missing
(docs/interop.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "instrumentation"))
from scripted_sse import FINISH, ROLE, ScriptedSSEServer, content, frame, usage  # noqa: E402

APP = Path(__file__).resolve().parent / "interop_app.py"
REQUESTS = 5
TTFT_TOLERANCE_NS = 2_000_000
MS = 1_000_000

_TOKENS = [(40, "Hel"), (50, "lo"), (60, " wor"), (70, "ld")]
_TAIL = [(80, frame(FINISH)), (81, frame(usage(4))), (82, frame("[DONE]"))]
#: The role-only chunk at once, the first token 40 ms later (OpenAI-compatible servers that
#: answer the role before prefill): a first-chunk time is not TTFT here.
EARLY_ROLE = [(5, frame(ROLE)), *[(at, frame(content(text))) for at, text in _TOKENS], *_TAIL]
#: The role-only chunk with the first token (vLLM, OpenAI): first chunk ≈ first token.
ROLE_WITH_FIRST_TOKEN = [(40, frame(ROLE)), *[(at, frame(content(text))) for at, text in _TOKENS], *_TAIL]


def run_app(source: str, server_url: str, model_base_url: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACELOOP_", "LANGFUSE_"))}
    env.update(TRACELOOP_TELEMETRY="false", TRACELOOP_METRICS_ENABLED="false", TRACELOOP_LOGGING_ENABLED="false")
    done = subprocess.run([sys.executable, str(APP), source, server_url, model_base_url, str(REQUESTS)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(measured) == REQUESTS + 1, done.stdout + done.stderr[-3000:]
    return measured


def stored_rows(server_url: str, since: datetime) -> list[dict]:
    with httpx.Client(base_url=server_url, timeout=30) as http:
        assert http.post("/api/v1/flush").json()["ok"]
        rows = http.get("/api/v1/requests", params={
            "start": since.isoformat(), "end": (datetime.now(timezone.utc) + timedelta(minutes=1)).isoformat(),
            "limit": 1000}).json()["requests"]
    return sorted(rows, key=lambda row: row["timestamp"])


@pytest.fixture()
def inferpath_server(store_url: str):
    with serve_in_thread(Settings(store_url=store_url, assembly_settle_seconds=0.2), port=0) as running:
        yield running


@pytest.mark.parametrize(("source", "script", "ttft_source"), [
    ("openllmetry", EARLY_ROLE, "openllmetry.chunk_events"),
    ("openinference", ROLE_WITH_FIRST_TOKEN, "openinference.first_token_event"),
    ("langfuse", ROLE_WITH_FIRST_TOKEN, "langfuse.completion_start_time"),
    ("openai-v2", ROLE_WITH_FIRST_TOKEN, None),
])
def test_rows_of_a_real_instrumentation_match_the_clients_own_measurement(
        inferpath_server, source: str, script, ttft_source: str | None) -> None:
    since = datetime.now(timezone.utc) - timedelta(minutes=1)
    with ScriptedSSEServer(script) as model_server:
        measured = run_app(source, inferpath_server.url, model_server.base_url)
    rows = stored_rows(inferpath_server.url, since)
    assert len(rows) == REQUESTS + 1, rows
    pairs = list(zip(rows, measured))[1:]  # the first request warms the client up
    for row, client in pairs:
        assert (row["input_tokens"], row["output_tokens"]) == (client["input_tokens"], client["output_tokens"]) == (7, 4)
        assert row["model"] and row["status"] == "ok"
        # The span starts inside the client's call (after the SDK built the request) and ends
        # with the stream: a few hundred µs less than the client's E2E, more when the loaded
        # machine delays the client between its clock read and the instrumentation's.
        assert 0 <= client["e2e_ns"] - row["client_e2e_ns"] <= 50 * MS, (row, client)
        if ttft_source is None:
            assert row["client_ttft_ns"] is None and row["ttft_source"] == ""
            assert row["missing_measures"].startswith(
                "ttft: opentelemetry-instrumentation-openai-v2 (util-genai) records no per-chunk timing; add "
                "inferpath.instrument()"), row["missing_measures"]
            continue
        assert row["ttft_source"] == ttft_source and row["missing_measures"] == ""
        assert row["itl_ns"] == round((row["client_e2e_ns"] - row["client_ttft_ns"]) / 3)
        # First token → end of stream, on both sides: independent of where the span starts.
        # Per row, a hang guard (a loaded machine can delay one side's clock read by a few ms);
        # the 2 ms figure is checked on the median row below.
        after_first_token = (row["client_e2e_ns"] - row["client_ttft_ns"]) - (client["e2e_ns"] - client["ttft_ns"])
        assert abs(after_first_token) <= 50 * MS, (row, client)
    if ttft_source is not None:
        # TTFT itself, against the client's own clock, and the time after the first token: within
        # 2 ms (the median row; a single row can lose more on a loaded 2-core machine, see above).
        errors = sorted(abs(row["client_ttft_ns"] - client["ttft_ns"]) for row, client in pairs)
        assert errors[len(errors) // 2] <= TTFT_TOLERANCE_NS, errors
        after = sorted(abs((row["client_e2e_ns"] - row["client_ttft_ns"]) - (client["e2e_ns"] - client["ttft_ns"]))
                       for row, client in pairs)
        assert after[len(after) // 2] <= TTFT_TOLERANCE_NS, after
