"""Accuracy: TTFT and ITL measured by inferpath vs the true token times of a scripted server.

A scripted OpenAI-compatible SSE server runs in its own process and writes, for every
request, a role chunk at once, the first token at ``--ttft-ms``, then one token every
``--itl-ms`` (``--tokens`` in all), finish, usage and ``[DONE]``, logging the monotonic
time (``CLOCK_MONOTONIC``, shared by all processes on Linux) right after each token's
``send`` returned, and how late that write was on its schedule. The client streams with
``stream_chat_completion`` at concurrency 1 and 64; at 64 twice: "burst" (each call starts
as soon as a slot frees, so 64 first tokens are written in the same instant) and "poisson"
(exponential arrivals keeping ~64 calls in flight, as a service's independent users do).
Errors per request (signed; the tables report their absolute values):

* TTFT error = inferpath's TTFT − (server's first-token write − the client span's start);
* ITL error = inferpath's mean ITL − the mean gap of the server's token writes.

The reference is the server's write: the error holds everything between that write and
inferpath's stamp (kernel delivery, the client's event loop reaching the socket, the read
path), so a stalled client shows up in it, as it would in a service.

Each case runs three times, interleaved: "default", when the bytes come out of httpx
(inferpath's default, which touches nothing in the host); "kernel", the opt-in
``instrument(..., kernel_receive_timestamps=True)``: the kernel's receive timestamp of the
connection's raw socket read (``SO_TIMESTAMPNS``; ``instrumentation/receipt.py``); "raw
read", the opt-in where the kernel gives no timestamp: the moment of that read in user
space, or the earlier moment a probe saw the bytes waiting (``receipt.kernel_stamps =
False``). So the three compare under the same load; the case's summary is the default's. Printed beside each case: load average, the client's GC pauses
(``gc.callbacks``), the server's lag behind its schedule, and the client loop's lag (a 1 ms
ticker, with ``--diagnose`` only, as it adds its own wakeups).

Harness settings, all printed (why: bench/README.md, Instrumentation, "Accuracy"):

* spans go to the scripted server's ``/v1/traces`` sink through the standard OTLP/HTTP
  protobuf exporter, as in a service (encoding on the SDK's export thread; nothing kept);
* ``--pin``: client on CPU 0, server on CPU 1 (``os.sched_setaffinity``), so the measured
  client and the scripted server do not queue behind each other on one core;
* ``--nice N`` (negative, needs privileges): client and server scheduled ahead of the other
  processes of a shared machine, as a service with reserved cores would be;
* ``--realtime`` (needs privileges): client and server under ``SCHED_FIFO``, the only way to
  keep the other tenants of a shared machine off them (``nice`` is relative within a
  scheduler autogroup); the kernel's RT throttling still leaves others 5%. The client's
  event-loop thread gets priority 2 and its span export thread 1: two FIFO threads of equal
  priority on one core never preempt each other, which no time-sharing scheduler does;
* ``--exporter memory``: the SDK's in-memory exporter instead of OTLP (keeps every span;
  only to tell the export thread's share of the tail);
* ``--gc-freeze``: ``gc.freeze()`` after the warm-up (what a service does after start-up
  to keep its long-lived objects out of full collections; off by default);
* a warm-up of one full wave at the highest concurrency before measuring;
* a full collection before each case, outside its measured window: each case runs its own
  event loop and client, and the previous one's loop, client and connections are cyclic
  garbage that would otherwise be freed by a 30-80 ms collection inside the next case, a
  stall that a service keeping one loop and one client does not have. The collections the
  case's own calls cause are measured and printed.

    python bench/bench_accuracy.py [--requests N] [--requests-c1 M] [--tokens T]
        [--ttft-ms A] [--itl-ms B] [--rounds R] [--pin] [--nice N] [--realtime]
        [--exporter otlp|memory] [--gc-freeze] [--diagnose]

Targets of the default: |TTFT error| p99 <= 3 ms at concurrency 1 and <= 10 ms at 64, on a
quiet machine. The opt-in keeps p99 well under 1 ms in both.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from inferpath.instrumentation import receipt
from inferpath.instrumentation.clients import stream_chat_completion

SERVER = r"""
import asyncio, json, os, socket, sys, time
ttft, itl, tokens, log_path = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
log = open(log_path, "w")
def frame(delta, finish=None):
    return ("data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n").encode()
