"""Replay a request trace against an OpenAI-compatible gateway, with its real arrival times.

Each trace request becomes one streamed ``/v1/chat/completions`` call whose prompt holds about
``context_tokens`` tokens of text and whose ``max_tokens`` is the trace's ``generated_tokens``.
``speed`` compresses arrival times (``speed=10`` plays 10 s of trace per second).

The replayer is the end user of the traced path: its call is the root CLIENT span of each
trace (through inferpath's instrumented client). Independently of that span, it measures its
own TTFT and E2E on the monotonic clock (``time.perf_counter_ns``) — TTFT to the first chunk
with non-empty content, E2E to the last chunk of the stream (``[DONE]`` is a sentinel, not a
chunk) — and writes them to a results file, so
that what the store holds can be checked against a second witness.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import httpx

from inferpath.demo.trace import TraceRequest

# Filler text for prompts: plain English words that the WordPiece tokenizer keeps whole,
# so the prompt's token count tracks the trace's ContextTokens closely.
_FILLER_WORDS = (
    "the request path of an inference service runs through a gateway a retrieval step a queue "
    "and the model server where the prompt and the answer share the same device while users "
    "wait for the first token and then for every next one"
).split()


def prompt_text(context_tokens: int, index: int) -> str:
    """A prompt of about ``context_tokens`` tokens (one token per filler word)."""
    words = [_FILLER_WORDS[(index + i) % len(_FILLER_WORDS)] for i in range(max(1, context_tokens))]
    return " ".join(words)


@dataclass(slots=True)
class ReplayResult:
    """What the replay client measured for one request (seconds, monotonic clock)."""

    index: int
    trace_id: str | None
    http_status: int | None
    ttft_seconds: float | None
    e2e_seconds: float | None
    content_chunks: int
    error: str | None = None


async def _one(client: httpx.AsyncClient, url: str, request: TraceRequest, model: str) -> ReplayResult:
    from inferpath.instrumentation.clients import stream_chat_completion

    payload = {
        "model": model,
        "messages": [{"role": "user", "content": prompt_text(request.context_tokens, request.index)}],
        "max_tokens": request.generated_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = 0
    ttft_ns: int | None = None
    last_event_ns = 0
    stream = stream_chat_completion(client, url, payload, stage=None)
    start_ns = time.perf_counter_ns()
    try:
        async with stream:
            async for event in stream:
                last_event_ns = time.perf_counter_ns()
                for choice in event.get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        if ttft_ns is None:
                            ttft_ns = time.perf_counter_ns() - start_ns
                        chunks += 1
        e2e_ns = last_event_ns - start_ns if last_event_ns else None
    except Exception as exc:  # one failed request must not stop the replay
        return ReplayResult(request.index, getattr(stream, "trace_id", None), getattr(stream, "http_status", None),
                            None if ttft_ns is None else ttft_ns / 1e9, None, chunks, f"{type(exc).__name__}: {exc}")
    return ReplayResult(request.index, getattr(stream, "trace_id", None), getattr(stream, "http_status", None),
                        None if ttft_ns is None else ttft_ns / 1e9,
                        None if e2e_ns is None else e2e_ns / 1e9, chunks,
                        None if e2e_ns is not None else "stream ended without a chunk")


async def replay(gateway_url: str, requests: Sequence[TraceRequest], *, speed: float = 1.0,
                 model: str = "llama2-70b", results_path: Path | str | None = None,
                 on_done: Callable[[ReplayResult], None] | None = None) -> list[ReplayResult]:
    """Play ``requests`` against ``{gateway_url}/v1/chat/completions``; returns one result each.

    Requests are started at ``arrival_offset_seconds / speed`` after the call (open loop: a slow
    server does not slow the arrivals). ``results_path`` gets one JSON object per line.
    Raises ``ValueError`` for ``speed`` ≤ 0.
    """
    if speed <= 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    url = f"{gateway_url.rstrip('/')}/v1/chat/completions"
    results: list[ReplayResult] = []
    # The replayer is a measuring witness: with the default 5 ms GIL switch interval, the span
    # exporter's thread could sit between a chunk's arrival and the reading of the clock.
    # For the same reason, objects that live through the replay are frozen out of the cyclic
    # garbage collector, whose full collections could otherwise pause the clock readings.
    previous_switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(previous_switch_interval, 0.0002))
    gc.collect()
    gc.freeze()
    try:
        return await _replay(url, requests, speed, model, results_path, on_done, results)
    finally:
        gc.unfreeze()
        sys.setswitchinterval(previous_switch_interval)


async def _replay(url: str, requests: Sequence[TraceRequest], speed: float, model: str,
                  results_path: Path | str | None, on_done: Callable[[ReplayResult], None] | None,
                  results: list[ReplayResult]) -> list[ReplayResult]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0),
                                 limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256)) as client:
        start = time.perf_counter()

        async def scheduled(request: TraceRequest) -> ReplayResult:
            delay = start + request.arrival_offset_seconds / speed - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            result = await _one(client, url, request, model)
            results.append(result)
            if on_done is not None:
                on_done(result)
            return result

        ordered = await asyncio.gather(*(scheduled(r) for r in requests))
    if results_path is not None:
        with Path(results_path).open("w") as handle:
            for result in ordered:
                handle.write(json.dumps(asdict(result)) + "\n")
    return list(ordered)
