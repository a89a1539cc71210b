"""The byte-level fast path of ``ChatStreamMeter`` measures exactly what the full decode does.

The reference here is the definition itself: ``SSEParser`` + ``json.loads`` +
``visible_token_count`` / ``usage_tokens`` on every event, with each event stamped at the
read that completed it.
"""

from __future__ import annotations

import json
import random

import pytest

from inferpath.instrumentation.streaming import (
    ChatStreamMeter,
    SSEParser,
    usage_tokens,
    visible_token_count,
)


def chunk(model: str = "m", finish: str | None = None, **delta: object) -> dict:
    return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def event(value: dict | str, *, compact: bool = True, ascii_only: bool = True,
          newline: str = "\n") -> bytes:
    text = value if isinstance(value, str) else json.dumps(
        value, separators=(",", ":") if compact else None, ensure_ascii=ascii_only)
    return f"data: {text}{newline}{newline}".encode()


def reference(reads: list[bytes]) -> dict:
    """Measures by the definitions, full decode of every event."""
    parser = SSEParser()
    stamps: list[int] = []
    visible_total = 0
    usage_out = None
    events = unparsed = chat = 0
    finishes: list[str] = []
    model = None
    for at_ns, data in enumerate(reads, start=1):
        for payload in parser.feed(data):
            events += 1
            try:
                value = json.loads(payload)
            except ValueError:
                value = None
            if not isinstance(value, dict):
                unparsed += 1
                continue
            chat += "choices" in value or "usage" in value
            visible = visible_token_count(value)
            if visible:
                stamps.append(at_ns)
                visible_total += visible
            out, _ = usage_tokens(value)
            usage_out = out if out is not None else usage_out
            if isinstance(value.get("model"), str) and value["model"]:
                model = value["model"]
            finishes += [c["finish_reason"] for c in value.get("choices") or ()
                         if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)]
    return {"stamps": stamps, "tokens": visible_total if usage_out is None else usage_out,
            "events": events, "unparsed": unparsed, "chat": chat, "finishes": finishes,
            "model": model, "done": parser.done}


def metered(reads: list[bytes], decode_chunks: bool) -> tuple[dict, ChatStreamMeter, list]:
    meter = ChatStreamMeter(start_ns=0, decode_chunks=decode_chunks)
    returned: list[dict] = []
    for at_ns, data in enumerate(reads, start=1):
        returned += meter.feed(data, at_ns)
    timeline = meter.timeline
    # Receipt (read index) of every visible-token chunk: TTFT and the ITL list derive from it.
    measures = {"stamps": list(timeline._token_ns),
                "tokens": timeline.output_tokens, "events": meter.data_events,
                "unparsed": meter.unparsed_payloads, "chat": meter.chat_chunks,
                "finishes": meter.finish_reasons, "model": meter.response_model,
                "done": meter.done}
    assert timeline.chunks == meter.data_events
    return measures, meter, returned


def assert_same_as_full_decode(reads: list[bytes]) -> ChatStreamMeter:
    expected = reference(reads)
    fast, meter, returned = metered(reads, decode_chunks=False)
    assert fast == expected
    assert returned == []
    decoded, _, chunks = metered(reads, decode_chunks=True)
    assert decoded == expected
    body = b"".join(reads)
    parser = SSEParser()
    every = parser.feed(body)
    objects = []
    for payload in every:
        try:
            value = json.loads(payload)
        except ValueError:
            continue
        if isinstance(value, dict):
            objects.append(value)
    assert chunks == objects
    return meter


def plain_stream(tokens: int, **style: object) -> list[bytes]:
    reads = [event(chunk(role="assistant", content=""), **style)]
    reads += [event(chunk(content=f" t{i}"), **style) for i in range(tokens)]
    reads.append(event(chunk(finish="stop"), **style))
    reads.append(event({"id": "c1", "choices": [], "usage": {"completion_tokens": tokens,
                                                              "prompt_tokens": 3}}, **style))
    reads.append(b"data: [DONE]\n\n")
    return reads


@pytest.mark.parametrize("compact", [True, False])
def test_plain_stream_takes_the_fast_path_and_matches(compact: bool) -> None:
    meter = assert_same_as_full_decode(plain_stream(50, compact=compact))
    # All but the first visible chunk skipped the decode.
    assert meter._fast_events == 49
    assert meter.timeline.output_tokens == 50 and meter.finish_reasons == ["stop"]


def test_escaped_quotes_and_backslashes_inside_content_fall_back_and_count() -> None:
    texts = ['say "hi"', 'a\\', "\\", 'tail"', '"', "x\\\"y"]
    reads = plain_stream(3)[:3] + [event(chunk(content=t)) for t in texts] + plain_stream(3)[4:]
    meter = assert_same_as_full_decode(reads)
    assert meter.timeline.visible_chunks == 2 + len(texts)  # role chunk, t0, t1, then texts


def test_empty_and_null_content_after_a_template_are_not_tokens() -> None:
    reads = plain_stream(3)[:4]
    # content "" followed by another key: the bytes after the template's prefix hold quotes.
    reads += [event(chunk(content="", role="assistant")), event(chunk(content="", refusal=None)),
              event(chunk(content="")), event(chunk(content=None)),
              event(chunk(content=None, tool_calls=[{"index": 0, "function": {"arguments": "{"}}])),
              event(chunk(content="", reasoning_content="hm")), event(chunk(content="z"))]
    meter = assert_same_as_full_decode(reads)
    # 3 plain + tool call + reasoning + "z"; the empty and null contents did not count.
    assert meter.timeline.visible_chunks == 6


