"""The trace loader on the real Azure 2023 and Mooncake files, on BurstGPT- and minimal-JSONL-shaped
files of our own, and on broken copies; BM25 retrieval."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferpath.demo.replay import prompt_text
from inferpath.demo.retrieval import BM25Retriever
from inferpath.demo.trace import TRACE_FORMATS, TraceError, load_trace


def test_real_trace_arrivals_and_token_counts(shared_data: Path) -> None:
    loaded = load_trace(shared_data / "llm_request_traces" / "azure2023_AzureLLMInferenceTrace_code.csv")
    assert loaded.format.name == "azure"
    trace = loaded.requests
    assert len(trace) == 8819
    # First rows of the file: 18:17:03.9799600 (4808, 10) then 18:17:04.0319600 (3180, 8).
    assert (trace[0].context_tokens, trace[0].generated_tokens) == (4808, 10)
    assert trace[1].arrival_offset_seconds == pytest.approx(0.052, abs=1e-9)
    assert all(b.arrival_offset_seconds >= a.arrival_offset_seconds for a, b in zip(trace, trace[1:]))
    assert 3300 < trace[-1].arrival_offset_seconds < 3500  # about an hour, 18:17 to 19:14


def test_shipped_copy_equals_the_recorded_file(shared_data: Path) -> None:
    shipped = load_trace(limit=500).requests
    recorded = load_trace(
        shared_data / "llm_request_traces" / "azure2023_AzureLLMInferenceTrace_code.csv", limit=500
    ).requests
    assert shipped == recorded


@pytest.mark.parametrize(
    "name, body, message",
    [
        (
            "trace.csv",
            "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.1,5\n",
            "not a known trace format; first line has columns TIMESTAMP, ContextTokens. Azure LLM inference "
            "trace 2023 CSV needs TIMESTAMP, ContextTokens, GeneratedTokens (missing GeneratedTokens)",
        ),
        ("trace.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,5\n", "line 2: TIMESTAMP 'yesterday'"),
        (
            "trace.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,five,5\n",
            "line 2: ContextTokens 'five' is not an integer",
        ),
        (
            "trace.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,5,0\n",
            "line 2: GeneratedTokens '0' must be ≥ 1",
        ),
        ("trace.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
        ("trace.csv", "", "empty"),
        # Mooncake-shaped: the third line is not JSON, the fifth has a string for a count.
        (
            "m.jsonl",
            '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n\n'
            '{"timestamp": 5,\n{"timestamp": 9, "input_length": 10, "output_length": 2}\n'
            '{"timestamp": 12, "input_length": "many", "output_length": 2}\n',
            "m.jsonl (Mooncake FAST'25 JSONL): 2 bad row(s): line 3: not JSON (Expecting property name "
            "enclosed in double quotes); line 5: input_length 'many' is not an integer",
        ),
        (
            "m.jsonl",
            '{"timestamp": 0, "input_tokens": 3}\n',
            "minimal JSONL needs timestamp, input_tokens, output_tokens (missing output_tokens)",
        ),
        (
            "m.jsonl",
            '{"timestamp": NaN, "input_tokens": 3, "output_tokens": 1}\n[1, 2]\n',
            "line 1: timestamp nan is not a finite number; line 2: not a JSON object",
        ),
        (
            "b.csv",
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n5,ChatGPT,472\n",
            "line 3: Response tokens None is not a token count",
        ),
    ],
)
def test_malformed_trace_rows_are_named_by_line(tmp_path: Path, name: str, body: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(body)
    with pytest.raises(TraceError) as raised:
        load_trace(path)
    assert message in str(raised.value)


def test_bad_rows_beyond_ten_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(f'{{"timestamp": {i}, "input_tokens": 0, "output_tokens": 1}}\n' for i in range(25)))
    with pytest.raises(TraceError, match=r"25 bad row\(s\): line 1: .*line 10: [^;]*; and 15 more$"):
        load_trace(path)


def test_real_mooncake_trace_is_recognised_by_its_content(shared_data: Path, tmp_path: Path) -> None:
    # The name says nothing: a copy without the .jsonl suffix reads the same.
    original = shared_data / "llm_request_traces" / "mooncake_fast25_conversation_trace.jsonl"
    copy = tmp_path / "requests.txt"
    copy.write_bytes(original.read_bytes()[:100_000].rsplit(b"\n", 1)[0] + b"\n")
    loaded = load_trace(original)
    assert loaded.format.name == "mooncake" and len(loaded.requests) == 12031
    first = loaded.requests[0]
    assert (first.context_tokens, first.generated_tokens, first.arrival_offset_seconds) == (6758, 500, 0.0)
    # Milliseconds from the start: the last request arrives just under an hour in.
    assert 3500 < loaded.requests[-1].arrival_offset_seconds < 3600
    assert load_trace(copy, limit=5).requests == loaded.requests[:5]


def test_burstgpt_csv_skips_failed_requests_and_counts_them(tmp_path: Path) -> None:
    # BurstGPT's shape: seconds from the start, Response tokens 0 for a failed request.
    path = tmp_path / "burst.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,GPT-4,1087,0,1087,API log\n"
        "7.5,ChatGPT,130,233,363,API log\n"
    )
    loaded = load_trace(path)
    assert loaded.format.name == "burstgpt"
    assert [(r.arrival_offset_seconds, r.context_tokens, r.generated_tokens) for r in loaded.requests] == [
        (0.0, 472, 18),
        (2.5, 130, 233),
    ]
    assert loaded.skipped_rows == 1 and "Response tokens 0" in loaded.describe()


def test_minimal_jsonl_is_seconds_and_sorted_by_arrival(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(
        '{"timestamp": 1700000010.25, "input_tokens": 12, "output_tokens": 3}\n'
        '{"timestamp": 1700000000, "input_tokens": 800, "output_tokens": 64.0, "model": "x"}\n'
    )
    loaded = load_trace(path)
    assert loaded.format.name == "jsonl"
    assert [(r.index, r.arrival_offset_seconds, r.context_tokens, r.generated_tokens) for r in loaded.requests] == [
        (0, 0.0, 800, 64),
        (1, 10.25, 12, 3),
    ]


def test_every_format_is_documented_in_the_module() -> None:
    import inferpath.demo.trace as trace_module

    for fmt in TRACE_FORMATS.values():
        assert f"``{fmt.name}``" in (trace_module.__doc__ or "")
        assert all(f"``{field}``" in (trace_module.__doc__ or "") for field in fmt.fields)


def test_prompt_length_follows_context_tokens() -> None:
    from inferpath.demo.assets import load_tokenizer

    tokenizer = load_tokenizer()
    for context_tokens in (1, 176, 4808):
        ids = tokenizer.encode(prompt_text(context_tokens, 7), add_special_tokens=False).ids
        assert len(ids) == context_tokens


def test_bm25_ranks_the_matching_passage_first() -> None:
    retriever = BM25Retriever()
    assert retriever.search("paged KV cache blocks preempt", k=1)[0].doc_id == "kvcache"
    assert len(retriever.search("the of and", k=3)) == 3
