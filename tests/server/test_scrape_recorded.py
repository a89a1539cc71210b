"""Case 1: every recorded scrape goes through the real path (HTTP -> Scraper -> ScrapeLoop ->
BatchWriter -> chDB) and is stored with the values it holds.

Expected values are read from the files with a plain regular expression, independently of
the collectors' parser.
"""

from __future__ import annotations

import re
import threading
from datetime import datetime, timezone
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from inferpath.collectors.scraper import Scraper
from inferpath.config import ScrapeTarget
from inferpath.server.scrape import ScrapeLoop
from inferpath.storage.rows import GAUGE_COLUMNS, HISTOGRAM_COLUMNS, SUM_COLUMNS
from inferpath.storage.store import Store
from inferpath.storage.writer import BatchWriter

MIB = 1024 * 1024
NOW = datetime.now(timezone.utc).replace(microsecond=0)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def data_server(shared_data: Path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(shared_data)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _capture_time(path: Path) -> datetime:
    unix_ns = int(path.stem.split("_")[-1])
    return datetime.fromtimestamp(unix_ns // 1_000_000_000, tz=timezone.utc).replace(
        microsecond=(unix_ns % 1_000_000_000) // 1_000
    )


def _value(text: str, metric: str) -> float:
    [value] = re.findall(rf"^{re.escape(metric)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    return float(value)


def _ingest(store_url: str, targets: list[ScrapeTarget], times: dict[str, datetime]) -> Store:
    store = Store.open(store_url)
    writers = [
        BatchWriter(store, "otel_metrics_gauge", GAUGE_COLUMNS),
        BatchWriter(store, "otel_metrics_sum", SUM_COLUMNS),
        BatchWriter(store, "otel_metrics_histogram", HISTOGRAM_COLUMNS),
    ]
    # Each recorded scrape is stamped with the time it was taken (the file name's unix ns).
    factory = lambda t: Scraper(t.url, t.source, clock=lambda: times.get(t.url, NOW))  # noqa: E731
    loop = ScrapeLoop(targets, writers[0], writers[1], scraper_factory=factory, histogram_writer=writers[2])
    assert loop.scrape_once() > 0
    assert loop.scrape_errors_total == 0, loop.scrape_errors_by_target
    for writer in writers:
        assert writer.flush(30.0)
        writer.close()
    loop.stop()
    return store


def test_live_vllm_capture_series_match_the_files_scrape_by_scrape(shared_data: Path, data_server: str, store_url: str):
    files = sorted((shared_data / "vllm_live_capture").glob("metrics_*.prom"), key=_capture_time)
    assert len(files) >= 60
    urls = {path: f"{data_server}/vllm_live_capture/{path.name}" for path in files}
    store = _ingest(
        store_url,
        [ScrapeTarget(url=u, source="vllm") for u in urls.values()],
        {urls[p]: _capture_time(p) for p in files},
    )
    try:
        for metric, signal in (
            ("vllm:num_requests_waiting", "queue_depth"),
            ("vllm:kv_cache_usage_perc", "kv_cache_usage_ratio"),
            ("vllm:num_requests_running", "running_requests"),
        ):
            rows = store.query(
                "SELECT TimeUnix, Value FROM otel_metrics_gauge WHERE MetricName = {m:String} ORDER BY TimeUnix",
                {"m": signal},
            )
            expected = [(_capture_time(p), _value(p.read_text(), metric)) for p in files]
            assert [(t, v) for t, v in rows] == expected, signal
        assert (
            max(
                v
                for _, v in store.query(
                    "SELECT TimeUnix, Value FROM otel_metrics_gauge WHERE MetricName = 'queue_depth'"
                )
            )
            > 0
        )
        counters = store.query(
            "SELECT Value FROM otel_metrics_sum WHERE MetricName = 'preemptions_total' ORDER BY TimeUnix"
        )
        assert [v for (v,) in counters] == [_value(p.read_text(), "vllm:num_preemptions_total") for p in files]
        # TTFT histograms: buckets as scraped (count = the +Inf bucket = _count), one per scrape.
        histograms = store.query(
            "SELECT Count, Sum, BucketCounts, ExplicitBounds FROM otel_metrics_histogram"
            " WHERE MetricName = 'time_to_first_token_seconds' ORDER BY TimeUnix"
        )
        assert len(histograms) == len(files)
        last_text = files[-1].read_text()
        count, total, buckets, bounds = histograms[-1]
        assert count == _value(last_text, "vllm:time_to_first_token_seconds_count")
        assert total == pytest.approx(_value(last_text, "vllm:time_to_first_token_seconds_sum"))
        assert sum(buckets) == count and len(buckets) == len(bounds) + 1
    finally:
        store.close()


def test_dcgm_idle_vllm_and_sglang_scrapes_are_stored_with_their_values(
    shared_data: Path, data_server: str, store_url: str
):
    targets = [
        ScrapeTarget(url=f"{data_server}/dcgm_exporter_metrics/cncf_ai_conformance_upcloud_L40S.prom", source="dcgm"),
        ScrapeTarget(url=f"{data_server}/dcgm_exporter_metrics/cncf_ai_conformance_kops_L4_idle.prom", source="dcgm"),
        ScrapeTarget(url=f"{data_server}/model_server_metrics/vllm_v1_qwen2.5-0.5b_cncf_kops.prom", source="vllm"),
        ScrapeTarget(
            url=f"{data_server}/model_server_metrics/sglang_llama3.1-8b_under_load_docs.prom", source="sglang"
        ),
    ]
    store = _ingest(store_url, targets, {})
    try:
        gauges = {}
        for service, name, host, value in store.query(
            "SELECT ServiceName, MetricName, Attributes['host'], Value FROM otel_metrics_gauge"
        ):
            gauges[(service, name, host)] = value
        l40s = (shared_data / "dcgm_exporter_metrics/cncf_ai_conformance_upcloud_L40S.prom").read_text()
        l4 = (shared_data / "dcgm_exporter_metrics/cncf_ai_conformance_kops_L4_idle.prom").read_text()
        for text, host in ((l40s, "gpu1-wl8sg"), (l4, "i-030791dc5a37cd257")):
            assert gauges[("dcgm", "gpu_power_watts", host)] == pytest.approx(_value(text, "DCGM_FI_DEV_POWER_USAGE"))
            assert gauges[("dcgm", "gpu_temperature_celsius", host)] == _value(text, "DCGM_FI_DEV_GPU_TEMP")
            assert gauges[("dcgm", "gpu_sm_clock_hertz", host)] == _value(text, "DCGM_FI_DEV_SM_CLOCK") * 1e6
            assert gauges[("dcgm", "gpu_memory_free_bytes", host)] == _value(text, "DCGM_FI_DEV_FB_FREE") * MIB
            assert gauges[("dcgm", "gpu_graphics_engine_active_ratio", host)] == _value(
                text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
            )
            total = sum(_value(text, f"DCGM_FI_DEV_FB_{k}") for k in ("USED", "FREE", "RESERVED"))
            assert gauges[("dcgm", "gpu_memory_total_bytes", host)] == total * MIB
        sglang = (shared_data / "model_server_metrics/sglang_llama3.1-8b_under_load_docs.prom").read_text()
        assert gauges[("sglang", "queue_depth", "")] == _value(sglang, "sglang:num_queue_reqs") == 2826
        assert gauges[("sglang", "running_requests", "")] == 162
        assert gauges[("sglang", "kv_cache_usage_ratio", "")] == pytest.approx(_value(sglang, "sglang:token_usage"))
        assert gauges[("vllm", "queue_depth", "")] == 0 and gauges[("vllm", "kv_cache_usage_ratio", "")] == 0
        # SGLang's TTFT histogram under load: most requests above 30 s (+Inf 11008 vs 2513 at le=30).
        [(count, buckets, bounds)] = store.query(
            "SELECT Count, BucketCounts, ExplicitBounds FROM otel_metrics_histogram"
            " WHERE ServiceName = 'sglang' AND MetricName = 'time_to_first_token_seconds'"
        )
        assert count == 11008 and buckets[-1] == 11008 - 2513 and bounds[-1] == 30.0
    finally:
        store.close()
