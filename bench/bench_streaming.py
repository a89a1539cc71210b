"""Streaming: the cost per token of TTFT/ITL tracking over an uninstrumented pass-through.

A recorded-shape OpenAI stream (role chunk, N one-token content chunks, finish, usage,
``[DONE]``, one SSE event per network read) is passed through three ways:

* reference: the reads are handed on untouched (what a proxy without tracking does);
* meter: inferpath's ``ChatStreamMeter.feed`` on every read (SSE parse, JSON decode,
  visible-token rule, timeline stamp), as the gateway middleware, ``stream_chat_completion``
  and the httpx/openai integration do.

Per-token cost = (variant − reference) / tokens; best of interleaved rounds.

    python bench/bench_streaming.py [--tokens N] [--rounds R]
Target (issue 3): <= 0.5 us per token.
"""

from __future__ import annotations

import argparse
import json
import time

from inferpath.instrumentation.streaming import ChatStreamMeter


def recorded_reads(tokens: int) -> list[bytes]:
    def frame(delta: dict, finish: str | None = None) -> bytes:
        chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                 "model": "emulated-7b",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(chunk)}\n\n".encode()

    reads = [frame({"role": "assistant", "content": ""})]
    reads += [frame({"content": f" tok{i}"}) for i in range(tokens)]
    reads.append(frame({}, "stop"))
    reads.append(("data: " + json.dumps({"id": "chatcmpl-1", "choices": [], "usage": {
        "prompt_tokens": 7, "completion_tokens": tokens}}) + "\n\n").encode())
    reads.append(b"data: [DONE]\n\n")
    return reads


def run(tokens: int, rounds: int) -> dict[str, float]:
    reads = recorded_reads(tokens)
    sink: list[bytes] = []

    def reference() -> None:
        sink.clear()
        for data in reads:
            sink.append(data)

    def meter() -> None:
        sink.clear()
        tracker = ChatStreamMeter()
        perf = time.perf_counter_ns
        for data in reads:
            tracker.feed(data, perf())
            sink.append(data)
        assert tracker.timeline.output_tokens == tokens

    best = {"reference": float("inf"), "meter": float("inf")}
    for _ in range(rounds):
        for name, body in (("reference", reference), ("meter", meter)):
            started = time.perf_counter()
            body()
            best[name] = min(best[name], time.perf_counter() - started)
    per_token_us = (best["meter"] - best["reference"]) / tokens * 1e6
    return {"reference_us_per_token": best["reference"] / tokens * 1e6,
            "meter_us_per_token": best["meter"] / tokens * 1e6,
            "added_us_per_token": per_token_us}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    result = run(args.tokens, args.rounds)
    print(f"pass-through (reference): {result['reference_us_per_token']:.3f} us/token")
    print(f"with TTFT/ITL tracking:   {result['meter_us_per_token']:.3f} us/token")
    print(f"added: {result['added_us_per_token']:.3f} us/token (target <= 0.5)")
    return result


if __name__ == "__main__":
    main()
