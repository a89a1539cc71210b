"""Trace exports decoded in worker processes (server/decode_workers.py): the same answers as
decoding in the server, and a worker that dies, hangs or never starts costs no export."""

from __future__ import annotations

import gc
import gzip
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from inferpath.config import Settings
from inferpath.server import decode_workers
from inferpath.server.decode_workers import DecodeWorkers
from inferpath.server.derive import derivation_view
from inferpath.server.memory import SERVER_GC_THRESHOLDS
from inferpath.server.otlp import OTLPDecodeError, UnsupportedMediaTypeError, decode_trace_request
from inferpath.server.runtime import serve_in_thread
from inferpath.storage.native import NativeBlockWriter
from inferpath.storage.rows import SPAN_COLUMNS
from inferpath.storage.store import Store

from .otlp_factory import trace_body

PROTOBUF = "application/x-protobuf"


def _bodies(shared_data: Path) -> list[tuple[bytes, str, str | None]]:
    """Recorded vLLM exports as they were sent, one gzipped, the OTLP/JSON example of the
    opentelemetry-proto repository, and a generated 1000-span export."""
    folder = shared_data / "vllm_live_capture"
    recorded = [p.read_bytes() for p in sorted((folder / "otlp").glob("*.pb"))
                + sorted((folder / "startup_otlp").glob("*.pb"))]
    assert recorded
    as_json = (shared_data / "otlp_traces" / "otel_proto_examples_trace.json").read_bytes()
    # The same example with an undefined span kind: kept, with a warning that travels too.
    odd = json.loads(as_json)
    odd["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["kind"] = "SPAN_KIND_BOGUS"
    return ([(body, PROTOBUF, None) for body in recorded]
            + [(as_json, "application/json", None), (gzip.compress(recorded[0]), PROTOBUF, "gzip"),
               (trace_body(10, 100)[0], PROTOBUF, None), (json.dumps(odd).encode(), "application/json", None)])


def _decode_both(workers: DecodeWorkers, body: bytes, content_type: str, encoding: str | None, oldest: int = 0):
    args = dict(content_type=content_type, content_encoding=encoding, oldest_unix_ns=oldest)
    return workers.decode_trace_request(body, **args), decode_trace_request(body, **args)


def test_a_worker_decodes_every_recorded_body_exactly_as_the_server_does(shared_data: Path) -> None:
    workers = DecodeWorkers(2)
    try:
        for body, content_type, encoding in _bodies(shared_data):
            remote, local = _decode_both(workers, body, content_type, encoding)
            assert remote == local and remote.spans
            assert remote.warned_spans == (1 if b"SPAN_KIND_BOGUS" in body else 0)
            assert [s.start_ns for s in remote.spans] == [s.start_ns for s in local.spans]
            # Spans of one resource share its attribute map, as they do when decoded here.
            assert len({id(s.resource_attributes) for s in remote.spans}) == len(
                {id(s.resource_attributes) for s in local.spans})
        # Rejections travel too: every span older than the retention is counted, with the reason.
        remote, local = _decode_both(workers, trace_body(2, 3)[0], PROTOBUF, None, oldest=2**62)
        assert remote == local and remote.rejected_spans == 6 and "retention" in remote.error_message
        assert workers.decoded_total == len(_bodies(shared_data)) + 1
        assert workers.failures_total == workers.fallbacks_total == 0
    finally:
        workers.close()


def test_asked_for_native_blocks_a_worker_writes_the_block_the_server_would(shared_data: Path,
                                                                              store_url: str) -> None:
    with Store.open(store_url) as store:
        types = store.column_types("otel_traces", SPAN_COLUMNS)
    writer = NativeBlockWriter(SPAN_COLUMNS, types)
    workers = DecodeWorkers(1)
    try:
        body = _bodies(shared_data)[0][0]
        assert _decode_both(workers, body, PROTOBUF, None)[0].native_block is None  # not asked for
        workers.native_types = types
        remote, local = _decode_both(workers, body, PROTOBUF, None)
        assert local.native_block is None
        assert remote.native_block == writer.block([span.to_insert_row(timestamp_ns=True) for span in local.spans])
        # With the block, the spans are what request derivation reads (the block is what is stored).
        assert remote.spans == [derivation_view(span) for span in local.spans] != local.spans
        assert [(s.timestamp, s.start_ns) for s in remote.spans] == [(s.timestamp, s.start_ns) for s in local.spans]
        assert len({id(s.resource_attributes) for s in remote.spans}) == len(
            {id(s.resource_attributes) for s in local.spans})
        # Types it cannot write with: the spans still come back, without a block (the server writes it).
        workers.native_types = tuple("NoSuchType" for _ in SPAN_COLUMNS)
        remote, _ = _decode_both(workers, body, PROTOBUF, None)
        assert remote.spans == local.spans and remote.native_block is None
        assert workers.failures_total == workers.fallbacks_total == 0
    finally:
        workers.close()


def test_a_worker_process_runs_with_the_servers_collector_settings(monkeypatch) -> None:
    seen = []
    monkeypatch.setattr(decode_workers, "serve", lambda requests, replies: seen.append(
        (gc.get_threshold(), gc.get_freeze_count() > 0)))
    thresholds, sigint = gc.get_threshold(), signal.getsignal(signal.SIGINT)
    try:
        assert decode_workers._main() == 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        signal.signal(signal.SIGINT, sigint)
    assert seen == [(SERVER_GC_THRESHOLDS, True)]


def test_a_workers_replies_leave_no_cyclic_garbage(shared_data: Path, store_url: str) -> None:
    # With the server's thresholds a worker's young collections hardly ever run (each
    # reply's objects are freed as they were allocated), so a cycle per reply would pile up.
    with Store.open(store_url) as store:
        types = store.column_types("otel_traces", SPAN_COLUMNS)
    cases = [*_bodies(shared_data), (b"\xff\x01", PROTOBUF, None), (b"{", "application/json", None),
             (b"x", "text/plain", None), (b"x", PROTOBUF, "br")]
    replies = [decode_workers._reply(content_type, encoding, 0, types, body) for body, content_type, encoding in cases]
    assert {reply[0] for reply in replies} == {"ok", "400", "415"}
    del replies
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(3):
            for body, content_type, encoding in cases:
                pickle.dumps(decode_workers._reply(content_type, encoding, 0, types, body), protocol=5)
        assert gc.collect() == 0
    finally:
        if enabled:
            gc.enable()


def test_malformed_bodies_raise_the_errors_decoding_in_the_server_raises() -> None:
    workers = DecodeWorkers(1)
    try:
        cases = [(b"\x0a\x05abc", PROTOBUF, None), (b"{not json", "application/json", None),
                 (b"plain", PROTOBUF, "br"), (b"", "text/plain", None)]
        for body, content_type, encoding in cases:
            with pytest.raises(OTLPDecodeError) as local:
                decode_trace_request(body, content_type=content_type, content_encoding=encoding)
            with pytest.raises(OTLPDecodeError) as remote:
                workers.decode_trace_request(body, content_type=content_type, content_encoding=encoding)
            assert type(remote.value) is type(local.value) and str(remote.value) == str(local.value)
        with pytest.raises(UnsupportedMediaTypeError):
            workers.decode_trace_request(b"x", content_type="text/plain", content_encoding=None)
        # JSON nested past the parsers' recursion limit is an OTLP error like any other.
        for depth in (1000, 100_000):
            deep = b'{"resourceSpans":' + b"[" * depth + b"]" * depth + b"}"
            with pytest.raises(OTLPDecodeError, match="nested too deeply") as local_error:
                decode_trace_request(deep, content_type="application/json", content_encoding=None)
            with pytest.raises(OTLPDecodeError) as remote_error:
                workers.decode_trace_request(deep, content_type="application/json", content_encoding=None)
            assert str(remote_error.value) == str(local_error.value)
        assert workers.failures_total == 0 and workers.alive == 1
    finally:
        workers.close()


def test_an_unexpected_decode_error_in_the_worker_is_answered_with_its_text(monkeypatch) -> None:
    # Not an OTLP error: the server answers 400 with the exception's text, as when it decodes itself.
    import inferpath.server.decode_workers as decode_workers

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug in the decoder")

    monkeypatch.setattr(decode_workers, "decode_trace_request", broken)
    assert decode_workers._reply(PROTOBUF, None, 0, None, b"") == ("error", "a bug in the decoder")


def test_a_killed_idle_worker_is_replaced_before_an_export_reaches_it() -> None:
    workers = DecodeWorkers(1)
    body = trace_body(5, 20)[0]
    try:
        _decode_both(workers, body, PROTOBUF, None)
        (first,) = workers.pids
        os.kill(first, signal.SIGKILL)
        time.sleep(0.2)
        remote, local = _decode_both(workers, body, PROTOBUF, None)
        assert remote == local
        # Found dead at check-out: a new worker decoded the export, none fell back.
        assert workers.failures_total == 1 and workers.fallbacks_total == 0 and workers.decoded_total == 2
        (second,) = workers.pids
        assert second != first and workers.alive == 1
    finally:
        workers.close()


def test_a_worker_killed_mid_export_and_many_times_over_keeps_workers_in_use() -> None:
    """Workers killed while decoding (after they started fine) are not failed starts: the
    pool keeps starting new ones, each such export is decoded in the server instead."""
    workers = DecodeWorkers(1, timeout_seconds=30)
    body = trace_body(10, 100)[0]
    try:
        for _ in range(7):  # more than max_spawn_failures (5)
            remote, local = _decode_both(workers, body, PROTOBUF, None)  # a (new) worker serves
            assert remote == local
            (pid,) = workers.pids
            os.kill(pid, signal.SIGSTOP)  # hung mid-export, then killed: the pipe breaks
            threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
            remote, local = _decode_both(workers, body, PROTOBUF, None)
            assert remote == local
        assert workers.failures_total == 7 and workers.fallbacks_total == 7
        remote, local = _decode_both(workers, body, PROTOBUF, None)
        assert remote == local and workers.decoded_total == 8 and workers.alive == 1
    finally:
        workers.close()


def test_when_every_worker_is_busy_or_hung_an_export_is_decoded_in_the_server_within_the_wait() -> None:
    workers = DecodeWorkers(1, timeout_seconds=30, checkout_wait_seconds=0.3)
    body = trace_body(5, 20)[0]
    try:
        _decode_both(workers, body, PROTOBUF, None)
        (pid,) = workers.pids
        os.kill(pid, signal.SIGSTOP)
        stuck = threading.Thread(target=workers.decode_trace_request, args=(body,),
                                 kwargs=dict(content_type=PROTOBUF, content_encoding=None), daemon=True)
        stuck.start()
        time.sleep(0.2)  # the stopped worker is checked out by that thread now
        started = time.monotonic()
        remote, local = _decode_both(workers, body, PROTOBUF, None)
        assert remote == local and time.monotonic() - started < 3
        assert workers.fallbacks_total == 1
        os.kill(pid, signal.SIGKILL)  # the stuck export falls back too, and returns
        stuck.join(10)
        assert not stuck.is_alive() and workers.fallbacks_total == 2
    finally:
        workers.close()


def test_a_hung_worker_is_killed_at_the_timeout(monkeypatch) -> None:
    # A child that never reads its input: the request thread must not block on the pipe.
    monkeypatch.setattr(decode_workers._Worker, "command", (sys.executable, "-c", "import time; time.sleep(60)"))
    workers = DecodeWorkers(1, timeout_seconds=0.5, max_spawn_failures=2)
    body = trace_body(10, 100)[0]  # larger than a pipe's buffer
    try:
        started = time.monotonic()
        for _ in range(4):
            remote, local = _decode_both(workers, body, PROTOBUF, None)
            assert remote == local
        # Two timeouts, then no worker is started any more: the next exports take no wait.
        assert workers.failures_total == 2 and workers.fallbacks_total == 4 and workers.alive == 0
        assert time.monotonic() - started < 5
    finally:
        workers.close()


def test_a_worker_that_cannot_start_leaves_decoding_in_the_server(monkeypatch) -> None:
    monkeypatch.setattr(decode_workers._Worker, "command", ("/nonexistent/python",))
    workers = DecodeWorkers(2, max_spawn_failures=2)
    try:
        remote, local = _decode_both(workers, trace_body(1, 2)[0], PROTOBUF, None)
        assert remote == local and workers.alive == 0 and workers.fallbacks_total == 1
    finally:
        workers.close()


def test_workers_exit_when_the_server_is_killed(tmp_path: Path) -> None:
    script = ("import sys, time\n"
              "from inferpath.server.decode_workers import DecodeWorkers\n"
              "w = DecodeWorkers(2)\n"
              "print(*w.pids, flush=True)\n"
              "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(pids) == 2
        parent.kill()  # SIGKILL: no clean-up code runs
        parent.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_running(pid) for pid in pids):
            time.sleep(0.1)
        assert not any(_running(pid) for pid in pids)
    finally:
        if parent.poll() is None:
            parent.kill()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie has exited; only its parent's wait is missing


def test_a_server_with_decode_workers_stores_the_export_and_counts_it(store_url: str) -> None:
    body = trace_body(3, 4)[0]
    with serve_in_thread(Settings(store_url=store_url, decode_processes=2), port=0) as running:
        workers = running.runtime.decode_workers
        assert workers is not None and workers.alive == 2
        pids = workers.pids
        with httpx.Client(base_url=running.url, timeout=30) as http:
            assert http.post("/v1/traces", content=body, headers={"content-type": PROTOBUF}).status_code == 200
            bad = http.post("/v1/traces", content=b"\x0a\x05abc", headers={"content-type": PROTOBUF})
            assert bad.status_code == 400
            running.runtime.flush()
            metrics = http.get("/metrics").text
        assert "inferpath_decode_worker_exports_total 2.0" in metrics
        assert "inferpath_decode_workers 2.0" in metrics
        stored = running.runtime.store.query("SELECT count() FROM otel_traces")[0][0]
        assert stored == 12
    deadline = time.monotonic() + 10  # closing the server closes its workers
    while time.monotonic() < deadline and any(_running(pid) for pid in pids):
        time.sleep(0.1)
    assert not any(_running(pid) for pid in pids)


def test_decode_processes_zero_decodes_in_the_server(store_url: str) -> None:
    with serve_in_thread(Settings(store_url=store_url, decode_processes=0), port=0) as running:
        assert running.runtime.decode_workers is None
        with httpx.Client(base_url=running.url, timeout=30) as http:
            response = http.post("/v1/traces", content=json.dumps({"resourceSpans": []}),
                                 headers={"content-type": "application/json"})
        assert response.status_code == 200


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_one_usable_cpu_means_decoding_in_the_server() -> None:
    script = ("import os\n"
              "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
              "from inferpath.config import Settings\n"
              "print(Settings().decode_processes)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "0"


def test_workers_serve_when_the_server_holds_more_than_1024_files() -> None:
    """The pipes' descriptors are past 1024 in a server holding many files (chDB's parts,
    sockets): waiting on them must not use select(), which cannot take them."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the open-files limit ({hard}) is below 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if hard == resource.RLIM_INFINITY
                                                else min(max(soft, 1200), hard), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1050)]
    try:
        workers = DecodeWorkers(1)
        try:
            remote, local = _decode_both(workers, trace_body(10, 100)[0], PROTOBUF, None)
            assert remote == local and workers.failures_total == workers.fallbacks_total == 0
        finally:
            workers.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
