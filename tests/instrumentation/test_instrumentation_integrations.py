"""Library integrations: tokenizers, transformers, qdrant (in-process), the registry's
version check, idempotence and reversal, the batching queue and thread-pool context."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry.trace import SpanKind

import inferpath
from inferpath.demo.assets import tokenizer_json_text
from inferpath.instrumentation import registry, threads
from inferpath.instrumentation.queues import QueueTicket, TracedQueue
from inferpath.instrumentation.stages import stage
from inferpath.instrumentation.threads import wrap_executor

TEXT = "Where is the bottleneck of this inference request?"


@pytest.fixture()
def only(spans):
    """Turn on the named integrations for one test; everything is unwrapped afterwards."""

    def turn_on(*names: str) -> list[str]:
        return registry.instrument_integrations(only=names)

    yield turn_on
    registry.uninstrument_integrations()


def test_tokenizers_class_methods_traced_inside_a_request_only(spans, only) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json_text())
    expected = tokenizer.encode(TEXT).ids
    assert only("tokenizers") == ["tokenizers"]
    tokenizer.encode("warm-up outside any request")  # not a request stage: no span
    with stage("gateway"):
        assert tokenizer.encode(TEXT).ids == expected
        tokenizer.encode_batch([TEXT, "short"])
    registry.uninstrument_integrations()
    with stage("gateway"):
        tokenizer.encode(TEXT)  # unwrapped again: no tokenize span
    finished = spans.finished(wait_for=4)
    tokenize = [s for s in finished if s.name == "tokenize"]
    assert [s.attributes["gen_ai.usage.input_tokens"] for s in tokenize][0] == len(expected)
    assert len(tokenize) == 2
    assert tokenize[1].attributes["inferpath.tokenize.batch_size"] == 2


def test_transformers_tokenizer_one_span_per_call(spans, only, tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    tokenizer_file = tmp_path / "tokenizer.json"
    tokenizer_file.write_text(tokenizer_json_text())
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file))
    only("transformers", "tokenizers")
    with stage("gateway"):
        ids = tokenizer.encode(TEXT)
        batch = tokenizer([TEXT, "short"])
    tokenize = [s for s in spans.finished(wait_for=3) if s.name == "tokenize"]
    # transformers calls the Rust tokenizer underneath: still one span per user call.
    assert len(tokenize) == 2
    assert tokenize[0].attributes["gen_ai.usage.input_tokens"] == len(ids)
    assert tokenize[1].attributes["gen_ai.usage.input_tokens"] == sum(map(len, batch["input_ids"]))
    assert tokenize[0].attributes["inferpath.tokenize.library"] == "transformers"


def test_qdrant_in_memory_search_is_a_retrieval_span(spans, only) -> None:
    qdrant_client = pytest.importorskip("qdrant_client")
    from qdrant_client import models

    client = qdrant_client.QdrantClient(":memory:")
    client.create_collection("docs", vectors_config=models.VectorParams(size=4, distance=models.Distance.COSINE))
    client.upsert(
        "docs", points=[models.PointStruct(id=i, vector=[1.0, i, 0.5, 0.0], payload={"n": i}) for i in range(10)]
    )
    assert only("qdrant") == ["qdrant"]
    with stage("gateway"):
        hits = client.query_points("docs", query=[1.0, 2.0, 0.5, 0.0], limit=3).points
        with stage("retrieval"):  # a user's own retrieval stage: no second span inside
            client.query_points("docs", query=[1.0, 2.0, 0.5, 0.0], limit=2)
    assert len(hits) == 3
    finished = spans.finished(wait_for=3)
    retrieval = [s for s in finished if s.name == "retrieval"]
    assert len(retrieval) == 2
    qdrant_span = next(s for s in retrieval if "db.system.name" in s.attributes)
    assert qdrant_span.attributes["inferpath.stage"] == "retrieval"
    assert qdrant_span.attributes["inferpath.retrieval.documents"] == 3
    assert qdrant_span.attributes["db.collection.name"] == "docs"
    assert qdrant_span.attributes["db.operation.name"] == "query_points"
    registry.uninstrument_integrations()
    assert "_inferpath_originals" not in qdrant_client.QdrantClient.__dict__


def test_registry_skips_unsupported_version_with_one_line(monkeypatch, caplog) -> None:
    monkeypatch.setattr(
        registry,
        "INTEGRATIONS",
        (registry.Integration("httpx", "inferpath.instrumentation.genai_http", "httpx", "httpx", (99, 0)),),
    )
    with caplog.at_level(logging.INFO, logger="inferpath.instrumentation.registry"):
        assert registry.instrument_integrations() == []
    assert sum("older than the supported 99.0" in r.getMessage() for r in caplog.records) == 1


def test_instrument_all_twice_then_uninstrument_restores_every_library(spans) -> None:
    import concurrent.futures

    import httpx

    originals = (concurrent.futures.ThreadPoolExecutor.submit, httpx.HTTPTransport.handle_request)
    inferpath.instrument(service_name="svc", span_exporter=spans.exporter)
    active = registry.active_integrations()
    inferpath.instrument(service_name="svc", span_exporter=spans.exporter)
    try:
        assert registry.active_integrations() == active
        assert {"fastapi", "threads", "httpx"} <= set(active)
        assert threads.is_instrumented()
    finally:
        inferpath.uninstrument()
    assert registry.active_integrations() == []
    assert (concurrent.futures.ThreadPoolExecutor.submit, httpx.HTTPTransport.handle_request) == originals
    with pytest.raises(ValueError, match="integrations"):
        inferpath.instrument(service_name="svc", integrations=["no-such-library"])


def test_case5_executor_to_thread_bare_submit_and_gather_share_the_request(spans, only, serve_app) -> None:
    """Case 5 on a real FastAPI request: tokenizer via run_in_executor, to_thread and a bare
    ThreadPoolExecutor.submit; retrieval as two gather tasks."""
    import httpx
    from fastapi import FastAPI

    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json_text())
    only("threads", "tokenizers")
    app = FastAPI()
    inferpath.instrument(app, service_name="svc", span_exporter=spans.exporter)
    pool = ThreadPoolExecutor(max_workers=2)

    async def retrieve(label: str) -> str:
        async with stage("retrieval", **{"label": label}):
            await asyncio.sleep(0.01)
        return label

    @app.post("/v1/chat/completions")
    async def chat() -> dict:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(pool, tokenizer.encode, "via run_in_executor")
        await loop.run_in_executor(None, tokenizer.encode, "via default executor")
        await asyncio.to_thread(tokenizer.encode, "via to_thread")
        pool.submit(tokenizer.encode, "via bare submit").result(5)
        labels = await asyncio.gather(retrieve("a"), retrieve("b"))
        return {"labels": labels}

    try:
        with serve_app(app) as base_url:
            assert httpx.post(f"{base_url}/v1/chat/completions").json() == {"labels": ["a", "b"]}
    finally:
        pool.shutdown()
        inferpath.uninstrument(app)
    finished = spans.finished(wait_for=7)
    [server] = [s for s in finished if s.kind is SpanKind.SERVER]
    children = [s for s in finished if s is not server]
    assert sorted(s.name for s in children) == ["retrieval"] * 2 + ["tokenize"] * 4
    for span in children:
        assert span.context.trace_id == server.context.trace_id, span.name
        assert span.parent.span_id == server.context.span_id, span.name
    assert [s for s in finished if s.parent is None] == [server]  # no extra root span


def test_context_helpers_still_work_without_the_integration(spans) -> None:
    async def main() -> None:
        with ThreadPoolExecutor(max_workers=1) as pool:
            async with stage("gateway"):
                await asyncio.get_running_loop().run_in_executor(
                    wrap_executor(pool), lambda: stage("tokenize")(lambda: None)()
                )

    asyncio.run(main())
    finished = spans.finished(wait_for=2)
    gateway = next(s for s in finished if s.name == "gateway")
    tokenize = next(s for s in finished if s.name == "tokenize")
    assert tokenize.parent.span_id == gateway.context.span_id


def test_traced_queue_batches_and_records_each_wait_in_its_request(spans) -> None:
    async def main() -> list[list[int]]:
        queue: TracedQueue[int] = TracedQueue()
        batches: list[list[int]] = []

        async def request(n: int) -> None:
            async with stage("gateway", **{"request": n}):
                await queue.put(n)

        async def batcher() -> None:
            while sum(map(len, batches)) < 5:
                batches.append(await queue.get_batch(3, max_wait_seconds=0.05))

        consumer = asyncio.create_task(batcher())
        await asyncio.gather(*(request(n) for n in range(5)))
        await asyncio.wait_for(consumer, 5)
        return batches

    batches = asyncio.run(main())
    assert sorted(sum(batches, [])) == [0, 1, 2, 3, 4]
    assert max(map(len, batches)) <= 3
    finished = spans.finished(wait_for=10)
    gateways = {s.attributes["request"]: s for s in finished if s.name == "gateway"}
    queued = [s for s in finished if s.name == "queue"]
    assert len(queued) == 5
    for span in queued:
        assert span.attributes["inferpath.stage"] == "queue"
        parent = next(g for g in gateways.values() if g.context.span_id == span.parent.span_id)
        assert span.context.trace_id == parent.context.trace_id
        assert span.start_time >= parent.start_time and span.end_time > span.start_time
        assert 1 <= span.attributes["inferpath.queue.batch_size"] <= 3
    with pytest.raises(ValueError, match="max_items"):
        asyncio.run(TracedQueue().get_batch(0, 0.1))


def test_queue_ticket_for_home_made_queues(spans) -> None:
    with stage("gateway"):
        ticket = QueueTicket(depth=4)
    waited = ticket.dequeued(batch_size=8)
    assert ticket.dequeued() >= waited >= 0  # once only
    finished = spans.finished(wait_for=2)
    [queue_span] = [s for s in finished if s.name == "queue"]
    assert queue_span.attributes["inferpath.queue.depth"] == 4
    assert queue_span.attributes["inferpath.queue.batch_size"] == 8
    assert queue_span.parent.span_id == next(s for s in finished if s.name == "gateway").context.span_id


def test_the_installed_fastapi_is_in_the_range_pyproject_pins() -> None:
    # instrumentation/fastapi.py turns native tracing off through FastAPI's private telemetry
    # dict; a version outside the checked range fails here, before a second SERVER span appears.
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    from fastapi import FastAPI
    from packaging.requirements import Requirement

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    for extra in ("server", "fastapi"):
        [pinned] = [
            Requirement(item)
            for item in pyproject["project"]["optional-dependencies"][extra]
            if Requirement(item).name == "fastapi"
        ]
        assert any(spec.operator == "<" for spec in pinned.specifier), (extra, str(pinned))
        assert version("fastapi") in pinned.specifier, (version("fastapi"), str(pinned.specifier))
    config = getattr(FastAPI(), "_telemetry", None)
    assert config is None or isinstance(config.get("tracing"), bool), config