@pytest.mark.parametrize("ascii_only", [True, False])
def test_unicode_content_raw_or_escaped(ascii_only: bool) -> None:
    texts = ["h\u00e9", "\u65e5\u672c", "\U0001f600", "line\nbreak", "tab\t"]
    reads = plain_stream(2, ascii_only=ascii_only)[:3]
    reads += [event(chunk(content=t), ascii_only=ascii_only) for t in texts]
    meter = assert_same_as_full_decode(reads)
    assert meter.timeline.visible_chunks == 2 + len(texts)
    assert meter._fast_events == 1 + len(texts)


def test_crlf_frames_and_split_crlf() -> None:
    reads = plain_stream(5, newline="\r\n")
    assert_same_as_full_decode(reads)
    body = b"".join(reads)
    # A CRLF cut between its CR and LF, and every other cut point of a two-token body.
    for cut in range(1, len(body)):
        assert_same_as_full_decode([body[:cut], body[cut:]])


def test_frames_split_anywhere_and_batched_are_parsed_once() -> None:
    body = b"".join(plain_stream(6))
    rng = random.Random(7)
    for _ in range(60):
        cuts = sorted(rng.sample(range(1, len(body)), rng.randint(1, 12)))
        reads = [body[a:b] for a, b in zip([0] + cuts, cuts + [len(body)])]
        assert_same_as_full_decode(reads)


def test_template_changes_tool_calls_usage_and_model_switch_are_decoded() -> None:
    reads = plain_stream(3)[:4]
    reads += [event(chunk(model="other", content="m2")), event(chunk(model="other", content="m3")),
              event({"id": "c2", "choices": [{"index": 0, "delta": {"content": "x"}},
                                             {"index": 1, "delta": {"content": "y"}}]}),
              event({"id": "c2", "choices": [{"index": 0, "delta": {"content": "w"},
                                              "finish_reason": None}],
                     "usage": {"completion_tokens": 42}}),
              event(chunk(content="fin", finish="length")),
              b": keep-alive\n\n", b"event: x\ndata: " + json.dumps(chunk(content="a")).encode()
              + b"\n\n", event("not json"), event(chunk(content="q")),
              b"data: [DONE]\n\n"]
    meter = assert_same_as_full_decode(reads)
    assert meter.response_model == "m"  # the last chunks name "m" again
    switched = ChatStreamMeter(start_ns=0, decode_chunks=False)
    for at_ns, data in enumerate(reads[:6], start=1):
        switched.feed(data, at_ns)
    assert switched.response_model == "other"
    assert meter.timeline.output_tokens == 42
    assert meter.finish_reasons == ["length"]
    assert meter.unparsed_payloads == 1


def test_random_mixed_streams_match_full_decode() -> None:
    rng = random.Random(11)
    kinds = [lambda i: chunk(content=f"w{i}"), lambda i: chunk(content=""),
             lambda i: chunk(content=None), lambda i: chunk(content=f'q"{i}'),
             lambda i: chunk(role="assistant"), lambda i: chunk(reasoning=f"r{i}"),
             lambda i: chunk(content=f"\u00e9{i}\\"), lambda i: chunk(content="", role="assistant")]
    for _ in range(25):
        values = [chunk(content="start")]
        values += [rng.choice(kinds)(i) if rng.random() < 0.3 else chunk(content=f" {i}")
                   for i in range(40)]
        compact = rng.random() < 0.5
        body = b"".join(event(v, compact=compact) for v in values) + b"data: [DONE]\n\n"
        assert_same_as_full_decode([event(v, compact=compact) for v in values])
        cuts = sorted(rng.sample(range(1, len(body)), rng.randint(0, 30)))
        reads = [body[a:b] for a, b in zip([0] + cuts, cuts + [len(body)])]
        assert_same_as_full_decode(reads)


def test_read_that_looks_plain_while_an_event_is_open_goes_to_the_parser() -> None:
    # "data: a\n" opens a multi-line event; the next read, a whole plain-looking event,
    # is its second line, so the joined payload is not JSON and no token arrives.
    reads = plain_stream(3)[:4] + [b"data: a\n", event(chunk(content="t9"))] + plain_stream(3)[5:]
    meter = assert_same_as_full_decode(reads)
    assert meter.unparsed_payloads == 1
    assert meter.timeline.visible_chunks == 3


def test_invalid_json_shaped_like_the_template() -> None:
    # The closing quote escaped by a lone trailing backslash: not valid JSON.
    bad = event(chunk(content=" t9")).replace(b" t9", b"a\\")
    reads = plain_stream(3)[:4] + [bad] + plain_stream(3)[4:]
    expected = reference(reads)
    assert expected["unparsed"] == 1
    decoded, _, _ = metered(reads, decode_chunks=True)
    assert decoded == expected  # the decode for the caller catches it
    sniffed, _, _ = metered(reads, decode_chunks=False)
    # Documented: without decoding, invalid text in the template's place counts as a token.
    assert sniffed["unparsed"] == 0 and len(sniffed["stamps"]) == len(expected["stamps"]) + 1
