"""The span log behind the real HTTP receiver: kill -9 while the drainer works, then restart
(every acknowledged span stored once); the backlog bound answered with 503 + Retry-After."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread
from inferpath.server.span_log import LoggedSpanIngest

from .otlp_factory import trace_body
from .test_durability import _free_port, _start_server_process, _stored_span_counts

pytestmark = pytest.mark.e2e

PROTOBUF = {"content-type": "application/x-protobuf"}


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not on /metrics")


def test_kill_9_mid_drain_then_restart_stores_every_acknowledged_span_once(store_url: str) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # 1000-span exports from two clients: the drainer is inserting or lingering all the time.
    batches = [trace_body(spans_per_trace=10, traces=100) for _ in range(30)]
    acked: list[int] = []
    next_batch = iter(range(len(batches)))
    lock = threading.Lock()
    kill_now = threading.Event()

    def push() -> None:
        with httpx.Client(base_url=url, timeout=10.0) as http:
            while True:
                with lock:
                    index = next(next_batch, None)
                if index is None:
                    return
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    try:
                        response = http.post("/v1/traces", content=batches[index][0], headers=PROTOBUF)
                    except httpx.HTTPError:
                        time.sleep(0.05)
                        continue
                    if response.status_code == 200:
                        with lock:
                            acked.append(index)
                            if len(acked) == 8:
                                kill_now.set()
                        break
                    assert response.status_code == 503, response.text
                    time.sleep(0.05)

    server = _start_server_process(store_url, port)
    clients = [threading.Thread(target=push, daemon=True) for _ in range(2)]
    for client in clients:
        client.start()
    try:
        assert kill_now.wait(60)
        os.kill(server.pid, signal.SIGKILL)  # right after an acknowledgement: its insert is pending
        server.wait(10)
        with lock:
            acked_before_kill = list(acked)
        server = _start_server_process(store_url, port)
        for client in clients:
            client.join(120)
            assert not client.is_alive(), "the clients could not land every batch after the restart"
        assert sorted(acked) == list(range(len(batches)))
        assert httpx.post(f"{url}/api/v1/flush", timeout=60).json()["ok"]
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        # The restarted server found acknowledged exports in the log that were not inserted yet.
        assert _metric(metrics, "inferpath_span_log_recovered_spans_total") > 0
        assert _metric(metrics, "inferpath_span_log_backlog_bytes") == 0
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    rows, distinct, stored = _stored_span_counts(store_url)
    for index in acked_before_kill:
        assert {s for spans in batches[index][1].values() for s in spans} <= stored
    expected = {s for _, ids in batches for spans in ids.values() for s in spans}
    assert stored == expected
    assert rows == distinct == len(expected)


def test_a_full_backlog_answers_503_with_retry_after_and_recovers(store_url: str) -> None:
    settings = Settings(store_url=store_url, assembly_settle_seconds=0.1, span_log_max_backlog_bytes=64 * 1024)
    with serve_in_thread(settings, port=0) as running:
        store = running.runtime.store
        log_ingest = running.runtime.span_sink
        assert log_ingest is not None
        with httpx.Client(base_url=running.url, timeout=30.0) as http:
            warm, _ = trace_body(spans_per_trace=2)
            assert http.post("/v1/traces", content=warm, headers=PROTOBUF).status_code == 200
            assert http.post("/api/v1/flush", timeout=120).json()["ok"]
            # ~110 KB each: the first fits an empty backlog, the second would pass 64 KiB.
            first, second = trace_body(spans_per_trace=10, traces=100), trace_body(spans_per_trace=10, traces=100)
            with store._lock:  # the store is slow: the drainer's insert waits here
                assert http.post("/v1/traces", content=first[0], headers=PROTOBUF).status_code == 200
                refused = http.post("/v1/traces", content=second[0], headers=PROTOBUF)
                assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
                assert "backlog full" in refused.text
                metrics = http.get("/metrics").text
                assert _metric(metrics, "inferpath_span_log_backlog_spans") == 1000
                assert _metric(metrics, "inferpath_span_log_refused_backlog_full_total") == 1
            # The drainer catches up by itself; the exporter's retry (after Retry-After) lands.
            deadline = time.monotonic() + 30
            while (retry := http.post("/v1/traces", content=second[0], headers=PROTOBUF)).status_code != 200:
                assert retry.status_code == 503 and time.monotonic() < deadline
                time.sleep(0.1)
            assert http.post("/api/v1/flush", timeout=120).json()["ok"]
        stored = {r[0] for r in store.query("SELECT SpanId FROM otel_traces")}
        expected = {s for body in (first, second) for spans in body[1].values() for s in spans}
        assert expected <= stored and len(stored) == len(expected) + 2
        refused = running.runtime.spans_refused_total
        # Refused before decoding: no spans known, so none counted as refused (the export is, above).
        assert refused % 1000 == 0 and running.runtime.spans_dropped_total == 0


@pytest.mark.parametrize("span_log", [True, False])
def test_a_retried_export_is_stored_once_and_counted_as_a_duplicate_by_the_log(store_url: str, span_log: bool) -> None:
    body, ids = trace_body(spans_per_trace=3, traces=2)
    settings = Settings(store_url=store_url, span_log=span_log, assembly_settle_seconds=0.1)
    with serve_in_thread(settings, port=0) as running:
        with httpx.Client(base_url=running.url, timeout=60.0) as http:
            for _ in range(2):  # the exporter's retry of an export whose 200 it did not see
                assert http.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 200
            flushed = http.post("/api/v1/flush", timeout=120).json()
            metrics = http.get("/metrics").text
            health = http.get("/healthz").json()
        stored = running.runtime.store.query("SELECT count() FROM otel_traces")[0][0]
    assert isinstance(running.runtime.span_sink, LoggedSpanIngest) == span_log
    assert flushed["ok"] and stored == 6  # stored once either way
    assert _metric(metrics, "inferpath_server_spans_received_total") == 12
    assert health["span_log"] == ("on" if span_log else "off")
    if span_log:  # the log knows its records' tokens: the retry is answered without a second record
        assert flushed["spans_inserted_total"] == 6
        assert _metric(metrics, "inferpath_server_spans_duplicate_total") == 6
    else:  # inserted again under the same token, which the store drops without saying so
        assert flushed["spans_inserted_total"] == 12
        assert _metric(metrics, "inferpath_server_spans_duplicate_total") == 0


def test_a_trace_export_that_cannot_fit_the_backlog_is_refused_before_it_is_decoded(store_url: str) -> None:
    with serve_in_thread(Settings(store_url=store_url, span_log_max_backlog_bytes=64 * 1024), port=0) as running:
        log_ingest = running.runtime.span_sink
        body, _ = trace_body(spans_per_trace=10, traces=10)
        with httpx.Client(base_url=running.url, timeout=30) as http:
            held = log_ingest.reserve(64 * 1024 - len(body) // 2)  # another export, still being decoded
            try:
                refused = http.post("/v1/traces", content=body, headers=PROTOBUF)
                assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
                assert "being decoded" in refused.text and "max_backlog_bytes=65536" in refused.text
                # Not decoded: a malformed body of that size gets the same 503, not its 400.
                garbage = http.post("/v1/traces", content=b"\xff" * len(body), headers=PROTOBUF)
                assert garbage.status_code == 503, garbage.text
            finally:
                held.release()
            assert log_ingest.reserved_bytes == 0
            assert http.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 200
            assert log_ingest.reserved_bytes == 0  # released once answered
            assert _metric(http.get("/metrics").text, "inferpath_span_log_refused_backlog_full_total") == 2


def test_a_span_log_that_cannot_be_opened_is_said_on_healthz_and_exports_are_inserted_before_their_200(
    store_url: str, tmp_path
) -> None:
    (tmp_path / "not-a-folder").write_text("a file where the log's folder should be")
    body, _ = trace_body(spans_per_trace=2, traces=1)
    settings = Settings(store_url=store_url, span_log_dir=str(tmp_path / "not-a-folder"), assembly_settle_seconds=0.1)
    with serve_in_thread(settings, port=0) as running:
        with httpx.Client(base_url=running.url, timeout=60.0) as http:
            health = http.get("/healthz").json()
            assert http.post("/v1/traces", content=body, headers=PROTOBUF).status_code == 200
        stored = running.runtime.store.query("SELECT count() FROM otel_traces")[0][0]
    assert health["status"] == "ok" and health["span_log"].startswith("unusable (")
    assert "not-a-folder" in health["span_log"] and "inserting every export before its 200" in health["span_log"]
    assert stored == 2  # inserted before its 200
