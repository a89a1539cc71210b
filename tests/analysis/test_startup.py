"""Engine start-ups recognised from start-up spans: vLLM's real ones and the emulator's."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from live_capture import PROTOBUF, shifted_trace_body
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferpath.analysis.startup import fetch_startups, startups_from_spans
from inferpath.config import Settings
from inferpath.demo.engine.scheduler import EngineConfig
from inferpath.demo.engine.server import create_app
from inferpath.server.runtime import serve_in_thread
from inferpath.storage.rows import datetime_from_unix_ns


def test_real_vllm_startup_is_found_in_the_store_and_measured(shared_data: Path, store_url: str) -> None:
    files = sorted((shared_data / "vllm_live_capture" / "startup_otlp").glob("*.pb"))
    first_ns = int(files[0].name.split("_", 1)[0])
    offset_ns = time.time_ns() - first_ns - 600 * 10**9  # ten minutes ago: inside the store's TTL
    server = serve_in_thread(Settings(store_url=store_url, assembly_settle_seconds=0.2), port=0)
    try:
        with httpx.Client(base_url=server.url, timeout=30.0) as client:
            for path in files:
                assert (
                    client.post("/v1/traces", content=shifted_trace_body(path, offset_ns), headers=PROTOBUF).status_code
                    == 200
                )
            assert client.post("/api/v1/flush", timeout=120).json()["ok"] is True
        around = datetime_from_unix_ns(first_ns + offset_ns)
        startups = fetch_startups(server.runtime.store, around - timedelta(minutes=5), around + timedelta(minutes=5))
        rows = server.runtime.store.query("SELECT count() FROM inferpath_requests FINAL")
    finally:
        server.stop()
    assert len(startups) == 1
    startup = startups[0]
    assert 35.4 < startup.loading_seconds < 35.6  # the capture's README: a 35 s cold start
    assert startup.replica == "db857ab1-1a92-4503-bbe9-592ec2c98f1f"  # the root's service.instance.id
    assert 12.9 < startup.phases_seconds["Warmup (CPU)"] < 13.0
    assert 0.02 < startup.phases_seconds["Load weights"] < 0.03
    assert {"Allocate KV cache", "EngineCoreProc init", "Load model"} <= set(startup.phases_seconds)
    assert "loaded in 35.5 s" in startup.text()
    assert rows[0][0] == 1  # the three llm_request spans share one traceparent; the start-up is no request


def test_emulated_engine_records_vllm_style_startup_spans() -> None:
    exporter = InMemorySpanExporter()
    app = create_app(EngineConfig(), span_exporter=exporter, startup_seconds=0.2)

    async def start_and_stop() -> None:
        async with app.router.lifespan_context(app):
            pass

    asyncio.run(asyncio.wait_for(start_and_stop(), timeout=30))
    spans = exporter.get_finished_spans()
    records = startups_from_spans(
        [
            {
                "trace_id": f"{s.context.trace_id:032x}",
                "span_id": f"{s.context.span_id:016x}",
                "parent_span_id": f"{s.parent.span_id:016x}" if s.parent else "",
                "span_name": s.name,
                "timestamp": datetime_from_unix_ns(s.start_time),
                "duration_ns": s.end_time - s.start_time,
                "service_name": "demo-engine",
                "resource_attributes": dict(s.resource.attributes),
            }
            for s in spans
        ]
    )
    assert len(records) == 1
    assert 0.19 < records[0].loading_seconds < 0.5
    assert set(records[0].phases_seconds) == {"Load weights", "Allocate KV cache", "Warmup"}
    assert records[0].replica == spans[0].resource.attributes["service.instance.id"]


def test_negative_duration_is_refused() -> None:
    with pytest.raises(ValueError, match="duration_ns"):
        startups_from_spans(
            [
                {
                    "trace_id": "a",
                    "span_id": "b",
                    "parent_span_id": "",
                    "span_name": "Overall Loading",
                    "timestamp": None,
                    "duration_ns": -1,
                }
            ]
        )
