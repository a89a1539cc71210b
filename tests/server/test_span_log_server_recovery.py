"""The real server over a damaged span log (skipped record counted on /metrics, every other
export stored), and ``POST /api/v1/flush`` answering near its timeout while a rollup pass is slow."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from inferpath.config import Settings
from inferpath.server.ingest import dedup_token
from inferpath.server.runtime import SPAN_LOG_FOLDER_NAME, serve_in_thread
from inferpath.server.span_log import SpanLog, token_digest

from .otlp_factory import trace_body
from .test_span_log_server import _metric

pytestmark = pytest.mark.e2e

PROTOBUF = "application/x-protobuf"


def test_a_damaged_logged_export_is_skipped_counted_and_the_others_stored(store_url: str) -> None:
    folder = Path(store_url.removeprefix("chdb://")) / SPAN_LOG_FOLDER_NAME
    exports = [trace_body(spans_per_trace=4, traces=2) for _ in range(6)]
    log = SpanLog(folder)  # what a killed server left: six acknowledged, never inserted exports
    ids = [
        log.append(token_digest(dedup_token("traces", PROTOBUF, None, body)), PROTOBUF, None, body)
        for body, _ in exports
    ]
    log.close()
    with closing(sqlite3.connect(folder / "spans.sqlite")) as db, db:  # the disk damaged the 2nd
        db.execute("UPDATE exports SET body = substr(body, 1, 20) WHERE id = ?", (ids[1],))

    settings = Settings(store_url=store_url, assembly_settle_seconds=0.1)
    with serve_in_thread(settings, port=0) as running:
        with httpx.Client(base_url=running.url, timeout=60.0) as http:
            flushed = http.post("/api/v1/flush", timeout=120).json()
            assert flushed["ok"]
            assert flushed["spans_inserted_total"] == 40  # the recovered spans, inserted by this process
            metrics = http.get("/metrics").text
            assert _metric(metrics, "inferpath_span_log_corrupt_records_total") == 1
            assert _metric(metrics, "inferpath_span_log_recovered_spans_total") == 40
        stored = {row[0] for row in running.runtime.store.query("SELECT SpanId FROM otel_traces")}
    expected = {s for index, (_, ids) in enumerate(exports) if index != 1 for spans in ids.values() for s in spans}
    assert stored == expected


def test_flush_answers_near_its_timeout_while_a_rollup_pass_is_slow(store_url: str) -> None:
    settings = Settings(store_url=store_url, assembly_settle_seconds=0.1)
    with serve_in_thread(settings, port=0) as running:
        rollups = running.runtime.rollups
        real_pass = rollups.refresh_now
        slow = threading.Event()  # set: passes run at once; clear: each waits (a pass over days of traces)
        slow.set()
        running_passes, most_at_once = [0], [0]
        counter = threading.Lock()

        flush_passes = [0]

        def slow_pass():
            if threading.current_thread().name != "inferpath-flush-rollup":
                return real_pass()  # the refresher thread's own passes
            with counter:
                running_passes[0] += 1
                flush_passes[0] += 1
                most_at_once[0] = max(most_at_once[0], running_passes[0])
            try:
                slow.wait(30)
                return real_pass()
            finally:
                with counter:
                    running_passes[0] -= 1

        rollups.refresh_now = slow_pass
        slow.clear()
        with httpx.Client(base_url=running.url, timeout=30.0) as http:
            body, _ = trace_body(spans_per_trace=3)
            assert http.post("/v1/traces", content=body, headers={"content-type": PROTOBUF}).status_code == 200
            began = time.monotonic()
            answers = []
            flushes = [
                threading.Thread(
                    target=lambda: answers.append(http.post("/api/v1/flush", params={"timeout_seconds": 1.5}).json())
                )
                for _ in range(3)
            ]
            for flush in flushes:
                flush.start()
            for flush in flushes:
                flush.join(20)
            took = time.monotonic() - began
            assert [a["ok"] for a in answers] == [False, False, False] and took < 6, (answers, took)
            assert answers[0]["spans_inserted_total"] == 3  # the rest of the flush was done
            assert flush_passes[0] == 1  # the later flushes wait for one pass queued behind it
            slow.set()  # the pass ends; the next flush gets a fresh one
            assert http.post("/api/v1/flush", params={"timeout_seconds": 20}).json()["ok"]
        assert most_at_once[0] == 1  # never two passes at once
        rollups.refresh_now = real_pass


def test_flush_answers_near_its_timeout_while_the_forced_assembly_is_slow(store_url: str) -> None:
    """After a restart the forced assembly may read back thousands of recovered traces: the
    flush answers ``ok: false`` at its timeout instead of waiting for it, then ``ok: true``."""
    settings = Settings(store_url=store_url, assembly_settle_seconds=0.1)
    with serve_in_thread(settings, port=0) as running:
        assembler = running.runtime.assembler
        real_run_once = assembler.run_once
        slow = threading.Event()

        def slow_run_once(*args, **kwargs):
            if threading.current_thread().name == "inferpath-flush-assembly":
                slow.wait(30)  # a pass reading back many traces
            return real_run_once(*args, **kwargs)

        assembler.run_once = slow_run_once
        try:
            with httpx.Client(base_url=running.url, timeout=30.0) as http:
                body, _ = trace_body(spans_per_trace=3)
                assert http.post("/v1/traces", content=body, headers={"content-type": PROTOBUF}).status_code == 200
                began = time.monotonic()
                answer = http.post("/api/v1/flush", params={"timeout_seconds": 1.0}).json()
                took = time.monotonic() - began
                assert answer["ok"] is False and took < 4, (answer, took)
                slow.set()
                answer = http.post("/api/v1/flush", params={"timeout_seconds": 20}).json()
                assert answer["ok"] is True and answer["pending_traces"] == 0, answer
                assert answer["requests_inserted_total"] >= 1
        finally:
            slow.set()
            assembler.run_once = real_run_once
