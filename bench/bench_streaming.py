"""Streaming: the cost per token of TTFT/ITL tracking over an uninstrumented pass-through.

A recorded-shape OpenAI stream (role chunk, N one-token content chunks, finish, usage,
``[DONE]``, one SSE event per network read) is passed through three ways:

* reference: the reads are handed on untouched (what a proxy without tracking does);
* meter: inferpath's ``ChatStreamMeter(decode_chunks=False).feed`` on every read (SSE
  framing, byte-level visible-token rule with a JSON decode only for the role, first-token,
  finish and usage chunks, timeline stamp), as the gateway middleware and the httpx/openai
  integration without content capture do; this is the figure with the 0.5 us target;
* client (second figure): ``ChatStreamMeter.feed`` returning every parsed chunk, as
  ``stream_chat_completion`` does for its caller, against a reference that itself splits the
  SSE events and ``json.loads`` each (what an uninstrumented client must do to hand out
  chunks).

Per-token cost = (variant − its reference) / tokens; best of interleaved rounds (reference
and measured bodies alternate inside every round, so machine load hits both alike).

    python bench/bench_streaming.py [--tokens N] [--rounds R]
Target (issue 3): <= 0.5 us per token.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from inferpath.instrumentation.streaming import ChatStreamMeter


def recorded_reads(tokens: int) -> list[bytes]:
    def frame(delta: dict, finish: str | None = None) -> bytes:
        chunk = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "emulated-7b",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {json.dumps(chunk)}\n\n".encode()

    reads = [frame({"role": "assistant", "content": ""})]
    reads += [frame({"content": f" tok{i}"}) for i in range(tokens)]
    reads.append(frame({}, "stop"))
    reads.append(
        (
            "data: "
            + json.dumps(
                {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": tokens}}
            )
            + "\n\n"
        ).encode()
    )
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
        tracker = ChatStreamMeter(decode_chunks=False)
        perf = time.perf_counter_ns
        for data in reads:
            tracker.feed(data, perf())
            sink.append(data)
        timeline = tracker.timeline
        assert timeline.output_tokens == tokens and timeline.visible_chunks == tokens
        assert tracker.decoded_payloads == 4  # role, first token, finish, usage

    def client_reference() -> None:
        sink.clear()
        loads = json.loads
        for data in reads:
            for event in data.split(b"\n\n"):
                if event.startswith(b"data: ") and event != b"data: [DONE]":
                    sink.append(loads(event[6:]))

    def client_meter() -> None:
        sink.clear()
        tracker = ChatStreamMeter()
        perf = time.perf_counter_ns
        for data in reads:
            sink.extend(tracker.feed(data, perf()))
        assert tracker.timeline.output_tokens == tokens and len(sink) == tokens + 3

    best = dict.fromkeys(("reference", "meter", "client_reference", "client_meter"), float("inf"))
    bodies = (
        ("reference", reference),
        ("meter", meter),
        ("client_reference", client_reference),
        ("client_meter", client_meter),
    )
    for _ in range(rounds):
        for name, body in bodies:
            started = time.perf_counter()
            body()
            best[name] = min(best[name], time.perf_counter() - started)
    per_token = {name: seconds / tokens * 1e6 for name, seconds in best.items()}
    return {
        "reference_us_per_token": per_token["reference"],
        "meter_us_per_token": per_token["meter"],
        "added_us_per_token": per_token["meter"] - per_token["reference"],
        "client_reference_us_per_token": per_token["client_reference"],
        "client_meter_us_per_token": per_token["client_meter"],
        "client_added_us_per_token": per_token["client_meter"] - per_token["client_reference"],
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    result = run(args.tokens, args.rounds)
    print(f"pass-through (reference): {result['reference_us_per_token']:.3f} us/token")
    print(f"with TTFT/ITL tracking:   {result['meter_us_per_token']:.3f} us/token")
    print(f"added: {result['added_us_per_token']:.3f} us/token (target <= 0.5)")
    print(
        f"client decoding chunks, reference (SSE split + json.loads): "
        f"{result['client_reference_us_per_token']:.3f} us/token"
    )
    print(f"client decoding chunks, with tracking: {result['client_meter_us_per_token']:.3f} us/token")
    print(f"client added: {result['client_added_us_per_token']:.3f} us/token")
    try:
        print(f"load average (1 min): {os.getloadavg()[0]:.2f}")
    except OSError:  # not every platform has it
        pass
    return result


if __name__ == "__main__":
    main()
