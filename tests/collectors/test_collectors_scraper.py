"""Scraper against real servers on loopback: the emulated engine, a broken exporter, a closed port."""

from __future__ import annotations

import logging
import socket
from datetime import datetime, timezone

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from inferpath.collectors.prometheus import signals_of
from inferpath.collectors.scraper import Scraper
from inferpath.demo.engine import EngineConfig
from inferpath.demo.engine.server import create_app

MIB = 1024 * 1024


def test_scrape_the_emulated_engine_over_loopback(serve_app):
    app = create_app(EngineConfig(time_scale=0.05, num_kv_blocks=2048), hostname="gpu-node-7")
    with serve_app(app) as url:
        httpx.post(f"{url}/v1/completions", json={"prompt": [1] * 100, "max_tokens": 4}, timeout=10).raise_for_status()
        with (
            Scraper(f"{url}/metrics", "vllm", extra_attributes={"replica": "r1"}) as engine_scraper,
            Scraper(f"{url}/gpu/metrics", "dcgm") as gpu_scraper,
        ):
            engine = signals_of(engine_scraper.scrape())
            gpu = signals_of(gpu_scraper.scrape())
    assert engine_scraper.errors_total == 0 and engine_scraper.scrapes_total == 1
    assert set(engine) == {
        "queue_depth",
        "running_requests",
        "kv_cache_usage_ratio",
        "preemptions_total",
        "kv_cache_config_info",
        "time_to_first_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
    }
    # One engine: its series are the pod's, labels unchanged.
    assert engine["queue_depth"][0].attributes == {"engine": "0", "model_name": "llama2-70b", "replica": "r1"}
    assert engine["kv_cache_usage_ratio"][0].attributes == {"engine": "0", "model_name": "llama2-70b", "replica": "r1"}
    assert engine["time_to_first_token_seconds"][0].count == 1
    assert engine_scraper.last_result.missing == ()
    assert engine["kv_cache_usage_ratio"][0].value == 0.0
    assert engine["kv_cache_usage_ratio"][0].timestamp.tzinfo is not None
    assert len(gpu["gpu_utilization_ratio"]) == 4  # one per GPU of the tensor-parallel group
    assert all(s.attributes["host"] == "gpu-node-7" for s in gpu["gpu_power_watts"])
    assert gpu["gpu_memory_total_bytes"][0].value == 81_559 * MIB
    assert gpu["gpu_memory_used_bytes"][0].value == (68_976_648_192 * 2 // 4 // MIB) * MIB
    assert all(0.0 <= s.value <= 1.0 for s in gpu["gpu_utilization_ratio"])


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_connection_refused_is_counted_not_raised(caplog):
    scraper = Scraper(f"http://127.0.0.1:{_closed_port()}/metrics", "vllm", timeout_seconds=0.5)
    with caplog.at_level(logging.WARNING, logger="inferpath.collectors.scraper"):
        assert scraper.scrape() == []
        assert scraper.scrape() == []
    scraper.close()
    assert scraper.errors_total == 2 and scraper.scrapes_total == 2
    # Rate-limited: one warning for the two failures within a minute.
    assert len([r for r in caplog.records if "failed" in r.message]) == 1


def test_malformed_and_failing_endpoints_return_nothing(serve_app):
    broken = FastAPI()

    @broken.get("/garbage")
    def garbage() -> PlainTextResponse:
        return PlainTextResponse('vllm:num_requests_waiting{engine="0" 3\n')

    @broken.get("/error")
    def error() -> PlainTextResponse:
        return PlainTextResponse("overloaded", status_code=503)

    @broken.get("/ok")
    def ok() -> PlainTextResponse:
        return PlainTextResponse('vllm:num_requests_waiting{engine="0"} 3\n')

    with serve_app(broken) as url, httpx.Client(timeout=2) as client:
        fixed = datetime(2026, 1, 1, tzinfo=timezone.utc)
        scrapers = {
            path: Scraper(f"{url}/{path}", "vllm", client=client, clock=lambda: fixed)
            for path in ("garbage", "error", "ok")
        }
        results = {path: s.scrape() for path, s in scrapers.items()}
    assert results["garbage"] == [] and scrapers["garbage"].errors_total == 1
    assert results["error"] == [] and scrapers["error"].errors_total == 1
    [sample] = results["ok"]
    assert sample.value == 3 and sample.timestamp == fixed and scrapers["ok"].errors_total == 0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"url": "ftp://x/metrics", "source": "vllm"}, "url"),
        ({"url": "http://x/metrics", "source": "nope"}, "source"),
        ({"url": "http://x/metrics", "source": "vllm", "timeout_seconds": 0}, "timeout_seconds"),
    ],
)
def test_bad_configuration_raises_at_construction(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Scraper(**kwargs)
