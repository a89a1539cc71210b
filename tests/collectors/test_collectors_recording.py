"""Recordings read from files and loaded into a real server: folders, tarballs, expositions with timestamps."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferpath.cli import app
from inferpath.collectors.recording import (
    RecordingError,
    choose_offset_ns,
    detect_source,
    open_recording,
)

DAY_NS = 86_400 * 10**9


def _capture(shared_data: Path) -> Path:
    return shared_data / "vllm_live_capture"


def test_the_shared_capture_reads_as_a_recording(shared_data: Path) -> None:
    recording = open_recording(_capture(shared_data))
    assert len(recording.scrapes) == 69 and len(recording.trace_files) >= 17
    assert [at for at, _ in recording.scrapes] == sorted(at for at, _ in recording.scrapes)
    assert detect_source(recording.scrapes[0][1]) == "vllm"
    # Start-up bodies are posted before the requests' bodies.
    folders = [f.parent.name for f in recording.trace_files]
    assert folders == sorted(folders, key=["startup_otlp", "otlp", "traces"].index)


def test_an_exposition_with_timestamps_splits_into_one_scrape_per_time(tmp_path: Path, shared_data: Path) -> None:
    first = next(iter(sorted(_capture(shared_data).glob("metrics_*.prom"))))
    samples = [line for line in first.read_text().splitlines() if line.startswith("vllm:num_requests")]
    lines = ["# TYPE vllm:num_requests_running gauge"]
    for stamp in (1_700_000_000.0, 1_700_000_001.5):
        lines += [f"{line} {stamp}" for line in samples]
    path = tmp_path / "incident.om"
    path.write_text("\n".join(lines) + "\n# EOF\n")
    recording = open_recording(path)
    assert [at for at, _ in recording.scrapes] == [1_700_000_000 * 10**9, 1_700_000_001_500 * 10**6]
    assert all(text.count("vllm:num_requests_running{") == 1 for _, text in recording.scrapes)
    # Prometheus text (no # EOF) has millisecond timestamps.
    path.write_text("\n".join(f"{line} 1700000000000" for line in samples) + "\n")
    assert open_recording(path).scrapes[0][0] == 1_700_000_000 * 10**9


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "no such file"),
        ("", "no scrapes"),
        ("vllm:num_requests_running 1\n", "a sample without a timestamp"),
        ('vllm:num_requests_running{model_name="m"} abc 1700000000000\n', "bad.om:1: the sample's value 'abc' is not"),
        ("hello world\n", r"bad.om:1: not a Prometheus exposition sample \('hello world'\); a recording is a folder"),
    ],
)
def test_bad_recordings_are_named(tmp_path: Path, content: str | None, words: str) -> None:
    target = tmp_path / "absent"
    if content == "":
        target.mkdir()
    elif content is not None:
        target = tmp_path / "bad.om"
        target.write_text(content)
    with pytest.raises(RecordingError, match=words):
        open_recording(target)


def _as_otlp_json(body: bytes) -> str:
    """A protobuf trace export in the OTLP/JSON encoding (ids in hex, as exporters send them)."""
    import base64

    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    document = json_format.MessageToDict(ExportTraceServiceRequest.FromString(body))
    for resource in document.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(document)


def test_trace_bodies_kept_as_gzip_or_as_otlp_json_import_as_the_protobuf_ones(
    tmp_path: Path, shared_data: Path
) -> None:
    # Bodies as exporters post them: gzip (OTEL_EXPORTER_OTLP_COMPRESSION=gzip) and OTLP/JSON
    # with hex ids (http/json). Both were refused ("wire format was corrupt"; "traceId:
    # expected 16 bytes, got 24": the JSON was read as protobuf's JSON, ids in base64).
    import gzip

    folder = tmp_path / "capture"
    shutil.copytree(_capture(shared_data), folder)
    bodies = sorted((folder / "otlp").glob("*.pb"))
    for index, path in enumerate(bodies):
        if index % 2:
            path.with_suffix(".json").write_text(_as_otlp_json(path.read_bytes()))
        else:
            path.with_suffix(".pb.gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    store = f"chdb://{tmp_path / 'store'}"
    runner = CliRunner()
    imported = runner.invoke(app, ["import", str(folder), "--store", store, "--json"])
    assert imported.exit_code == 0, imported.output
    assert json.loads(imported.stdout)["trace_bodies"] == len(bodies) + 7  # and startup_otlp's 7
    summary = json.loads(imported.stdout)
    verdict = runner.invoke(
        app, ["diagnose", "--from", summary["start"], "--to", summary["end"], "--store", store, "--json"]
    )
    assert "121 request spans" in json.loads(verdict.stdout)["notes"][0]  # every span of the capture


def test_a_tarball_may_not_write_outside_its_folder(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar.gz"
    outside = tmp_path / "escaped.txt"
    payload = tmp_path / "payload.txt"
    payload.write_text("x")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(payload, arcname="../escaped.txt")
    with pytest.raises(RecordingError, match="cannot unpack"):
        open_recording(archive, workdir=tmp_path / "unpacked")
    assert not outside.exists()


def test_times_move_only_when_the_store_would_drop_them(shared_data: Path) -> None:
    recording = open_recording(_capture(shared_data))
    last = recording.scrapes[-1][0]
    assert choose_offset_ns(recording, ttl_days=30, now_ns=last + DAY_NS) == 0
    old = choose_offset_ns(recording, ttl_days=30, now_ns=last + 40 * DAY_NS)
    assert old == 40 * DAY_NS - 3600 * 10**9
    assert choose_offset_ns(recording, ttl_days=30, now_ns=last + DAY_NS, shift="now") == DAY_NS - 3600 * 10**9
    with pytest.raises(ValueError, match="shift"):
        choose_offset_ns(recording, ttl_days=30, now_ns=last, shift="later")


def test_inferpath_import_then_diagnose_on_the_store(tmp_path: Path, shared_data: Path) -> None:
    store = f"chdb://{tmp_path / 'store'}"
    runner = CliRunner()
    imported = runner.invoke(app, ["import", str(_capture(shared_data)), "--store", store])
    assert imported.exit_code == 0, imported.output
    assert "imported 69 scrapes (vllm)" in imported.output and "inferpath diagnose --from" in imported.output
    command = imported.output.split("inferpath diagnose ", 1)[1].split()
    verdict = runner.invoke(app, ["diagnose", *command[:4], "--store", store, "--json"])
    assert verdict.exit_code in (0, 1), verdict.output
    body = json.loads(verdict.stdout[verdict.stdout.index("{") :])
    # The printed window holds 121 request rows (the 120 llm_request spans of the run and the
    # one trace of the earlier start in startup_otlp/), but vLLM counted 226 first tokens: the
    # capture stopped with its burst's requests still in the engine, their spans never sent.
    # The engine's own histograms judge it: KV pressure (healthy on the spans alone).
    assert (body["source"], body["current_requests"], body["top_cause"]) == ("histograms", 226, "gpu_memory")
    missing = runner.invoke(app, ["import", str(tmp_path / "nothing"), "--store", store])
    assert missing.exit_code == 2 and "no such file" in missing.output
    # For scripts: the same import as JSON (stored nothing twice), and its refusal too.
    again = runner.invoke(app, ["import", str(_capture(shared_data)), "--store", store, "--json"])
    assert again.exit_code == 0, again.output
    summary = json.loads(again.stdout)
    assert (summary["scrapes"], summary["source"], summary["shift_seconds"]) == (69, "vllm", 0.0)
    assert summary["start"] == command[1] and summary["end"] == command[3]
    twice = runner.invoke(app, ["diagnose", *command[:4], "--store", store, "--json"])
    assert json.loads(twice.stdout)["current_requests"] == 226  # nothing stored twice
    refused = runner.invoke(app, ["import", str(tmp_path / "nothing"), "--store", store, "--json"])
    assert refused.exit_code == 2 and "no such file" in json.loads(refused.stdout)["error"]


def test_a_damaged_or_empty_archive_is_named_and_nothing_unpacked_is_left(
    tmp_path: Path, shared_data: Path, monkeypatch
) -> None:
    import gzip
    import io
    import tempfile

    whole = tmp_path / "whole.tar.gz"
    with tarfile.open(whole, "w:gz") as tar:
        tar.add(_capture(shared_data), arcname="capture")
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    (tmp_path / "zero.tar.gz").write_bytes(b"")
    hollow = tmp_path / "hollow.tar.gz"
    with tarfile.open(hollow, "w:gz") as tar:
        info = tarfile.TarInfo("notes.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    (tmp_path / "text.tar.gz").write_bytes(gzip.compress(b"not a tar"))
    unpacked = tmp_path / "tmp"
    unpacked.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(unpacked))  # where the import unpacks
    runner = CliRunner()
    store = f"chdb://{tmp_path / 'store'}"
    for name, words in (
        ("cut", "cut.tar.gz: the archive is cut short or damaged"),
        ("zero", "zero.tar.gz: the archive is empty"),
        ("hollow", "hollow.tar.gz: no scrapes"),
        ("text", "text.tar.gz: not a tar archive"),
    ):
        result = runner.invoke(app, ["import", str(tmp_path / f"{name}.tar.gz"), "--store", store])
        assert result.exit_code == 2, result.output
        assert words in " ".join(result.output.split()), result.output
        assert "Aborted" not in result.output and "method gz" not in result.output
    imported = runner.invoke(app, ["import", str(whole), "--store", store])
    assert imported.exit_code == 0, imported.output
    assert list(unpacked.iterdir()) == []


def test_import_to_another_program_names_it_not_an_inferpath_server(shared_data: Path) -> None:
    """A real HTTP server on loopback that is not inferpath (Python's file server: 501 for POST)."""
    import http.server
    import threading

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler) as other:
        threading.Thread(target=other.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{other.server_address[1]}"
        try:
            result = CliRunner().invoke(app, ["import", str(_capture(shared_data)), "--server", url])
        finally:
            other.shutdown()
    said = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert f"{url} is not an inferpath server: it answered POST /v1/traces with 501" in said, said
    assert "give --server the address `inferpath up` printed" in said and "<html" not in said.lower()


def test_a_corrupt_trace_body_stops_the_import_before_a_store_is_made(tmp_path: Path, shared_data: Path) -> None:
    import shutil

    recording = tmp_path / "rec"
    shutil.copytree(_capture(shared_data), recording)
    bodies = sorted((recording / "otlp").glob("*.pb"))
    bodies[len(bodies) // 2].write_bytes(b"\xff\xff\xff not protobuf")
    store = tmp_path / "store"
    result = CliRunner().invoke(app, ["import", str(recording), "--store", f"chdb://{store}"])
    said = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert f"{bodies[len(bodies) // 2].name}: not an OTLP ExportTraceServiceRequest" in said, said
    assert not store.exists()  # nothing half imported, no empty store left behind


def _import_without_read_override(recording: Path, store: Path):
    """``inferpath import`` in a process that permissions bind: as root, one without the
    capabilities that read any file (util-linux's setpriv)."""
    import os
    import subprocess
    import sys

    command = [sys.executable, "-c", "from inferpath.cli import app; app()", "import", str(recording)]
    command += ["--store", f"chdb://{store}"]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv: permissions do not bind")
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("unreadable", ["body", "folder"])
def test_an_unreadable_trace_body_or_folder_is_named_without_a_traceback(
    tmp_path: Path, shared_data: Path, unreadable: str
) -> None:
    recording = tmp_path / "rec"
    shutil.copytree(_capture(shared_data), recording)
    target = sorted((recording / "otlp").glob("*.pb"))[3] if unreadable == "body" else recording / "otlp"
    target.chmod(0)
    try:
        result = _import_without_read_override(recording, tmp_path / "store")
    finally:
        target.chmod(0o755)
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, said
    assert "Traceback" not in said, said
    expected = "cannot be read (Permission denied)" if unreadable == "body" else "the folder cannot be read"
    assert f"{target.name}: {expected}" in said, said


def test_scrapes_of_no_known_source_are_counted_or_refused(tmp_path: Path, shared_data: Path) -> None:
    import shutil

    mixed = tmp_path / "mixed"
    shutil.copytree(_capture(shared_data), mixed)
    (mixed / "metrics_1000000000000000000.prom").write_text("garbage that is no exposition\n")
    store = tmp_path / "store"
    result = CliRunner().invoke(app, ["import", str(mixed), "--store", f"chdb://{store}"])
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "imported 69 scrapes (vllm)" in said, said
    assert "skipped 1 scrapes with no metric of a known source (the first recorded at 2001-09-09T01:46:40" in said
    assert "inferpath diagnose --from 2001" not in said  # the window printed covers what was imported

    garbage = tmp_path / "garbage"
    garbage.mkdir()
    for at in (1, 2):
        (garbage / f"metrics_170000000{at}000000000.prom").write_text("my_app_requests_total 3\n")
    result = CliRunner().invoke(app, ["import", str(garbage), "--store", f"chdb://{tmp_path / 'store2'}"])
    said = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "none of the 2 scrapes holds metrics of a known source (names starting vllm:" in said, said
    assert "give --source" in said and not (tmp_path / "store2").exists()
    sourced = CliRunner().invoke(
        app, ["import", str(garbage), "--source", "vllm", "--store", f"chdb://{tmp_path / 's3'}"]
    )
    said = " ".join(sourced.output.split())
    assert sourced.exit_code == 2, sourced.output
    assert "none of the 2 scrapes holds a metric that the vllm collector reads" in said, said
    assert not (tmp_path / "s3").exists()


def test_import_will_not_make_a_store_among_other_files(tmp_path: Path, shared_data: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    result = CliRunner().invoke(app, ["import", str(_capture(shared_data)), "--store", f"chdb://{folder}"])
    said = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert f"{folder} holds other files and no store: give a new or empty folder" in said, said
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


class _BusyServer:
    """A real HTTP server on loopback that answers the first ``busy`` OTLP posts 503 with
    ``Retry-After: 0`` and a protobuf ``google.rpc.Status`` (as the inferpath server does when
    its span log is full), then 200; ``/api/v1/flush`` answers ``{"ok": true}``."""

    def __init__(self, busy: int) -> None:
        import http.server
        import threading

        from google.rpc import status_pb2

        self.posts: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.posts.append(self.path)
                if self.path.startswith("/api/v1/flush"):
                    status, body, kind = 200, b'{"ok": true}', "application/json"
                elif len(owner.posts) <= busy:
                    message = "ingest backlog full (16140165 bytes logged); retry later"
                    status, kind = 503, "application/x-protobuf"
                    body = status_pb2.Status(code=14, message=message).SerializeToString()
                else:
                    status, body, kind = 200, b"", "application/x-protobuf"
                self.send_response(status)
                if status == 503:
                    self.send_header("Retry-After", "0")
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_an_import_waits_out_a_busy_server_and_quotes_its_reason_when_it_stays_busy(monkeypatch) -> None:
    import httpx

    from inferpath.collectors import recording

    prepared = recording.PreparedImport([b"t1", b"t2"], [b"m1"], 1, [], 0, "vllm", None, None)
    busy = _BusyServer(busy=3)
    try:
        with httpx.Client(base_url=busy.url, timeout=10) as client:
            result = recording.post_import(prepared, client)
    finally:
        busy.close()
    assert result.flushed and result.trace_bodies == 2
    # Three 503s waited out, then each body once: nothing skipped, nothing sent twice.
    assert busy.posts == ["/v1/traces"] * 4 + ["/v1/traces", "/v1/metrics", "/api/v1/flush?timeout_seconds=120"]

    monkeypatch.setattr(recording, "BUSY_RETRY_SECONDS", 0.5)
    always = _BusyServer(busy=10_000)
    try:
        with httpx.Client(base_url=always.url, timeout=10) as client, pytest.raises(RecordingError) as refused:
            recording.post_import(prepared, client)
    finally:
        always.close()
    assert str(refused.value) == (
        "the server refused a trace body for 0.5 s (503 Service Unavailable): "
        "ingest backlog full (16140165 bytes logged); retry later"
    )


def test_a_cold_start_behind_a_gateway_reads_as_failures_first_in_the_cli(tmp_path: Path, monkeypatch) -> None:
    """cold_start_gateway_503 imported and diagnosed as a user would: the failed requests lead,
    and the table says the cold start's share is of the failed requests, not of time."""
    from inferpath.cli_app import PIPED_WIDTH, console

    monkeypatch.setattr(console, "width", PIPED_WIDTH)  # as in a pipe, whatever the test runner's terminal
    recording = Path(__file__).resolve().parents[1] / "data" / "vllm_recordings" / "cold_start_gateway_503.tar.gz"
    store = f"chdb://{tmp_path / 'store'}"
    runner = CliRunner()
    imported = runner.invoke(app, ["import", str(recording), "--store", store])
    assert imported.exit_code == 0, imported.output
    command = imported.output.split("inferpath diagnose ", 1)[1].split()
    verdict = runner.invoke(app, ["diagnose", *command[:4], "--store", store])
    said = " ".join(verdict.output.split())
    assert verdict.exit_code == 1, verdict.output
    assert "top cause: cold_start (100% of the failed requests); 30% of requests failed: 69 error (HTTP 503)" in said
    assert "cold_start │ 100% of the failed requests" in said, said
