"""stage() as sync/async context manager and decorator, on the real SDK."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.trace import SpanKind, StatusCode

import inferpath
from inferpath.instrumentation.stages import stage


def test_sync_context_manager_nests_and_sets_stage_attribute(spans) -> None:
    with stage("gateway") as outer:
        with stage("retrieval", **{"inferpath.retrieval.documents": 4}) as inner:
            inner.set_attribute("extra", 1)
    finished = {s.name: s for s in spans.finished()}
    assert set(finished) == {"gateway", "retrieval"}
    retrieval = finished["retrieval"]
    assert retrieval.kind is SpanKind.INTERNAL
    assert retrieval.attributes["inferpath.stage"] == "retrieval"
    assert retrieval.attributes["inferpath.retrieval.documents"] == 4
    assert retrieval.attributes["extra"] == 1
    assert retrieval.parent.span_id == outer.get_span_context().span_id
    assert retrieval.context.trace_id == finished["gateway"].context.trace_id


def test_async_context_manager_and_decorators(spans) -> None:
    @stage("tokenize")
    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    @inferpath.stage("postprocess")
    async def detokenize(ids: list[int]) -> str:
        await asyncio.sleep(0.01)
        return "".join(map(chr, ids))

    async def main() -> str:
        async with stage("model"):
            return await detokenize(encode("hi"))

    assert asyncio.run(main()) == "hi"
    finished = {s.name: s for s in spans.finished()}
    assert set(finished) == {"model", "tokenize", "postprocess"}
    model_id = finished["model"].context.span_id
    assert finished["tokenize"].parent.span_id == model_id
    assert finished["postprocess"].parent.span_id == model_id
    assert finished["postprocess"].end_time - finished["postprocess"].start_time >= 10_000_000


def test_user_exception_is_recorded_and_reraised_unchanged(spans) -> None:
    error = KeyError("missing")

    @stage("retrieval")
    def lookup() -> None:
        raise error

    with pytest.raises(KeyError) as caught:
        lookup()
    assert caught.value is error
    [span] = spans.finished()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == "KeyError"
    assert [e.name for e in span.events] == ["exception"]


def test_shared_marker_used_by_concurrent_tasks_closes_each_own_span(spans) -> None:
    retrieval = stage("retrieval")

    async def request(delay: float) -> None:
        async with stage("gateway"):
            async with retrieval:
                await asyncio.sleep(delay)

    async def main() -> None:
        await asyncio.gather(request(0.03), request(0.01))

    asyncio.run(main())
    finished = spans.finished()
    gateways = {s.context.span_id: s for s in finished if s.name == "gateway"}
    retrievals = [s for s in finished if s.name == "retrieval"]
    assert len(gateways) == 2 and len(retrievals) == 2
    assert {r.parent.span_id for r in retrievals} == set(gateways)
    durations = sorted(r.end_time - r.start_time for r in retrievals)
    assert durations[0] < 25_000_000 <= durations[1]


def test_unknown_stage_is_a_setup_error_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="retrieval"):
        stage("retreival")


def test_numpy_values_given_to_a_stage_become_python_values_without_warnings(spans, caplog) -> None:
    """The report: stage(temperature=np.float32(0.7), top_k=np.int64(5)) logged the SDK's
    "Invalid type" warnings and did not store the values as numbers."""
    import logging

    np = pytest.importorskip("numpy")
    with caplog.at_level(logging.WARNING):
        with stage(
            "model",
            temperature=np.float32(0.7),
            top_k=np.int64(5),
            stream=np.bool_(True),
            stop_token_ids=np.array([2, 32000], dtype=np.int32),
            weights=np.array([0.25, 1.0]),
            mixed=[1, np.float64(2.5)],
            seed=None,
        ):
            pass
    [span] = spans.finished()
    values = {k: v for k, v in span.attributes.items() if k != "inferpath.stage"}
    assert values == {
        "temperature": 0.7,
        "top_k": 5,
        "stream": True,
        "stop_token_ids": (2, 32000),
        "weights": (0.25, 1.0),
        "mixed": (1.0, 2.5),
    }
    assert [type(values[k]) for k in ("temperature", "top_k", "stream")] == [float, int, bool]
    assert not [r for r in caplog.records if "Invalid type" in r.getMessage()]
