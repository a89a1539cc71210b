"""The agent against a real inferpath server on loopback (embedded chDB), and its delivery rules."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from fake_pynvml import MIB, FakePynvml, l40s
from fastapi import FastAPI, Request, Response
from typer.testing import CliRunner

from inferpath.collectors.agent import parse_scrape_targets, run_agent
from inferpath.collectors.nvml import NvmlAdapter, NvmlPoller
from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread
from inferpath.vocabulary import SOURCES

CAPTURE_FILE = "vllm_live_capture/metrics_1796037503909019406.prom"  # queue 3, running 6, KV 0.8095


class _Exporter(BaseHTTPRequestHandler):
    text = b""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.text)

    def log_message(self, *args: object) -> None:
        pass


def _serve_text(text: str) -> tuple[ThreadingHTTPServer, str]:
    handler = type("Handler", (_Exporter,), {"text": text.encode()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


def _poller() -> NvmlPoller:
    adapter = NvmlAdapter(FakePynvml([l40s(utilization_percent=87, memory_used_bytes=30_000 * MIB)]))
    adapter.init()
    return NvmlPoller(adapter, host="node-a")


def test_agent_pushes_nvml_and_scrapes_to_a_real_server(shared_data: Path, store_url: str):
    engine, engine_url = _serve_text((shared_data / CAPTURE_FILE).read_text())
    dcgm, dcgm_url = _serve_text(
        (shared_data / "dcgm_exporter_metrics/cncf_ai_conformance_upcloud_L40S.prom").read_text()
    )
    running = serve_in_thread(Settings(store_url=store_url, token="s3cret"), port=0)
    try:
        stats = run_agent(
            running.url,
            nvml=True,
            nvml_poller=_poller(),
            token="s3cret",
            interval_seconds=0.05,
            scrape_targets=[f"vllm={engine_url}", ("dcgm", dcgm_url)],
            max_ticks=3,
            host="node-a",
        )
        assert stats.samples_sent_total == stats.samples_collected_total > 0
        assert stats.samples_dropped_total == 0 and stats.export_failures_total == 0
        with httpx.Client(base_url=running.url, headers={"Authorization": "Bearer s3cret"}) as http:
            assert http.post("/api/v1/flush", timeout=120).json()["ok"]
        store = running.runtime.store
        rows = store.query_dicts(
            "SELECT ServiceName, MetricName, Value, MetricUnit AS Unit, Attributes, ResourceAttributes FROM otel_metrics_gauge"
            " ORDER BY TimeUnix"
        )
        by = {}
        for row in rows:
            by.setdefault((row["ServiceName"], row["MetricName"]), []).append(row)
        # Three ticks -> three points of each series, with the values the sources hold.
        assert [r["Value"] for r in by[("vllm", "queue_depth")]] == [3.0, 3.0, 3.0]
        assert [r["Value"] for r in by[("vllm", "running_requests")]] == [6.0] * 3
        assert by[("vllm", "kv_cache_usage_ratio")][0]["Value"] == pytest.approx(0.8095238095238095)
        assert by[("vllm", "queue_depth")][0]["Attributes"]["inferpath.source_metric"] == "vllm:num_requests_waiting"
        assert [r["Value"] for r in by[("nvml", "gpu_utilization_ratio")]] == [0.87] * 3
        nvml_memory = by[("nvml", "gpu_memory_used_bytes")][0]
        assert nvml_memory["Value"] == 30_000 * MIB and nvml_memory["Unit"] == "By"
        assert nvml_memory["Attributes"]["UUID"] == "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43"
        assert nvml_memory["ResourceAttributes"]["host.name"] == "node-a"
        assert by[("dcgm", "gpu_power_watts")][0]["Value"] == pytest.approx(35.686)
        # NVML and dcgm-exporter series of the same GPU share host and UUID.
        assert by[("dcgm", "gpu_power_watts")][0]["Attributes"]["UUID"] == nvml_memory["Attributes"]["UUID"]
        histograms = store.query_dicts(
            "SELECT MetricName, Count, BucketCounts, ExplicitBounds FROM otel_metrics_histogram"
            " WHERE MetricName = 'time_to_first_token_seconds'"
        )
        assert len(histograms) == 3 and histograms[0]["Count"] > 0
        assert sum(histograms[0]["BucketCounts"]) == histograms[0]["Count"]
        sums = store.query("SELECT Value FROM otel_metrics_sum WHERE MetricName = 'preemptions_total'")
        assert [v for (v,) in sums] == [1.0] * 3
    finally:
        running.stop()
        engine.shutdown()
        dcgm.shutdown()


def test_retry_after_is_honoured_and_nothing_is_lost(serve_app):
    app = FastAPI()
    seen: list[int] = []

    @app.post("/v1/metrics")
    async def metrics(request: Request) -> Response:
        seen.append(len(await request.body()))
        if len(seen) == 1:
            return Response(status_code=503, headers={"Retry-After": "0.3"})
        return Response(status_code=200)

    with serve_app(app) as url:
        import time

        started = time.monotonic()
        stats = run_agent(url, nvml=True, nvml_poller=_poller(), scrape_targets=[], interval_seconds=0.05, max_ticks=10)
        elapsed = time.monotonic() - started
    assert stats.export_failures_total == 1
    # The retry waited for Retry-After (0.3 s) instead of the 0.05 s tick, then sent all buffered samples.
    assert len(seen) < 10 and elapsed >= 0.3
    assert stats.samples_sent_total == stats.samples_collected_total and stats.samples_dropped_total == 0


def test_unreachable_server_fills_a_bounded_buffer_and_counts_drops():
    stats = run_agent(
        "http://127.0.0.1:9",
        nvml=True,
        nvml_poller=_poller(),
        scrape_targets=[],
        interval_seconds=0.01,
        max_ticks=20,
        max_buffered_samples=25,
    )
    per_poll = 10  # nine fields + gpu_up (no processes on this GPU)
    assert stats.samples_collected_total >= 20 * per_poll
    assert stats.samples_sent_total == 0
    assert stats.samples_dropped_total >= stats.samples_collected_total - 25
    assert stats.export_failures_total >= 1


def test_rejected_body_is_dropped_not_retried(serve_app):
    app = FastAPI()
    calls = []

    @app.post("/v1/metrics")
    async def metrics() -> Response:
        calls.append(1)
        return Response(status_code=400)

    with serve_app(app) as url:
        stats = run_agent(url, nvml=True, nvml_poller=_poller(), scrape_targets=[], interval_seconds=0.01, max_ticks=3)
    assert stats.samples_sent_total == 0 and stats.samples_dropped_total == stats.samples_collected_total
    assert len(calls) == 3  # one per tick; each body dropped, so the final flush has nothing to send


def test_scrape_target_validation_names_the_entry():
    assert parse_scrape_targets(["dcgm=http://h:9400/metrics"]) == [("dcgm", "http://h:9400/metrics")]
    with pytest.raises(ValueError, match="unknown source 'nope'"):
        parse_scrape_targets(["nope=http://h/metrics"])
    # One grammar with inferpath up --scrape (config.ScrapeTarget.parse): a bare URL is vLLM,
    # and every catalog source is accepted by both.
    assert parse_scrape_targets(["http://h/metrics"]) == [("vllm", "http://h/metrics")]
    assert [source for source, _ in parse_scrape_targets([f"{s}=http://h/m" for s in SOURCES])] == list(SOURCES)
    assert [
        t.source
        for t in Settings.from_env(
            {"INFERPATH_SCRAPE_TARGETS": ",".join(f"{s}=http://h/m" for s in SOURCES)}
        ).scrape_targets
    ] == list(SOURCES)
    with pytest.raises(ValueError, match="http"):
        parse_scrape_targets([("dcgm", "h:9400/metrics")])
    with pytest.raises(ValueError, match="server_url"):
        run_agent("h:4318", nvml=False, scrape_targets=[])


def test_collect_command_validates_and_runs(shared_data: Path, monkeypatch):
    import typer

    from inferpath.collectors import cli

    app = typer.Typer()
    app.command("collect")(cli.collect)
    app.command("noop")(lambda: None)  # two commands, so "collect" is addressed by name as in inferpath
    runner = CliRunner()
    result = runner.invoke(app, ["collect", "--scrape", "bogus=http://h/metrics"])
    assert result.exit_code == 2 and "unknown source" in result.output
    result = runner.invoke(app, ["collect"])
    assert result.exit_code == 2 and "nothing to collect" in result.output
    result = runner.invoke(app, ["collect", "--nvml", "--server", "not-a-url"])
    assert result.exit_code == 2 and "--server" in result.output and "not-a-url" in result.output

    captured = {}

    def fake_run_agent(server_url, **kwargs):
        captured.update(kwargs, server_url=server_url)
        from inferpath.collectors.agent import AgentStats

        return AgentStats(samples_sent_total=5)

    monkeypatch.setattr("inferpath.collectors.agent.run_agent", fake_run_agent)
    result = runner.invoke(
        app,
        [
            "collect",
            "--nvml",
            "--scrape",
            "vllm=http://127.0.0.1:8000/metrics",
            "--server",
            "http://10.0.0.1:4318",
            "--interval",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert captured["server_url"] == "http://10.0.0.1:4318" and captured["nvml"] is True
    assert captured["scrape_targets"] == ["vllm=http://127.0.0.1:8000/metrics"]
    assert captured["interval_seconds"] == 2.0 and "sent 5 samples" in result.output


def test_another_program_at_server_is_named_once_without_a_line_per_request(caplog):
    """A real HTTP server on loopback that is not inferpath (Python's file server: 501 for
    POST): the agent says what to do, once per interval, and httpx's per-request INFO lines
    stay out of the collector's log (configure_logging, as the server's)."""
    import http.server
    import logging
    import threading

    from inferpath.ratelimited_log import configure_logging

    configure_logging()
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler) as other:
        threading.Thread(target=other.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{other.server_address[1]}"
        try:
            with caplog.at_level(logging.INFO):
                stats = run_agent(
                    url, nvml=True, nvml_poller=_poller(), scrape_targets=[], interval_seconds=0.01, max_ticks=5
                )
        finally:
            other.shutdown()
    assert stats.samples_sent_total == 0 and stats.export_failures_total >= 5
    said = [r.getMessage() for r in caplog.records if r.name.startswith("inferpath")]
    assert len(said) == 1 and "rejected with HTTP 501" in said[0], said
    assert "is it an inferpath server? give --server the address `inferpath up` printed" in said[0]
    assert not [r for r in caplog.records if r.name in ("httpx", "httpcore")]
