"""Accuracy: TTFT and ITL measured by inferpath vs the true token times of a scripted server.

A scripted OpenAI-compatible SSE server runs in its own process and writes, for every
request, a role chunk at once, the first token at ``--ttft-ms``, then one token every
``--itl-ms`` (``--tokens`` in all), finish, usage and ``[DONE]``, logging the monotonic
time (``CLOCK_MONOTONIC``, shared by all processes on Linux) of each write. The client
streams with ``stream_chat_completion`` at concurrency 1 and 64; at 64 twice: "burst" (each
call starts as soon as a slot frees, so 64 first tokens are written in the same instant and
read one after another by the one client event loop) and "poisson" (exponential arrivals
keeping ~64 calls in flight, as a service's independent users do). Errors per request:

* TTFT error = inferpath's TTFT − (server's first-token write − the client span's start);
* ITL error = inferpath's mean ITL − the mean gap of the server's token writes.

So the error is what inferpath adds on top of delivery: parsing, scheduling, clock reads.

    python bench/bench_accuracy.py [--requests N] [--tokens T] [--ttft-ms A] [--itl-ms B]
Target (issue 3): |error| <= 1 ms at p50 and <= 3 ms at p99, at concurrency 1 and 64.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from inferpath.instrumentation.clients import stream_chat_completion

SERVER = r'''
import asyncio, json, socket, sys, time
ttft, itl, tokens, log_path = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
log = open(log_path, "w")
def frame(delta, finish=None):
    return ("data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n").encode()
async def handle(reader, writer):
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")), 0)
    body = json.loads(await reader.readexactly(length))
    arrived = time.perf_counter()
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + frame({"role": "assistant", "content": ""}))
    await writer.drain()
    stamps = []
    for i in range(tokens):
        delay = arrived + ttft + i * itl - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        writer.write(frame({"content": "t%d" % i}))
        await writer.drain()
        stamps.append(time.perf_counter())
    writer.write(frame({}, "stop") + ("data: " + json.dumps({"choices": [], "usage": {"completion_tokens": tokens}}) + "\n\n").encode() + b"data: [DONE]\n\n")
    await writer.drain()
    writer.close()
    log.write(json.dumps({"id": body["user"], "stamps": stamps}) + "\n"); log.flush()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
'''


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def client_run(url: str, requests: int, concurrency: int, prefix: str,
                     mean_gap_seconds: float = 0.0) -> dict[str, tuple]:
    """Stream ``requests`` calls, at most ``concurrency`` at once. ``mean_gap_seconds`` 0:
    every waiting call starts as soon as a slot frees (all first tokens of a wave are written
    in the same instant); > 0: calls arrive with exponential gaps of that mean (seeded)."""
    results: dict[str, tuple] = {}
    gate = asyncio.Semaphore(concurrency)
    rng = random.Random(7)
    offsets, at = [], 0.0
    for _ in range(requests):
        offsets.append(at)
        at += rng.expovariate(1 / mean_gap_seconds) if mean_gap_seconds > 0 else 0.0
    began = time.perf_counter()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        async def one(index: int) -> None:
            request_id = f"{prefix}-{index}"
            delay = began + offsets[index] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with gate:
                stream = stream_chat_completion(client, url, {"model": "m", "user": request_id,
                                                              "messages": []}, stage=None)
                async with stream:
                    async for _ in stream:
                        pass
                timeline = stream.timeline
                results[request_id] = (timeline.start_ns, timeline.ttft_seconds, timeline.itl_seconds)

        await asyncio.gather(*(one(i) for i in range(requests)))
    return results


def run(requests: int, tokens: int, ttft_ms: float, itl_ms: float) -> dict[str, dict[str, float]]:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from inferpath.instrumentation import provider

    provider.configure("bench-accuracy", span_exporter=InMemorySpanExporter())
    report: dict[str, dict[str, float]] = {}
    # Poisson arrivals that keep ~64 calls in flight: rate = 64 / one call's duration.
    call_seconds = (ttft_ms + (tokens - 1) * itl_ms) / 1000
    cases = {"1": (1, 0.0), "64 burst": (64, 0.0), "64 poisson": (64, call_seconds / 64)}
    with tempfile.TemporaryDirectory() as folder:
        log_path = Path(folder) / "writes.jsonl"
        server = subprocess.Popen([sys.executable, "-c", SERVER, str(ttft_ms / 1000),
                                   str(itl_ms / 1000), str(tokens), str(log_path)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            port = int(server.stdout.readline())
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            asyncio.run(client_run(url, 8, 8, "warm-up"))  # connections, imports, caches
            for case, (concurrency, mean_gap) in cases.items():
                measured = asyncio.run(client_run(url, requests, concurrency, case.replace(" ", "-"), mean_gap))
                time.sleep(0.2)
                writes = {}
                for line in log_path.read_text().splitlines():
                    entry = json.loads(line)
                    writes[entry["id"]] = entry["stamps"]
                ttft_errors, itl_errors = [], []
                for request_id, (start_ns, ttft, itl) in measured.items():
                    stamps = writes[request_id]
                    true_ttft = stamps[0] - start_ns / 1e9
                    true_itl = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
                    ttft_errors.append(abs(ttft - true_ttft) * 1e3)
                    itl_errors.append(abs(itl - true_itl) * 1e3)
                report[case] = {
                    "ttft_p50_ms": percentile(ttft_errors, 0.5), "ttft_p99_ms": percentile(ttft_errors, 0.99),
                    "itl_p50_ms": percentile(itl_errors, 0.5), "itl_p99_ms": percentile(itl_errors, 0.99),
                    "requests": len(measured)}
        finally:
            server.kill()
            server.wait()
    provider.shutdown(2.0)
    return report


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--ttft-ms", type=float, default=100.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    args = parser.parse_args(argv)
    report = run(args.requests, args.tokens, args.ttft_ms, args.itl_ms)
    for case, row in report.items():
        print(f"concurrency {case:<10} ({row['requests']} requests): |TTFT error| p50 "
              f"{row['ttft_p50_ms']:.3f} ms, p99 {row['ttft_p99_ms']:.3f} ms; |ITL error| p50 "
              f"{row['itl_p50_ms']:.3f} ms, p99 {row['itl_p99_ms']:.3f} ms "
              "(target p50 <= 1, p99 <= 3)")
    return report


if __name__ == "__main__":
    main()
