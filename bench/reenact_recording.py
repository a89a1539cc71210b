"""Re-enact a recorded engine run live and check that the live verdict equals the recorded truth.

Usage::

    python bench/reenact_recording.py tests/data/vllm_recordings/kv_starved.tar.gz [--speed 1]

What runs, all on 127.0.0.1:

- ``inferpath up`` (the real command, a store in a temporary folder, no dashboard) with one
  scrape target: a small HTTP server that answers ``/metrics`` with the recording's scrape
  whose recorded time is the latest one not after "now" on the recording's clock. The server's
  own collector scrapes it at its own interval, as it would scrape the engine.
- The recorded OTLP trace bodies are posted to ``/v1/traces`` at their recorded receive times
  (file names), their span times moved to the present by the same offset.
- When the recording's time has run out, ``inferpath diagnose --json`` is run over the ground
  truth's window (and baseline), moved by the offset, and its top cause is compared with
  ``ground_truth.json``.

Prints the verdict, the expected cause and the wall time; exit 0 when they agree, 1 when not,
2 for bad arguments. ``--speed 2`` plays twice as fast (scrapes and spans alike): faster is a
check of the pipeline, real time (the default) is the re-enactment.
"""

from __future__ import annotations

import argparse
import bisect
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from inferpath.collectors.recording import PROTOBUF, RecordingError, open_recording


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RecordedMetrics:
    """Serves the scrape current on the recording's clock: ``start_ns`` of the recording
    maps to ``t0`` (monotonic seconds), played ``speed`` times as fast."""

    def __init__(self, scrapes: list[tuple[int, str]], t0: float, speed: float) -> None:
        self.times = [at for at, _ in scrapes]
        self.texts = [text for _, text in scrapes]
        self.t0, self.speed = t0, speed

    def current(self) -> str | None:
        recorded_now = self.times[0] + int((time.monotonic() - self.t0) * self.speed * 1e9)
        index = bisect.bisect_right(self.times, recorded_now) - 1
        return self.texts[index] if index >= 0 else None


def serve_metrics(recorded: RecordedMetrics) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            text = recorded.current() if self.path.startswith("/metrics") else None
            body = (text or "").encode()
            self.send_response(200 if text is not None else 503)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", _free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", type=Path)
    parser.add_argument("--speed", type=float, default=1.0)
    args = parser.parse_args(argv)
    if not 0.1 <= args.speed <= 100:
        parser.error(f"--speed must be in [0.1, 100], got {args.speed}")
    try:
        recording = open_recording(args.recording)
    except RecordingError as exc:
        parser.error(str(exc))
    truth = recording.ground_truth
    if truth is None or not recording.scrapes:
        parser.error("the recording needs scrapes and a ground_truth.json")
    from google.protobuf import json_format  # noqa: F401 - protobuf is what the bodies need
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    first_ns, last_ns = recording.time_range_ns()  # type: ignore[misc]
    bodies = []
    for file in recording.trace_files:
        request = ExportTraceServiceRequest()
        request.ParseFromString(file.read_bytes())
        at_ns = int(file.stem.split("_")[0]) if file.stem.split("_")[0].isdigit() else first_ns
        bodies.append((at_ns, request))
    bodies.sort(key=lambda item: item[0])

    workdir = Path(tempfile.mkdtemp(prefix="inferpath-reenact-"))
    port = _free_port()
    server_url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    wall0_ns = time.time_ns()
    metrics_server, metrics_url = serve_metrics(RecordedMetrics(recording.scrapes, t0, args.speed))

    def to_now(recorded_ns: int) -> int:
        """Recorded wall-clock ns → the present run's wall-clock ns."""
        return wall0_ns + int((recorded_ns - first_ns) / args.speed)

    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inferpath.cli",
            "up",
            "--store",
            f"chdb://{workdir / 'store'}",
            "--port",
            str(port),
            "--no-dashboard",
            "--scrape",
            f"vllm={metrics_url}",
        ],
        stdout=(workdir / "up.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        with httpx.Client(base_url=server_url, timeout=60.0) as client:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.5)
            else:
                print(f"inferpath up did not start; see {workdir / 'up.log'}")
                return 1
            for at_ns, request in bodies:
                delay = (to_now(at_ns) - time.time_ns()) / 1e9
                if delay > 0:
                    time.sleep(delay)
                for resource_spans in request.resource_spans:
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            # Span times keep their place relative to the recording's clock.
                            span.start_time_unix_nano = to_now(span.start_time_unix_nano)
                            span.end_time_unix_nano = to_now(span.end_time_unix_nano)
                client.post("/v1/traces", content=request.SerializeToString(), headers=PROTOBUF).raise_for_status()
            remaining = (to_now(last_ns) - time.time_ns()) / 1e9
            if remaining > 0:
                time.sleep(remaining + 2.0)
            client.post("/api/v1/flush").raise_for_status()
        window = truth["window"]
        command = [
            sys.executable,
            "-m",
            "inferpath.cli",
            "diagnose",
            "--json",
            "--server",
            server_url,
            "--from",
            str(to_now(window["start_unix_ns"]) / 1e9),
            "--to",
            str(to_now(window["end_unix_ns"]) / 1e9),
        ]
        if truth.get("baseline"):
            command += [
                "--baseline-from",
                str(to_now(truth["baseline"]["start_unix_ns"]) / 1e9),
                "--baseline-to",
                str(to_now(truth["baseline"]["end_unix_ns"]) / 1e9),
            ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    finally:
        up.terminate()
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
        metrics_server.shutdown()
    try:
        verdict = json.loads(result.stdout)
    except ValueError:
        print(f"diagnose printed no JSON: {result.stdout[:300]} {result.stderr[:300]}")
        return 1
    got = "healthy" if verdict.get("healthy") else verdict.get("top_cause")
    expected = truth["expected_top_cause"]
    print(
        f"{truth.get('name', args.recording.name)}: live verdict {got!r} ({verdict.get('summary', verdict)}); "
        f"recorded truth {expected!r}; {time.monotonic() - t0:.0f} s at speed {args.speed:g}"
    )
    return 0 if got == expected else 1


if __name__ == "__main__":
    sys.exit(main())
