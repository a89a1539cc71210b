"""The demo's trace loader on the real Azure 2023 file and on broken copies; BM25 retrieval."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferpath.demo.replay import prompt_text
from inferpath.demo.retrieval import BM25Retriever
from inferpath.demo.trace import load_azure_trace


def test_real_trace_arrivals_and_token_counts(shared_data: Path) -> None:
    trace = load_azure_trace(shared_data / "llm_request_traces" / "azure2023_AzureLLMInferenceTrace_code.csv")
    assert len(trace) == 8819
    # First rows of the file: 18:17:03.9799600 (4808, 10) then 18:17:04.0319600 (3180, 8).
    assert (trace[0].context_tokens, trace[0].generated_tokens) == (4808, 10)
    assert trace[1].arrival_offset_seconds == pytest.approx(0.052, abs=1e-9)
    assert all(b.arrival_offset_seconds >= a.arrival_offset_seconds for a, b in zip(trace, trace[1:]))
    assert 3300 < trace[-1].arrival_offset_seconds < 3500  # about an hour, 18:17 to 19:14


def test_shipped_copy_equals_the_recorded_file(shared_data: Path) -> None:
    shipped = load_azure_trace(limit=500)
    recorded = load_azure_trace(shared_data / "llm_request_traces" / "azure2023_AzureLLMInferenceTrace_code.csv",
                                limit=500)
    assert shipped == recorded


@pytest.mark.parametrize("body, message", [
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.1,5\n", "missing column"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,5\n", "line 2: TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,five,5\n", "line 2: token counts"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,5,0\n", "line 2: token counts must be"),
])
def test_malformed_trace_rows_are_named(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(body)
    with pytest.raises(ValueError, match=message):
        load_azure_trace(path)


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
