"""Issue cases on the real server and embedded chDB: concurrent reads during an insert
(case 2) and the recorded vLLM bodies, load and start-up, posted as they are (case 3)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from inferpath.analysis.startup import fetch_startups
from inferpath.config import Settings
from inferpath.server.derive import seconds_to_ns
from inferpath.server.otlp import decode_trace_request
from inferpath.server.runtime import serve_in_thread

from .otlp_factory import trace_body

pytestmark = pytest.mark.e2e

PROTOBUF = {"content-type": "application/x-protobuf"}


def test_twelve_concurrent_reads_during_an_insert_all_succeed(store_url: str) -> None:
    with serve_in_thread(Settings(store_url=store_url, assembly_settle_seconds=0.1), port=0) as running:
        with httpx.Client(base_url=running.url, timeout=60.0) as http:
            first, first_ids = trace_body(spans_per_trace=20, traces=50)
            assert http.post("/v1/traces", content=first, headers=PROTOBUF).status_code == 200
            assert http.post("/api/v1/flush", timeout=120).json()["ok"]
        trace_id = next(iter(first_ids))
        now = time.time()
        window = {"start": str(now - 600), "end": str(now + 600)}
        paths = [
            ("/api/v1/summary", window),
            ("/api/v1/requests", {**window, "limit": 50}),
            ("/api/v1/requests/count", window),
            (f"/api/v1/traces/{trace_id}", None),
            ("/api/v1/timeseries/ttft", {**window, "step_seconds": 10}),
            ("/api/v1/requests", {**window, "order": "slowest", "limit": 10}),
        ]
        bodies = [trace_body(spans_per_trace=50, traces=40)[0] for _ in range(6)]  # 12 000 spans
        insert_statuses: list[int] = []
        results: list[tuple[str, int, str]] = []
        lock = threading.Lock()
        inserting = threading.Event()

        def insert() -> None:
            with httpx.Client(base_url=running.url, timeout=60.0) as http:
                for body in bodies:
                    inserting.set()
                    insert_statuses.append(http.post("/v1/traces", content=body, headers=PROTOBUF).status_code)

        def read(worker: int) -> None:
            inserting.wait(10)
            with httpx.Client(base_url=running.url, timeout=60.0) as http:
                for round_ in range(4):
                    path, params = paths[(worker + round_) % len(paths)]
                    response = http.get(path, params=params)
                    with lock:
                        results.append((path, response.status_code, response.text[:300]))

        threads = [threading.Thread(target=insert)] + [threading.Thread(target=read, args=(n,)) for n in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads), "a reader or the insert hung (deadlock)"
        assert insert_statuses == [200] * len(bodies)
        assert len(results) == 48
        failures = [r for r in results if r[1] != 200]
        assert not failures, failures[:3]
        assert not [r for r in results if "session" in r[2].lower() or "lock" in r[2].lower()]
        # A 200 means logged: flush drains the span log before counting.
        with httpx.Client(base_url=running.url, timeout=60.0) as http:
            assert http.post("/api/v1/flush", timeout=120).json()["ok"]
        rows = running.runtime.store.query("SELECT count() FROM otel_traces")[0][0]
        assert rows == 1000 + 12_000


def test_recorded_vllm_bodies_give_rows_equal_to_vllm_latencies_and_a_cold_start(
    shared_data: Path, store_url: str
) -> None:
    capture = shared_data / "vllm_live_capture"
    files = sorted((capture / "otlp").glob("*.pb")) + sorted((capture / "startup_otlp").glob("*.pb"))
    engine_spans = defaultdict(list)
    for path in files:
        for span in decode_trace_request(
            path.read_bytes(), content_type="application/x-protobuf", content_encoding=None
        ).spans:
            if span.span_name == "llm_request":
                engine_spans[span.trace_id].append(span)
    assert sum(len(v) for v in engine_spans.values()) >= 100
    with serve_in_thread(Settings(store_url=store_url, assembly_settle_seconds=0.1), port=0) as running:
        with httpx.Client(base_url=running.url, timeout=60.0) as http:
            for path in files:  # as vLLM sent them: unchanged bytes
                assert http.post("/v1/traces", content=path.read_bytes(), headers=PROTOBUF).status_code == 200
            assert http.post("/api/v1/flush", timeout=120).json()["ok"]
            window = {"start": "2026-11-29T00:00:00Z", "end": "2026-12-02T00:00:00Z"}
            rows = http.get("/api/v1/requests", params={**window, "limit": 10_000}).json()["requests"]
        by_trace = {row["trace_id"]: row for row in rows}
        assert set(by_trace) == set(engine_spans)
        for trace_id, spans in engine_spans.items():
            # Several llm_request spans in one trace (clients re-using a traceparent): the
            # earliest one supplies the row (docs/telemetry-contract.md).
            span = min(spans, key=lambda s: (s.start_ns, s.span_id))
            row = by_trace[trace_id]
            for column, attribute in (
                ("queue_ns", "gen_ai.latency.time_in_queue"),
                ("prefill_ns", "gen_ai.latency.time_in_model_prefill"),
                ("decode_ns", "gen_ai.latency.time_in_model_decode"),
            ):
                assert row[column] == seconds_to_ns(float(span.span_attributes[attribute])), (trace_id, column)
        # The start-up spans: stored, and found as a cold start of that service.
        startups = fetch_startups(
            running.runtime.store,
            datetime(2026, 11, 29, tzinfo=timezone.utc),
            datetime(2026, 12, 2, tzinfo=timezone.utc),
        )
        # Two engine starts were recorded: the load run's own (vllm-tiny, in otlp/) and the
        # detailed one of startup_otlp/ (vLLM's default service name).
        by_service = {startup.service_name: startup for startup in startups}
        assert len(startups) == 2 and set(by_service) == {"vllm-tiny", "unknown_service:python"}
        startup = by_service["unknown_service:python"]
        assert 30 < startup.loading_seconds < 40  # the README's 35 s CPU start-up
        assert startup.ready_at - startup.started_at == timedelta(seconds=startup.loading_seconds)
        for startup in startups:
            assert {"Load weights", "Allocate KV cache", "Warmup (CPU)"} <= set(startup.phases_seconds)
