"""The byte-level fast path of ``ChatStreamMeter`` measures exactly what the full decode does.

The reference here is the definition itself, written independently of the meter:
``SSEParser`` + ``json.loads`` + ``visible_token_count`` / ``usage_tokens`` on every event,
each event stamped with the read that *completed* it. The streams are random mixes of the
chunks real servers send (role-only, empty, ``null``, tool-call, reasoning, finish,
usage-only, text-completion chunks, comments, invalid JSON, multi-line events), cut into
reads at random byte positions, in compact and spaced JSON, with ``\\n`` or ``\\r\\n``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferpath.instrumentation.streaming import (
    ChatStreamMeter,
    SSEParser,
    usage_tokens,
    visible_token_count,
)


def chunk(model: str = "m", finish: str | None = None, **delta: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def event(value: dict[str, Any] | str, *, compact: bool = True, ascii_only: bool = True, newline: str = "\n") -> bytes:
    text = (
        value
        if isinstance(value, str)
        else json.dumps(value, separators=(",", ":") if compact else None, ensure_ascii=ascii_only)
    )
    return f"data: {text}{newline}{newline}".encode()


def reference(reads: list[bytes]) -> dict[str, Any]:
    """Measures by the definitions: every event decoded, stamped with its completing read."""
    parser = SSEParser()
    stamps: list[int] = []
    visible_total = 0
    usage_out = None
    events = unparsed = chat = 0
    last_ns = None
    finishes: list[str] = []
    model = None
    decoded: list[dict[str, Any]] = []
    for at_ns, data in enumerate(reads, start=1):
        for payload in parser.feed(data):
            events += 1
            last_ns = at_ns
            try:
                value = json.loads(payload)
            except ValueError:
                value = None
            if not isinstance(value, dict):
                unparsed += 1
                continue
            decoded.append(value)
            chat += "choices" in value or "usage" in value
            visible = visible_token_count(value)
            if visible:
                stamps.append(at_ns)
                visible_total += visible
            out, _ = usage_tokens(value)
            usage_out = out if out is not None else usage_out
            if isinstance(value.get("model"), str) and value["model"]:
                model = value["model"]
            finishes += [
                c["finish_reason"]
                for c in value.get("choices") or ()
                if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)
            ]
    return {
        "stamps": stamps,
        "tokens": visible_total if usage_out is None else usage_out,
        "events": events,
        "unparsed": unparsed,
        "chat": chat,
        "finishes": finishes,
        "model": model,
        "done": parser.done,
        "last_ns": last_ns,
        "decoded": decoded,
    }


def metered(reads: list[bytes], *, decode_chunks: bool) -> dict[str, Any]:
    meter = ChatStreamMeter(start_ns=0, decode_chunks=decode_chunks)
    returned: list[dict[str, Any]] = []
    for at_ns, data in enumerate(reads, start=1):
        returned += meter.feed(data, at_ns)
    timeline = meter.timeline
    return {
        "stamps": list(timeline.token_ns),
        "tokens": timeline.output_tokens,
        "events": meter.data_events,
        "unparsed": meter.unparsed_payloads,
        "chat": meter.chat_chunks,
        "finishes": meter.finish_reasons,
        "model": meter.response_model,
        "done": meter.done,
        "last_ns": timeline.last_chunk_ns,
        "decoded": returned if decode_chunks else None,
        "chunks": timeline.chunks,
        "meter": meter,
    }


def assert_same_as_reference(reads: list[bytes]) -> ChatStreamMeter:
    expected = reference(reads)
    for decode_chunks in (False, True):
        got = metered(reads, decode_chunks=decode_chunks)
        meter = got.pop("meter")
        assert got.pop("chunks") == expected["events"]
        if not decode_chunks:
            got["decoded"] = expected["decoded"]
        assert got == expected, (decode_chunks, reads)
    return meter


def plain_stream(tokens: int, *, compact: bool = True, newline: str = "\n") -> list[bytes]:
    reads = [event(chunk(role="assistant", content=""), compact=compact, newline=newline)]
    reads += [event(chunk(content=f" w{i}"), compact=compact, newline=newline) for i in range(tokens)]
    reads.append(event(chunk(finish="stop"), compact=compact, newline=newline))
    reads.append(
        event(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "m",
                "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": tokens},
            },
            compact=compact,
            newline=newline,
        )
    )
    reads.append(f"data: [DONE]{newline}{newline}".encode())
    return reads


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_plain_stream_is_measured_from_bytes_and_matches(compact: bool, newline: str) -> None:
    reads = plain_stream(50, compact=compact, newline=newline)
    meter = assert_same_as_reference(reads)
    # Only the frames that matter were decoded: role, first token, finish, usage.
    assert meter.decoded_payloads == 4
    assert meter.timeline.ttft_seconds == 2e-9  # the first content chunk came in read 2


def test_first_token_is_stamped_at_the_read_that_completes_its_frame() -> None:
    first = event(chunk(content="Hel"))
    second = event(chunk(content="lo"))
    # The role frame ends in read 1, the first token frame starts there and ends in read 3.
    role = event(chunk(role="assistant", content=""))
    reads = [role + first[:10], first[10:30], first[30:] + second[:7], second[7:]]
    meter = assert_same_as_reference(reads)
    assert meter.timeline.token_ns == (3, 4)


def test_split_token_frames_after_the_template_are_parsed_once() -> None:
    reads = plain_stream(6)
    # Every token frame split inside its JSON: each half alone is not a frame.
    split: list[bytes] = [reads[0], reads[1]]
    for data in reads[2:7]:
        split += [data[:25], data[25:]]
    split += reads[7:]
    meter = assert_same_as_reference(split)
    assert meter.data_events == 9
    assert meter.timeline.visible_chunks == 6


def test_role_empty_and_null_deltas_after_the_template_are_not_tokens() -> None:
    reads = plain_stream(3)
    extra = [
        event(chunk(content="")),
        event(chunk(content=None)),
        event(chunk(role="assistant")),
        event(chunk()),
        event(chunk(content="x")),
    ]
    meter = assert_same_as_reference(reads[:3] + extra + reads[3:])
    assert meter.timeline.visible_chunks == 4


def test_tool_call_and_reasoning_deltas_count_as_tokens() -> None:
    tool = chunk(tool_calls=[{"index": 0, "id": "t1", "type": "function", "function": {"name": "f", "arguments": ""}}])
    for first in (tool, chunk(reasoning_content="think"), chunk(reasoning="hm")):
        reads = [event(chunk(role="assistant", content="")), event(first)] + plain_stream(3)[1:]
        meter = assert_same_as_reference(reads)
        assert meter.timeline.token_ns[0] == 2


def test_no_visible_token_leaves_ttft_unset() -> None:
    usage = {"id": "c", "choices": [], "usage": {"completion_tokens": 5, "prompt_tokens": 1}}
    reads = [event(chunk(role="assistant", content="")), event(chunk(finish="stop")), event(usage), b"data: [DONE]\n\n"]
    meter = assert_same_as_reference(reads)
    assert meter.timeline.ttft_seconds is None and meter.timeline.output_tokens == 5


def test_escaped_quotes_unicode_and_a_model_switch_fall_back_to_decoding() -> None:
    reads = plain_stream(2)
    extra = [
        event(chunk(content='say "hi"')),
        event(chunk(content="back\\slash")),
        event(
            chunk(
                content="é→",
            ),
            ascii_only=False,
        ),
        event(chunk(content="é")),
        event(chunk(model="other", content="x")),
        event(chunk(content="y")),
    ]
    meter = assert_same_as_reference(reads[:3] + extra + reads[3:])
    assert meter.timeline.visible_chunks == 8


def test_a_silent_chunk_naming_another_model_does_not_outlive_the_next_token() -> None:
    # Template learned on model "m"; a role chunk names "other"; the next plain "m" token must
    # leave "m" as the response model, as the full decode does.
    reads = plain_stream(3)[:3] + [event(chunk(model="other", role="assistant")), event(chunk(content="z"))]
    meter = assert_same_as_reference(reads)
    assert meter.response_model == "m"


def test_invalid_json_shaped_like_the_template() -> None:
    reads = plain_stream(2)
    bad = (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":"\\q"},"finish_reason":null}]}\n\n'
    )
    reads = reads[:3] + [bad] + reads[3:]
    expected = reference(reads)
    # Decoding for the caller, the bad payload is counted as unparsed, as the full decode does.
    decoded = metered(reads, decode_chunks=True)
    assert decoded["unparsed"] == expected["unparsed"] == 1
    assert decoded["stamps"] == expected["stamps"] == [2, 3]
    # Measuring from bytes only, it is the documented difference: one more token, nothing else.
    from_bytes = metered(reads, decode_chunks=False)
    assert from_bytes["unparsed"] == 0 and from_bytes["stamps"] == [2, 3, 4]
    assert from_bytes["tokens"] == expected["tokens"]  # usage still decides the count


def test_no_template_when_a_trailing_backslash_could_still_make_valid_json() -> None:
    # After the content's closing quote the next string is a key that starts with "}": a text
    # ending in a backslash would turn that key into the end of the content, still valid JSON.
    def odd(text: str) -> bytes:
        return ('data: {"choices":[{"delta":{"content":"' + text + '"},"}":1}]}\n\n').encode()

    reads = [odd("a"), odd("b"), odd("c")]
    meter = assert_same_as_reference(reads)
    assert meter.decoded_payloads == 3  # every event decoded: no byte-level template


def test_a_plain_looking_read_while_an_event_is_open_goes_to_the_parser() -> None:
    reads = plain_stream(3)
    token = reads[2]
    # An event left open by a lone data line; the next read looks like one plain frame.
    reads = reads[:3] + [b'data: {"a":\n', token] + reads[3:]
    assert_same_as_reference(reads)


# -- random streams, random chunkings ---------------------------------------------------------

_PLAIN_TEXT = st.sampled_from([" the", " a", "Hel", "lo", "x", " 42", "é", "→"])
_TEXT = st.one_of(
    st.sampled_from([" the", " a", "Hel", "lo", "x", " 42", "\n", "é", "→", '"', "\\", "'", ""]),
    st.text(max_size=4),
)


def _chunk_values() -> st.SearchStrategy[dict[str, Any] | str]:
    return st.one_of(
        _TEXT.map(lambda text: chunk(content=text)),
        st.just(chunk(role="assistant", content="")),
        st.just(chunk(role="assistant")),
        st.just(chunk(content=None)),
        st.just(chunk()),
        st.just(chunk(finish="stop")),
        _TEXT.map(lambda text: chunk(finish="length", content=text)),
        st.just(chunk(tool_calls=[{"index": 0, "function": {"arguments": "{}"}}])),
        st.just(chunk(tool_calls=[])),
        _TEXT.map(lambda text: chunk(reasoning_content=text)),
        _TEXT.map(lambda text: chunk(reasoning=text)),
        _TEXT.map(lambda text: chunk(model="m2", content=text)),
        st.integers(0, 9).map(
            lambda n: {"id": "chatcmpl-1", "choices": [], "usage": {"completion_tokens": n, "prompt_tokens": 1}}
        ),
        _TEXT.map(
            lambda text: {
                "id": "cmpl-1",
                "object": "text_completion",
                "choices": [{"index": 0, "text": text, "finish_reason": None}],
            }
        ),
        st.sampled_from(["{not json", "[1, 2]", '"text"', "[DONE]"]),
    )


@st.composite
def streams(draw: st.DrawFn) -> list[bytes]:
    compact = draw(st.booleans())
    ascii_only = draw(st.booleans())
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    body = bytearray()
    for _ in range(draw(st.integers(1, 40))):
        # Plain one-token content chunks dominate, as in real streams.
        plain = draw(st.integers(0, 3)) > 0
        value = chunk(content=draw(_PLAIN_TEXT)) if plain else draw(_chunk_values())
        kind = draw(st.integers(0, 19))
        if kind == 0:
            body += f": keep-alive{newline}{newline}".encode()
        if kind == 1 and isinstance(value, dict):
            # One event written as two data lines (joined with \n by the parser).
            text = json.dumps(value, separators=(",", ":"))
            cut = text.index(",")
            body += f"data: {text[: cut + 1]}{newline}data: {text[cut + 1 :]}{newline}{newline}".encode()
            continue
        body += event(value, compact=compact, ascii_only=ascii_only, newline=newline)
    body += f"data: [DONE]{newline}{newline}".encode()
    data = bytes(body)
    # Mostly one event per read (what servers write), sometimes cut anywhere.
    if draw(st.booleans()):
        frames = data.split(newline.encode() * 2)
        reads = [frame + newline.encode() * 2 for frame in frames[:-1]]
        merged: list[bytes] = []
        for read in reads:
            if merged and draw(st.integers(0, 5)) == 0:
                merged[-1] += read
            else:
                merged.append(read)
        return merged
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=12))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)]) if data[a:b]]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams())
def test_random_streams_in_random_reads_match_the_full_decode(reads: list[bytes]) -> None:
    assert_same_as_reference(reads)
