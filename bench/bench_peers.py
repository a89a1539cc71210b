"""Peers: overhead added to one streamed OpenAI-client call by inferpath, OpenLLMetry
(``traceloop-sdk``) and the Langfuse SDK, all measured in the same run.

Each side runs in its own Python process (these SDKs patch the ``openai`` package for
the life of the process, so they cannot be measured one after the other in one process):
``bare`` (no instrumentation, the reference), ``inferpath``, ``traceloop`` and
``langfuse``. Every process makes the same streamed ``chat.completions.create`` calls
with the openai SDK against one scripted local SSE server (20 tokens, no delays), and
exports to an in-memory/discarding sink (traceloop: its ``exporter`` argument; langfuse:
its OTel span processor pointed at a closed local port, export off the request path).
Overhead = median per-call time − the bare median.

The peers pull heavy dependency trees, so they are installed in a separate virtualenv:

    python -m venv /tmp/peers && /tmp/peers/bin/pip install traceloop-sdk langfuse openai
    /tmp/peers/bin/pip install --no-deps -e . && /tmp/peers/bin/pip install pydantic typer rich \
        opentelemetry-exporter-otlp-proto-http
    /tmp/peers/bin/python bench/bench_peers.py [--calls N]
Target (issue 3): inferpath's overhead <= 0.5 x each peer's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

SERVER = r"""
import asyncio, json, sys
def frame(delta, finish=None):
    return ("data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n").encode()
BODY = frame({"role": "assistant", "content": ""}) + b"".join(frame({"content": " t%d" % i}) for i in range(20)) \
    + frame({}, "stop") + b"data: [DONE]\n\n"
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")), 0)
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % len(BODY) + BODY)
            await writer.drain()
    except Exception:
        writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=256)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""

CLIENT = r"""
import json, os, statistics, sys, time
side, port, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
class Discard(SpanExporter):
    def export(self, spans): return SpanExportResult.SUCCESS
if side == "inferpath":
    import inferpath
    inferpath.instrument(service_name="bench", span_exporter=Discard(), integrations=("openai",))
elif side == "traceloop":
    from traceloop.sdk import Traceloop
    Traceloop.init(app_name="bench", exporter=Discard(), disable_batch=False, telemetry_enabled=False)
elif side == "langfuse":
    os.environ.update(LANGFUSE_PUBLIC_KEY="pk-lf-bench", LANGFUSE_SECRET_KEY="sk-lf-bench",
                      LANGFUSE_HOST="http://127.0.0.1:9", LANGFUSE_BASE_URL="http://127.0.0.1:9")
    from langfuse.openai import openai as patched  # noqa: F401  (patches the openai SDK)
import openai
client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="x", max_retries=0)
def call():
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    return sum(1 for c in stream if c.choices and c.choices[0].delta.content)
for _ in range(50):
    call()
durations = []
for _ in range(calls):
    started = time.perf_counter(); tokens = call(); durations.append(time.perf_counter() - started)
assert tokens == 20, tokens
print(json.dumps({"side": side, "median_us": statistics.median(durations) * 1e6}))
os._exit(0)  # no exporter flush in the measurement process
"""


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    medians: dict[str, float] = {}
    try:
        port = server.stdout.readline().strip()
        for _ in range(args.rounds):  # interleaved; best median of each side
            for side in ("bare", "inferpath", "traceloop", "langfuse"):
                done = subprocess.run(
                    [sys.executable, "-c", CLIENT, side, port, str(args.calls)],
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                if done.returncode != 0:
                    print(f"{side}: failed: {done.stderr.strip().splitlines()[-1:]}")
                    continue
                value = json.loads(done.stdout.strip().splitlines()[-1])["median_us"]
                medians[side] = min(medians.get(side, float("inf")), value)
    finally:
        server.kill()
    bare = medians["bare"]
    print(f"bare openai streamed call (reference): {bare:.0f} us")
    for side in ("inferpath", "traceloop", "langfuse"):
        if side in medians:
            print(f"{side:>9} adds {medians[side] - bare:7.0f} us/call")
    ours = medians.get("inferpath", bare) - bare
    for peer in ("traceloop", "langfuse"):
        if peer in medians and medians[peer] - bare > 0:
            print(f"ratio inferpath/{peer}: {ours / (medians[peer] - bare):.2f} (target <= 0.5)")
    return medians


if __name__ == "__main__":
    main()
