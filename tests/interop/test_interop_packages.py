"""The instrumentations teams already run, for real: an app instrumented with
opentelemetry-instrumentation-openai-v2, OpenLLMetry (traceloop-sdk), OpenInference or
Langfuse (``interop_app.py``, its own process) streams chat completions through the
``openai`` client from a scripted OpenAI-compatible server on 127.0.0.1 and exports its
spans over OTLP/HTTP to a real inferpath server (embedded chDB). Each stored row is checked
twice (docs/interop.md):

1. **Against the source's own stamps, exactly.** The app keeps an in-memory copy of the very
   spans it exports; the row's TTFT must equal the source's first-token (or first-chunk)
   stamp minus the span's start, as stored (both truncated to the µs, as the receiver stores
   span and event times), and its E2E the span's duration. This is inferpath's accuracy:
   0 ns error, on every row, whatever the load.
2. **Against the client's own clock,** which stamps other moments of the same process: the
   source's span starts inside the client's call, after the ``openai`` SDK built the request
   (the *start lag*: OpenLLMetry and Langfuse ≈ 0.2-0.4 ms; OpenInference, whose span starts
   only in ``OpenAI.request``, 0.8-1.9 ms on this 2-core machine), and the source stamps the
   first token (OpenLLMetry, in its wrapper's ``__next__`` before the chunk reaches the
   client: ≈ 0.1 ms) or the first chunk (OpenInference, Langfuse: the role chunk, one chunk
   parse before the client's first content: ≈ 0.2-0.4 ms) before the client's loop sees it
   (the *first-token lag*). The source's TTFT is the client's less these two lags, each
   measured per row on the SDK's clock. Neither is microseconds because the two stamps are
   not taken at the same moment: between them runs the SDK's and the wrapper's code, and
   under a busy neighbour the client's thread may wait for a CPU there. With a load average
   of 14-40 on 2 cores, single rows reached 28 ms (OpenInference) and 155 ms (Langfuse), each
   within 2 ms of the thread's measured run-queue wait; beside a second test worker, one row
   of 20 exceeded it by 0.3 ms. So the first-token lag less the client's off-CPU time (its
   run-queue wait in ``/proc/thread-self/schedstat`` plus its process's other threads' CPU
   time over the same window, ``interop_app.py``) is held to 2 ms at the median of the rows,
   and each row to 1 s (a hang); the start lag, the source's definition of where a request
   starts rather than an error, is held to 10 ms the same way. The share of rows within
   2 ms on a quiet machine is a benchmark (docs/interop.md).
"""

from __future__ import annotations

