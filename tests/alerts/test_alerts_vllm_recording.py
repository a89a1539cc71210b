"""The shipped rule pack over a real vLLM recording (``tests/data/vllm_recordings/kv_starved``:
a 48-block KV pool at 0.85-1.00 with 282 preemptions, TTFT p50 40 s), imported through
``inferpath import``'s code into a store of its own. vLLM's own spans name no endpoint class,
so the interactive rules must read them as the diagnosis does (the default class)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from inferpath.alerts.evaluator import backtest
from inferpath.alerts.rules import load_rule_file
from inferpath.collectors.recording import choose_offset_ns, import_recording, open_recording
from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread

pytestmark = pytest.mark.e2e

RECORDING = Path(__file__).resolve().parents[1] / "data" / "vllm_recordings" / "kv_starved.tar.gz"


def test_the_default_rules_page_on_a_kv_starved_vllm(tmp_path: Path) -> None:
    server = serve_in_thread(Settings(store_url=f"chdb://{tmp_path / 'store'}", assembly_settle_seconds=0.2), port=0)
    try:
        recording = open_recording(RECORDING, workdir=tmp_path / "rec")
        offset = choose_offset_ns(recording, ttl_days=server.runtime.settings.ttl_days, now_ns=time.time_ns())
        with httpx.Client(base_url=server.url, timeout=120.0) as client:
            assert import_recording(recording, client, offset_ns=offset).flushed
        window = recording.ground_truth["window"]
        start = datetime.fromtimestamp((window["start_unix_ns"] + offset) / 1e9, tz=timezone.utc)
        end = datetime.fromtimestamp((window["end_unix_ns"] + offset) / 1e9, tz=timezone.utc)
        transitions = backtest(load_rule_file("default"), server.runtime.store, start, end + timedelta(minutes=2))
    finally:
        server.stop()
    fired = {(t.rule, t.labels.get("endpoint_class")): t for t in transitions if t.change == "firing"}
    changes = [(t.rule, t.change, t.reason) for t in transitions]
    # The pool ran full for two of the window's four minutes: its p90, not its five-minute mean.
    kv = fired.get(("KVCachePressure", None))
    assert kv is not None and kv.value is not None and kv.value >= 0.9, changes
    assert "preemptions" in kv.reason and kv.at <= end, kv
    # TTFT p99 of tens of seconds over the 1 s objective: the rows without a class are interactive's.
    pending = [t for t in transitions if t.rule == "TTFTP99OverSLO" and t.change == "pending"]
    assert pending and pending[0].labels.get("endpoint_class") == "interactive", changes
    assert pending[0].value is not None and pending[0].value > 10, pending
    assert ("TTFTP99OverSLOBulk", "bulk") not in fired and not any(t.rule.endswith("Bulk") for t in transitions), (
        changes
    )
