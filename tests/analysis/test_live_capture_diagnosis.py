"""The recorded vLLM capture, ingested through the real receiver, diagnosed through the read API.

The capture (``../shared/data/vllm_live_capture``) is a real vLLM 0.32 run with a 64-block KV
pool: about 60 requests at an easy pace, then a burst that queued 52 requests. Ground truth
from the raw scrapes: the burst raised ``vllm:num_preemptions_total`` (vLLM preempts only
when it runs out of KV blocks) and the queue, so the burst is a KV-memory problem.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from live_capture import ingest_capture, scrape_files

from inferpath.analysis.breakdown import fetch_request_rows
from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread

pytestmark = pytest.mark.e2e


def test_live_vllm_capture_is_diagnosed_as_kv_pressure(shared_data: Path, store_url: str) -> None:
    server = serve_in_thread(Settings(store_url=store_url, assembly_settle_seconds=0.2), port=0)
    try:
        with httpx.Client(base_url=server.url, timeout=60.0) as client:
            offset_ns = ingest_capture(client, shared_data)
            from inferpath.storage.rows import datetime_from_unix_ns

            first_scrape = datetime_from_unix_ns(scrape_files(shared_data)[0][0] + offset_ns)
            rows = fetch_request_rows(
                server.runtime.store, start=first_scrape - timedelta(minutes=5), end=first_scrape + timedelta(minutes=5)
            )
            assert len(rows) == 120  # every llm_request span vLLM exported became one request row
            start = rows[0]["timestamp"] - timedelta(seconds=1)
            split = start + timedelta(seconds=40)  # the easy first part vs the burst near the end
            verdict = client.get(
                "/api/v1/diagnosis",
                params={
                    "start": split.isoformat(),
                    "end": (start + timedelta(seconds=90)).isoformat(),
                    "baseline_start": start.isoformat(),
                    "baseline_end": split.isoformat(),
                },
            ).json()
    finally:
        server.stop()
    assert (verdict["baseline_requests"], verdict["current_requests"]) == (63, 57)
    ttft = next(d for d in verdict["degradations"] if d["measure"] == "ttft")
    assert ttft["degraded"] and 2.5 < ttft["ratio"] < 4.0  # 70 ms → 220 ms
    assert verdict["top_cause"] == "gpu_memory"
    top = verdict["causes"][0]
    # The capture has only vLLM's spans: the rest before its queue is the engine's too.
    assert top["share"] > 0.8 and top["stages"] == ["queue", "rest"]
    by_measure = {e["measure"]: e for e in top["evidence"]}
    assert by_measure["preemptions_total"]["current"] > by_measure["preemptions_total"]["baseline"] == 0
    assert by_measure["queue_depth"]["current"] > 5 > by_measure["queue_depth"]["baseline"]
    assert by_measure["queue_ns"]["current"] > 5 * by_measure["queue_ns"]["baseline"]
