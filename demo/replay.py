"""Replay a request trace against an OpenAI-compatible gateway, with its real arrival times.

Each trace request becomes one streamed ``/v1/chat/completions`` call whose prompt holds about
``context_tokens`` tokens of text and whose ``max_tokens`` is the trace's ``generated_tokens``.
``speed`` compresses arrival times (``speed=10`` plays 10 s of trace per second).

The replayer is the end user of the traced path: its call is the root CLIENT span of each
trace (through inferpath's instrumented client). It also works out its own TTFT and E2E and
writes them to a results file, a second witness for what the store holds: TTFT to the first
chunk with non-empty ``delta.content``, E2E to the last JSON chunk of the stream (``[DONE]``
is a sentinel, not a chunk), both by its own rule over the chunks it was handed.

Clock: the witness uses the very stamps the span uses, not clock reads of its own. The start
is the span's request-start stamp (``stream.timeline.start_ns``) and each chunk's time is the
``time.perf_counter_ns`` receipt stamp of the network read that completed it (``on_chunk``'s
``received_ns``, the value the span's TTFT and end come from). So client TTFT/E2E in the
store and in the results file agree by construction when the span classifies the chunks,
exports, and is assembled and stored correctly, and any difference is a defect of that path;
with clock reads of its own, any stall between two paired reads (a garbage collection, the
span exporter thread holding the GIL) showed up in the comparison as if it were one.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

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
    """What the replay client measured for one request: seconds on the monotonic clock, from
    the request-start and read-receipt stamps its span also uses (see the module docstring)."""

    index: int
    trace_id: str | None
    http_status: int | None
    ttft_seconds: float | None
    e2e_seconds: float | None
    content_chunks: int
    error: str | None = None


@dataclass(slots=True)
class _ChunkWitness:
    """The replayer's own reading of one stream: which chunks carry content, and when the
    read that completed them arrived (perf_counter ns, the stamps the span uses)."""

    content_chunks: int = 0
    first_content_ns: int | None = None
    last_chunk_ns: int | None = None

    def on_chunk(self, chunk: dict, received_ns: int) -> None:
        self.last_chunk_ns = received_ns
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and (choice.get("delta") or {}).get("content"):
                if self.first_content_ns is None:
                    self.first_content_ns = received_ns
                self.content_chunks += 1


async def _one(client: httpx.AsyncClient, url: str, request: TraceRequest, model: str) -> ReplayResult:
    from inferpath.instrumentation.clients import stream_chat_completion

    payload = {
        "model": model,
        "messages": [{"role": "user", "content": prompt_text(request.context_tokens, request.index)}],
        "max_tokens": request.generated_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    witness = _ChunkWitness()
    stream = stream_chat_completion(client, url, payload, stage=None, on_chunk=witness.on_chunk)
    error: str | None = None
    try:
        async with stream:
            async for _ in stream:
                pass
    except Exception as exc:  # one failed request must not stop the replay
        error = f"{type(exc).__name__}: {exc}"
    timeline = stream.timeline
    start_ns = None if timeline is None else timeline.start_ns

    def since_start(stamp_ns: int | None) -> float | None:
        if stamp_ns is None or start_ns is None:
            return None
        return (stamp_ns - start_ns) / 1e9

    ttft_seconds = since_start(witness.first_content_ns)
    e2e_seconds = None if error is not None else since_start(witness.last_chunk_ns)
    if error is None and e2e_seconds is None:
        error = "stream ended without a chunk"
    return ReplayResult(
        request.index, stream.trace_id, stream.http_status, ttft_seconds, e2e_seconds, witness.content_chunks, error
    )


async def replay(
    gateway_url: str,
    requests: Sequence[TraceRequest],
    *,
    speed: float = 1.0,
    model: str = "llama2-70b",
    results_path: Path | str | None = None,
    on_done: Callable[[ReplayResult], None] | None = None,
) -> list[ReplayResult]:
    """Play ``requests`` against ``{gateway_url}/v1/chat/completions``; returns one result each.

    Requests are started at ``arrival_offset_seconds / speed`` after the call (open loop: a slow
    server does not slow the arrivals). ``results_path`` gets one JSON object per line.
    Raises ``ValueError`` for ``speed`` ≤ 0.
    """
    if speed <= 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    url = f"{gateway_url.rstrip('/')}/v1/chat/completions"
    results: list[ReplayResult] = []
    # The receipt stamps should sit close to the arrivals: with the default 5 ms GIL switch
    # interval, the span exporter's thread could run between a chunk's arrival and the clock
    # read. For the same reason, objects that live through the replay are frozen out of the
    # cyclic garbage collector, whose full collections could otherwise delay that read.
    previous_switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(previous_switch_interval, 0.0002))
    gc.collect()
    gc.freeze()
    try:
        return await _replay(url, requests, speed, model, results_path, on_done, results)
    finally:
        gc.unfreeze()
        sys.setswitchinterval(previous_switch_interval)


async def _replay(
    url: str,
    requests: Sequence[TraceRequest],
    speed: float,
    model: str,
    results_path: Path | str | None,
    on_done: Callable[[ReplayResult], None] | None,
    results: list[ReplayResult],
) -> list[ReplayResult]:
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(600.0, connect=10.0),
        limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
    ) as client:
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