async def handle(reader, writer):
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")), 0)
    raw = await reader.readexactly(length)
    if head.startswith(b"POST /v1/traces"):  # OTLP sink: accept and forget
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        await writer.drain(); writer.close(); return
    body = json.loads(raw)
    arrived = time.perf_counter()
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + frame({"role": "assistant", "content": ""}))
    await writer.drain()
    stamps, lags = [], []
    for i in range(tokens):
        due = arrived + ttft + i * itl
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        writer.write(frame({"content": "t%d" % i}))
        await writer.drain()
        stamps.append(time.perf_counter())
        lags.append(stamps[-1] - due)
    writer.write(frame({}, "stop") + ("data: " + json.dumps({"choices": [], "usage": {"completion_tokens": tokens}}) + "\n\n").encode() + b"data: [DONE]\n\n")
    await writer.drain()
    writer.close()
    log.write(json.dumps({"id": body["user"], "stamps": stamps, "lags": lags}) + "\n"); log.flush()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""

#: stamp -> (receipt.enabled, receipt.kernel_stamps)
STAMPS = {"default": (False, False), "kernel": (True, True), "raw read": (True, False)}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class GcPauses:
    """Wall time of the client's collections, from ``gc.callbacks`` (start/stop pairs)."""

    def __init__(self) -> None:
        self.pauses_ms: list[float] = []
        self._started = 0.0

    def __call__(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses_ms.append((time.perf_counter() - self._started) * 1e3)


async def _loop_lag(lags_ms: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        began = time.perf_counter()
        await asyncio.sleep(0.001)
        lags_ms.append((time.perf_counter() - began - 0.001) * 1e3)


async def client_run(
    url: str,
    requests: int,
    concurrency: int,
    prefix: str,
    mean_gap_seconds: float = 0.0,
    lags_ms: list[float] | None = None,
) -> dict[str, tuple]:
    """Stream ``requests`` calls, at most ``concurrency`` at once. ``mean_gap_seconds`` 0:
    every waiting call starts as soon as a slot frees (all first tokens of a wave are written
    in the same instant); > 0: calls arrive with exponential gaps of that mean (seeded).
    Returns ``{request id: (start_ns, ttft_seconds, itl_seconds)}`` (perf_counter clock)."""
    results: dict[str, tuple] = {}
    gate = asyncio.Semaphore(concurrency)
    rng = random.Random(7)
    offsets, at = [], 0.0
    for _ in range(requests):
        offsets.append(at)
        at += rng.expovariate(1 / mean_gap_seconds) if mean_gap_seconds > 0 else 0.0
    stop = asyncio.Event()
    ticker = asyncio.create_task(_loop_lag(lags_ms, stop)) if lags_ms is not None else None
    began = time.perf_counter()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def one(index: int) -> None:
            request_id = f"{prefix}-{index}"
            delay = began + offsets[index] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with gate:
                stream = stream_chat_completion(
                    client, url, {"model": "m", "user": request_id, "messages": []}, stage=None
                )
                async with stream:
                    async for _ in stream:
                        pass
                timeline = stream.timeline
                results[request_id] = (timeline.start_ns, timeline.ttft_seconds, timeline.itl_seconds)

        await asyncio.gather(*(one(i) for i in range(requests)))
    stop.set()
    if ticker is not None:
        await ticker
    return results


def _errors(measured: dict[str, tuple], writes: dict[str, dict]) -> dict[str, float]:
    ttft_errors, itl_errors, server_lags = [], [], []
    for request_id, (start_ns, ttft, itl) in measured.items():
        stamps = writes[request_id]["stamps"]
        true_ttft = stamps[0] - start_ns / 1e9
        true_itl = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
        ttft_errors.append((ttft - true_ttft) * 1e3)
        itl_errors.append((itl - true_itl) * 1e3)
        server_lags.extend(lag * 1e3 for lag in writes[request_id]["lags"])
    ttft_abs, itl_abs = [abs(e) for e in ttft_errors], [abs(e) for e in itl_errors]
    return {
        "ttft_p50_ms": percentile(ttft_abs, 0.5),
        "ttft_p99_ms": percentile(ttft_abs, 0.99),
        "ttft_max_ms": max(ttft_abs),
        "ttft_min_signed_ms": min(ttft_errors),
        "itl_p50_ms": percentile(itl_abs, 0.5),
        "itl_p99_ms": percentile(itl_abs, 0.99),
        "server_lag_p99_ms": percentile(server_lags, 0.99),
        "requests": len(measured),
    }


def run(
    requests: int,
    tokens: int,
    ttft_ms: float,
    itl_ms: float,
    *,
    requests_c1: int = 100,
    rounds: int = 1,
    pin: bool = False,
    nice: int = 0,
    realtime: bool = False,
    exporter: str = "otlp",
    gc_freeze: bool = False,
    diagnose: bool = False,
) -> dict[str, dict]:
    """Run every case ``rounds`` times with both stamps interleaved; returns
    ``{case: row}`` where row holds the raw-read stamp's figures of the last round
    (``ttft_p50_ms``, ``ttft_p99_ms``, ``itl_p50_ms``, ``itl_p99_ms``, ``requests``, ...)
    and ``rounds``: every round's rows for both stamps."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from inferpath.instrumentation import provider

    pauses = GcPauses()
    report: dict[str, dict] = {}
    call_seconds = (ttft_ms + (tokens - 1) * itl_ms) / 1000
    cases = {"1": (1, 0.0), "64 burst": (64, 0.0), "64 poisson": (64, call_seconds / 64)}
    pinned = pin and len(os.sched_getaffinity(0)) >= 2
    affinity = os.sched_getaffinity(0)
    own_priority = os.getpriority(os.PRIO_PROCESS, 0)
    own_policy, own_param = os.sched_getscheduler(0), os.sched_getparam(0)
    with tempfile.TemporaryDirectory() as folder:
        log_path = Path(folder) / "writes.jsonl"
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(ttft_ms / 1000), str(itl_ms / 1000), str(tokens), str(log_path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            if pinned:
                cpus = sorted(affinity)
                os.sched_setaffinity(server.pid, {cpus[1]})
                os.sched_setaffinity(0, {cpus[0]})
            if nice:
                os.setpriority(os.PRIO_PROCESS, server.pid, nice)
                os.setpriority(os.PRIO_PROCESS, 0, nice)
            if realtime:
                os.sched_setscheduler(server.pid, os.SCHED_FIFO, os.sched_param(1))
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
            port = int(server.stdout.readline())
            base = f"http://127.0.0.1:{port}"
            url = f"{base}/v1/chat/completions"
            if exporter == "memory":
                from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                    InMemorySpanExporter,
                )

                span_exporter = InMemorySpanExporter()
            else:
                span_exporter = OTLPSpanExporter(endpoint=f"{base}/v1/traces", timeout=2)
            provider.configure("bench-accuracy", span_exporter=span_exporter)
            if realtime:  # the export thread, started above, stays at priority 1
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(2))
            # One full wave at the highest concurrency: connections, code paths, caches.
            asyncio.run(client_run(url, 64, 64, "warm-up"))
            asyncio.run(client_run(url, 4, 1, "warm-up-1"))
            if gc_freeze:
                gc.collect()
                gc.freeze()
            gc.callbacks.append(pauses)
            cores = "client cpu {}, server cpu {}".format(*sorted(affinity)[:2]) if pinned else "no"
            sink = "in-memory" if exporter == "memory" else "OTLP/HTTP to a local sink"
            print(
                f"settings: pin={cores}, nice={nice}, realtime={realtime}, "
                f"gc_freeze={gc_freeze}, exporter={sink}, tokens={tokens}, "
                f"ttft={ttft_ms:g} ms, itl={itl_ms:g} ms"
            )
            for round_index in range(rounds):
                for case_index, (case, (concurrency, mean_gap)) in enumerate(cases.items()):
                    count = min(requests, requests_c1) if concurrency == 1 else requests
                    # Alternate which stamp goes first: a full collection tends to fall in
                    # the second round of a pair (httpx leaves ~75 cyclic objects a call).
                    order = list(STAMPS.items())
                    if (round_index + case_index) % 2:
                        order.reverse()
                    for stamp, (enabled, kernel) in order:
                        receipt.enabled, receipt.kernel_stamps = enabled, kernel
                        # The previous case's event loop, client and 64 connections are
                        # cyclic garbage (~10k objects with finalizers); freed by a full
                        # collection inside this case, they stall it 40-80 ms, which no
                        # service that keeps its loop and client sees. Free them here.
                        gc.collect()
                        pauses.pauses_ms.clear()
                        lags_ms: list[float] | None = [] if diagnose else None
                        load = os.getloadavg()[0]
                        prefix = f"r{round_index}-{case.replace(' ', '-')}-{stamp.replace(' ', '-')}"
                        measured = asyncio.run(client_run(url, count, concurrency, prefix, mean_gap, lags_ms))
                        time.sleep(0.2)  # the server logs a request after its last write
                        writes = {}
                        for line in log_path.read_text().splitlines():
                            entry = json.loads(line)
                            writes[entry["id"]] = entry
                        row = _errors(measured, writes)
                        row.update(
                            stamp=stamp,
                            round=round_index,
                            load_average=load,
                            gc_pauses=len(pauses.pauses_ms),
                            gc_max_ms=max(pauses.pauses_ms, default=0.0),
                        )
                        if lags_ms:
                            row.update(loop_lag_p99_ms=percentile(lags_ms, 0.99), loop_lag_max_ms=max(lags_ms))
                        print(_line(case, row), flush=True)
                        entry = report.setdefault(case, {"rounds": []})
                        entry["rounds"].append(row)
                        if not enabled:
                            entry.update({k: v for k, v in row.items() if k != "rounds"})
        finally:
            receipt.enabled, receipt.kernel_stamps = False, True
            if gc_freeze:
                gc.unfreeze()
            if pauses in gc.callbacks:
                gc.callbacks.remove(pauses)
            if pinned:
                os.sched_setaffinity(0, affinity)
            if nice:
                os.setpriority(os.PRIO_PROCESS, 0, own_priority)
            if realtime:
                os.sched_setscheduler(0, own_policy, own_param)
            provider.shutdown(2.0)
            server.kill()
            server.wait()
    return report


def _line(case: str, row: dict) -> str:
    text = (
        f"concurrency {case:<10} stamp {row['stamp']:<11} ({row['requests']} requests, load "
        f"{row['load_average']:.1f}): |TTFT error| p50 {row['ttft_p50_ms']:.3f} ms, p99 "
        f"{row['ttft_p99_ms']:.3f} ms, max {row['ttft_max_ms']:.3f} (signed min "
        f"{row['ttft_min_signed_ms']:.3f}); |ITL error| p50 "
        f"{row['itl_p50_ms']:.3f} ms, p99 {row['itl_p99_ms']:.3f} ms; server lag p99 "
        f"{row['server_lag_p99_ms']:.2f} ms; gc {row['gc_pauses']} pauses, max "
        f"{row['gc_max_ms']:.1f} ms"
    )
    if "loop_lag_p99_ms" in row:
        text += f"; loop lag p99 {row['loop_lag_p99_ms']:.2f} ms, max {row['loop_lag_max_ms']:.1f}"
    return text + " (default's target: p99 <= 3 at concurrency 1, <= 10 at 64)"


def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--requests", type=int, default=256, help="per case at concurrency 64")
    parser.add_argument(
        "--requests-c1",
        type=int,
        default=100,
        help="at concurrency 1 (at most --requests; each takes one call's duration)",
    )
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--ttft-ms", type=float, default=100.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pin", action="store_true", help="client on CPU 0, server on CPU 1")
    parser.add_argument(
        "--nice", type=int, default=0, help="scheduling priority of client and server (negative needs privileges)"
    )
    parser.add_argument("--realtime", action="store_true", help="client and server under SCHED_FIFO (needs privileges)")
    parser.add_argument("--exporter", choices=("otlp", "memory"), default="otlp")
    parser.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after the warm-up")
    parser.add_argument("--diagnose", action="store_true", help="measure the client loop's lag")
    args = parser.parse_args(argv)
    return run(
        args.requests,
        args.tokens,
        args.ttft_ms,
        args.itl_ms,
        requests_c1=args.requests_c1,
        rounds=args.rounds,
        pin=args.pin,
        nice=args.nice,
        realtime=args.realtime,
        exporter=args.exporter,
        gc_freeze=args.gc_freeze,
        diagnose=args.diagnose,
    )


if __name__ == "__main__":
    main()