import json
import os
import statistics
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
REQUESTS = int(os.environ.get("INFERPATH_INTEROP_REQUESTS", "20"))
"""Requests per source; raised on a quiet machine to measure the share of rows within 2 ms
(docs/interop.md), e.g. ``INFERPATH_INTEROP_REQUESTS=300 pytest tests/interop -s -k instrumentation``."""
TTFT_TOLERANCE_NS = 2_000_000
#: The span's start after the client's call began: the openai SDK's request building, which
#: OpenInference's span (started in ``OpenAI.request``) leaves out: 0.8-1.9 ms of CPU on this
#: 2-core machine under load; 10 ms with room, the source's definition, not an error.
START_LAG_BOUND_NS = 10_000_000
#: A stamp this late is a hang, not a scheduling delay.
HANG_NS = 1_000_000_000
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
    done = subprocess.run(
        [sys.executable, str(APP), source, server_url, model_base_url, str(REQUESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    measured = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(measured) == REQUESTS + 1, done.stdout + done.stderr[-3000:]
    return measured


def stored_rows(server_url: str, since: datetime) -> list[dict]:
    with httpx.Client(base_url=server_url, timeout=30) as http:
        assert http.post("/api/v1/flush", timeout=120).json()["ok"]
        rows = http.get(
            "/api/v1/requests",
            params={
                "start": since.isoformat(),
                "end": (datetime.now(timezone.utc) + timedelta(minutes=1)).isoformat(),
                "limit": 1000,
            },
        ).json()["requests"]
    return sorted(rows, key=lambda row: row["timestamp"])


@pytest.fixture()
def inferpath_server(store_url: str):
    with serve_in_thread(Settings(store_url=store_url, assembly_settle_seconds=0.2), port=0) as running:
        yield running


def off_cpu_ns(window: dict) -> int:
    """Time the client's main thread was kept from running inside a window: its run-queue wait
    plus its process's other threads' CPU time (``interop_app.py``)."""
    return window["run_queue_wait_ns"] + window["other_threads_cpu_ns"]


def source_first_stamp_ns(source: str, span: dict) -> int:
    """The source's own first-token (OpenLLMetry) or first-chunk stamp, Unix ns, read from the
    app's copy of its span by the rule of docs/interop.md."""
    if source == "openllmetry":
        return sorted(at for name, at in span["events"] if name == "gen_ai.content.completion.chunk")[1]
    if source == "openinference":
        return next(at for name, at in span["events"] if name == "First Token Stream Event")
    if source == "langfuse":
        text = span["attributes"]["langfuse.observation.completion_start_time"]  # JSON-quoted ISO 8601
        moment = datetime.fromisoformat(json.loads(text) if text.startswith('"') else text)
        return (moment - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1) * 1000
    raise ValueError(source)


@pytest.mark.parametrize(
    ("source", "script", "ttft_source"),
    [
        ("openllmetry", EARLY_ROLE, "openllmetry.chunk_events"),
        ("openinference", ROLE_WITH_FIRST_TOKEN, "openinference.first_token_event"),
        ("langfuse", ROLE_WITH_FIRST_TOKEN, "langfuse.completion_start_time"),
        ("openai-v2", ROLE_WITH_FIRST_TOKEN, None),
    ],
)
def test_rows_of_a_real_instrumentation_match_the_clients_own_measurement(
    inferpath_server, source: str, script, ttft_source: str | None
) -> None:
    since = datetime.now(timezone.utc) - timedelta(minutes=1)
    with ScriptedSSEServer(script) as model_server:
        measured = run_app(source, inferpath_server.url, model_server.base_url)
    rows = {row["trace_id"]: row for row in stored_rows(inferpath_server.url, since)}
    assert len(rows) == REQUESTS + 1, rows
    lags, start_lags, end_lags = [], [], []
    for client in measured[1:]:  # the first request warms the client up
        span, wall = client["span"], client["wall"]
        row = rows[span["trace_id"]]
        assert (
            (row["input_tokens"], row["output_tokens"]) == (client["input_tokens"], client["output_tokens"]) == (7, 4)
        )
        assert row["model"] and row["status"] == "ok"
        ttft_off_cpu_ns, e2e_off_cpu_ns = off_cpu_ns(client["ttft_window"]), off_cpu_ns(client["e2e_window"])
        # 1. The source's own stamps: E2E is the span's duration, to the ns.
        assert row["client_e2e_ns"] == span["end_ns"] - span["start_ns"], (row, span)
        # 2. The client's clock (wall stamps, the SDK's clock): the span lies inside the call; it
        # starts after the SDK built the request (start lag) and ends when the stream is spent.
        start_lag_ns, end_lag_ns = span["start_ns"] - wall["start_ns"], wall["end_ns"] - span["end_ns"]
        assert 0 <= start_lag_ns <= HANG_NS and 0 <= end_lag_ns <= HANG_NS, (start_lag_ns, end_lag_ns, client)
        start_lags.append(start_lag_ns - ttft_off_cpu_ns)
        end_lags.append(end_lag_ns - e2e_off_cpu_ns)
        if ttft_source is None:
            assert row["client_ttft_ns"] is None and row["ttft_source"] == ""
            assert row["missing_measures"].startswith(
                "ttft: opentelemetry-instrumentation-openai-v2 (util-genai) records no per-chunk timing; add "
                "inferpath.instrument()"
            ), row["missing_measures"]
            continue
        assert row["ttft_source"] == ttft_source and row["missing_measures"] == ""
        assert row["itl_ns"] == round((row["client_e2e_ns"] - row["client_ttft_ns"]) / 3)
        # 1. TTFT is the source's first stamp − the span's start, as stored (µs): exactly.
        first_ns = source_first_stamp_ns(source, span)
        assert row["client_ttft_ns"] == (first_ns // 1000 - span["start_ns"] // 1000) * 1000, (row, span)
        # 2. The source stamps the first token (or chunk) before the client's loop sees it (the
        # client's stamp follows within 2 ms of the client thread's running time: the medians below).
        first_lag_ns = wall["first_ns"] - first_ns
        assert 0 <= first_lag_ns <= HANG_NS, (first_lag_ns, client)
        # So the source's TTFT is the client's less the two lags (±50 µs: the client's TTFT is on
        # perf_counter, the lags on time_ns; NTP may slew one against the other by 500 ppm).
        client_minus_row_ns = client["ttft_ns"] - row["client_ttft_ns"]
        assert abs(client_minus_row_ns - (start_lag_ns + first_lag_ns)) <= 50_000, (client_minus_row_ns, client)
        lags.append((client_minus_row_ns, start_lag_ns, first_lag_ns, ttft_off_cpu_ns))
    # Per row, a neighbour busy on the CPU can run between two stamps for longer than the
    # off-CPU time the client measures (xdist's other worker, a build): the lags' running time
    # is held at the median, where one delayed row cannot move it and a systematic lag would.
    assert statistics.median(start_lags) <= START_LAG_BOUND_NS, sorted(start_lags)
    assert statistics.median(end_lags) <= TTFT_TOLERANCE_NS, sorted(end_lags)
    if lags:
        assert statistics.median(lag[2] - lag[3] for lag in lags) <= TTFT_TOLERANCE_NS, sorted(lags)
        print(
            f"\n{source}: {len(lags)} rows, client TTFT − row TTFT (ms): "
            + ", ".join(
                f"{name} median {statistics.median(v) / MS:.3f} max {max(v) / MS:.3f}"
                for name, v in (
                    ("all", [lag[0] for lag in lags]),
                    ("start lag", [lag[1] for lag in lags]),
                    ("first-token lag", [lag[2] for lag in lags]),
                )
            )
            + f"; within 2 ms: {sum(lag[0] <= TTFT_TOLERANCE_NS for lag in lags) / len(lags):.1%}"
            + f"; rows over 2 ms: {sum(lag[0] > TTFT_TOLERANCE_NS for lag in lags)}, of which off the CPU "
            f"longer than the excess: {sum(TTFT_TOLERANCE_NS < lag[0] <= TTFT_TOLERANCE_NS + lag[3] for lag in lags)}"
        )
