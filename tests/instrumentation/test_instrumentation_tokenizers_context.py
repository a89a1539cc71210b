"""Tokenizer spans with the shipped real tokenizer; trace context in threads and tasks."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry.trace import StatusCode

from inferpath.demo.assets import tokenizer_json_text
from inferpath.instrumentation.stages import stage
from inferpath.instrumentation.threads import wrap_executor
from inferpath.instrumentation.tokenizers import instrument_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_str(tokenizer_json_text())


def test_encode_and_encode_batch_emit_tokenize_spans_with_input_tokens(spans, tokenizer) -> None:
    traced = instrument_tokenizer(tokenizer)
    assert instrument_tokenizer(traced) is traced
    text = "Where is the bottleneck of this inference request?"
    expected = tokenizer.encode(text).ids
    with stage("gateway"):
        assert traced.encode(text).ids == expected
        batch = traced.encode_batch([text, "short"])
    assert traced.get_vocab_size() == tokenizer.get_vocab_size()  # forwarded unchanged
    finished = spans.finished()
    tokenize = [s for s in finished if s.name == "tokenize"]
    gateway = next(s for s in finished if s.name == "gateway")
    assert len(tokenize) == 2
    assert all(s.attributes["inferpath.stage"] == "tokenize" for s in tokenize)
    assert all(s.parent.span_id == gateway.context.span_id for s in tokenize)
    assert tokenize[0].attributes["gen_ai.usage.input_tokens"] == len(expected) > 0
    assert tokenize[1].attributes["gen_ai.usage.input_tokens"] == sum(len(e.ids) for e in batch)


def test_tokenizer_error_is_recorded_and_reraised(spans, tokenizer) -> None:
    traced = instrument_tokenizer(tokenizer)
    with pytest.raises(TypeError):
        traced.encode(12345)
    [span] = spans.finished()
    assert span.status.status_code is StatusCode.ERROR


def test_workers_share_the_requests_trace_and_parent(spans) -> None:
    def work(label: str) -> str:
        with stage("retrieval", **{"label": label}):
            return label

    async def request() -> None:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=2) as pool:
            async with stage("gateway"):
                await loop.run_in_executor(wrap_executor(pool), work, "run_in_executor+wrap")
                await asyncio.to_thread(work, "to_thread")
                await asyncio.gather(asyncio.to_thread(work, "gather"))
                wrap_executor(pool).submit(work, "wrapped submit").result(5)
                assert wrap_executor(wrap_executor(pool)).inner is pool
                pool.submit(work, "bare submit").result(5)

    asyncio.run(request())
    finished = spans.finished()
    gateway = next(s for s in finished if s.name == "gateway")
    by_label = {s.attributes["label"]: s for s in finished if s.name == "retrieval"}
    assert len(by_label) == 5
    bare = by_label.pop("bare submit")
    for label, span in by_label.items():
        assert span.context.trace_id == gateway.context.trace_id, label
        assert span.parent.span_id == gateway.context.span_id, label
    # Without a helper the worker starts with an empty context: a new, unrelated trace.
    assert bare.parent is None and bare.context.trace_id != gateway.context.trace_id
