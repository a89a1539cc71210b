"""SSE parsing, visible-token rules and TTFT/ITL arithmetic (no network)."""

from __future__ import annotations

import json

import pytest

from inferpath.instrumentation.streaming import (
    ChatStreamMeter,
    SSEParser,
    TokenTimeline,
    usage_tokens,
    visible_token_count,
)

MS = 1_000_000


def chunk(**delta: object) -> dict:
    return {
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
    }


def test_parser_reassembles_frames_split_anywhere_including_crlf_and_utf8() -> None:
    body = (
        'data: {"a": "h\u00e9"}\r\n\r\n: keep-alive comment\r\n\r\n'
        "event: message\ndata: line1\ndata: line2\n\ndata:nospace\r\r"
        "data: [DONE]\n\n"
    ).encode()
    for cut_every in (1, 2, 3, 7, len(body)):
        parser = SSEParser()
        payloads: list[str] = []
        for start in range(0, len(body), cut_every):
            payloads.extend(parser.feed(body[start : start + cut_every]))
        payloads.extend(parser.close())
        assert payloads == ['{"a": "h\u00e9"}', "line1\nline2", "nospace"], cut_every
        assert parser.done


def test_parser_returns_event_missing_final_blank_line_on_close() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: tail") == []
    assert parser.close() == ["tail"]
    assert not parser.done


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (chunk(role="assistant"), 0),
        (chunk(role="assistant", content=""), 0),
        (chunk(content="Hel"), 1),
        (chunk(content=None, tool_calls=[{"index": 0, "function": {"arguments": "{"}}]), 1),
        (chunk(reasoning_content="think"), 1),
        (chunk(reasoning="think"), 1),
        ({"object": "chat.completion.chunk", "choices": [], "usage": {"completion_tokens": 3}}, 0),
        ({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, 0),
        ({"object": "text_completion", "choices": [{"index": 0, "text": "lo"}]}, 1),
        ({"object": "text_completion", "choices": [{"index": 0, "text": ""}]}, 0),
        ({"choices": [{"delta": {"content": "a"}}, {"delta": {"content": "b"}}]}, 2),
        ({"choices": "nonsense"}, 0),
        ([], 0),
    ],
)
def test_visible_token_count_follows_aiperf_rules(value: object, expected: int) -> None:
    assert visible_token_count(value) == expected  # type: ignore[arg-type]


def test_usage_tokens_reads_completion_and_prompt_counts() -> None:
    assert usage_tokens({"usage": {"completion_tokens": 7, "prompt_tokens": 11}}) == (7, 11)
    assert usage_tokens({"usage": None}) == (None, None)
    assert usage_tokens({"usage": {"completion_tokens": "7", "prompt_tokens": -1}}) == (None, None)


def test_timeline_ttft_itl_and_e2e_from_monotonic_stamps() -> None:
    timeline = TokenTimeline(start_ns=0)
    timeline.observe(False, 0, at_ns=5 * MS)  # role-only
    timeline.observe(True, at_ns=800 * MS)
    timeline.observe(True, at_ns=850 * MS)
    timeline.observe(True, at_ns=950 * MS)
    timeline.observe(False, 0, at_ns=960 * MS)  # finish_reason only
    timeline.finish(at_ns=970 * MS)
    assert timeline.ttft_seconds == pytest.approx(0.800)
    assert timeline.itl_list_seconds == pytest.approx([0.050, 0.100])
    # (last token − TTFT) / (tokens − 1) = (0.950 − 0.800) / 2
    assert timeline.itl_seconds == pytest.approx(0.075)
    assert timeline.e2e_seconds == pytest.approx(0.970)
    assert timeline.output_tokens == 3
    timeline.set_usage(output_tokens=4)
    assert timeline.output_tokens == 4
    assert timeline.itl_seconds == pytest.approx(0.050)


def test_timeline_without_tokens_or_with_one_token_has_no_ttft_or_itl() -> None:
    empty = TokenTimeline(start_ns=0)
    empty.observe(False, 0, at_ns=MS)
    assert empty.ttft_seconds is None and empty.itl_seconds is None
    assert empty.output_tokens == 0
    one = TokenTimeline(start_ns=0)
    one.observe(True, at_ns=2 * MS)
    assert one.ttft_seconds == pytest.approx(0.002)
    assert one.itl_seconds is None and one.itl_list_seconds == []


def test_meter_counts_events_skips_non_json_and_prefers_usage() -> None:
    meter = ChatStreamMeter(start_ns=0)
    events = [
        chunk(role="assistant"),
        chunk(content="a"),
        chunk(content="b"),
        {"choices": [], "usage": {"completion_tokens": 5, "prompt_tokens": 9}},
    ]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: not json\n\ndata: [DONE]\n\n"
    parsed = meter.feed(body.encode(), at_ns=10 * MS)
    assert len(parsed) == 4
    assert meter.data_events == 5 and meter.unparsed_payloads == 1 and meter.done
    assert meter.timeline.output_tokens == 5
    assert meter.timeline.usage_input_tokens == 9
    assert meter.response_model == "m"
