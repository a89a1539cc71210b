"""The demo's OpenAI-compatible gateway: tokenizer → retrieval → model server, streamed back.

``POST /v1/chat/completions`` (``stream`` true or false) takes the last user message, tokenizes
it with the shipped pretrained tokenizer, retrieves the top passages with BM25, and forwards
``retrieved passages + prompt`` as token ids to the model server's ``/v1/completions``. The
answer streams back as ``chat.completion.chunk`` server-sent events: first a role-only chunk
(which does not count for TTFT), then one chunk per token, a finish chunk, a usage chunk when
``stream_options.include_usage`` is set, and ``[DONE]``.

The whole service is instrumented with the one line ``inferpath.instrument(app, ...)``; the
tokenizer and the retrieval call are the two stage spans a developer would add.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Literal

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

import inferpath
from inferpath.demo.assets import load_tokenizer


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model: str = "llama2-70b"
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int = Field(16, ge=1, le=32768)
    stream: bool = False
    stream_options: StreamOptions | None = None


@dataclass
class GatewayConfig:
    """Where the model server is, and the knobs the fault scenarios turn.

    ``tokenize_delay_seconds`` / ``retrieval_delay_seconds`` add CPU-side latency to those stages
    (a slow tokenizer, a slow vector store); ``retrieval_k`` passages are prepended to the prompt.
    """

    engine_url: str
    retrieval_k: int = 3
    tokenize_delay_seconds: float = 0.0
    retrieval_delay_seconds: float = 0.0


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def create_gateway_app(config: GatewayConfig, *, service_name: str = "demo-gateway",
                       endpoint_class: str = "interactive", otlp_endpoint: str | None = None,
                       span_exporter: Any = None) -> FastAPI:
    """Build the gateway app, instrumented with ``inferpath.instrument``."""
    from inferpath.demo.retrieval import BM25Retriever
    from inferpath.instrumentation.clients import stream_chat_completion
    from inferpath.instrumentation.tokenizers import instrument_tokenizer

    tokenizer = instrument_tokenizer(load_tokenizer())
    retriever = BM25Retriever()
    state: dict[str, httpx.AsyncClient] = {}

    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        state["client"] = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0),
                                            limits=httpx.Limits(max_connections=512))
        yield
        await state["client"].aclose()
        from inferpath.instrumentation.provider import shutdown
        shutdown()

    app = FastAPI(title="inferpath demo gateway", lifespan=lifespan)
    inferpath.instrument(app, service_name=service_name, endpoint_class=endpoint_class,
                         otlp_endpoint=otlp_endpoint, span_exporter=span_exporter)

    def encode(text: str) -> list[int]:
        if config.tokenize_delay_seconds:
            time.sleep(config.tokenize_delay_seconds)
        return tokenizer.encode(text, add_special_tokens=False).ids

    @inferpath.stage("retrieval")
    async def retrieve(query: str) -> list[int]:
        if config.retrieval_delay_seconds:
            await asyncio.sleep(config.retrieval_delay_seconds)
        passages = retriever.search(query, k=config.retrieval_k)
        context = " ".join(p.text for p in passages)
        return tokenizer.encode(context, add_special_tokens=False).ids

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest):  # type: ignore[no-untyped-def]
        user_text = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
        # Tokenization is CPU work: run it off the event loop (the span follows the context).
        prompt_ids = await asyncio.to_thread(encode, user_text)
        context_ids = await retrieve(" ".join(user_text.split()[:32]))
        payload = {
            "model": request.model,
            "prompt": context_ids + prompt_ids,
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                    "model": request.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

        async def stream() -> AsyncIterator[bytes]:
            usage: dict[str, Any] | None = None
            yield _sse(chunk({"role": "assistant", "content": ""}))
            async for event in stream_chat_completion(state["client"], f"{config.engine_url}/v1/completions",
                                                      payload, stage="model"):
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices") or ():
                    if choice.get("text"):
                        yield _sse(chunk({"content": choice["text"]}))
            yield _sse(chunk({}, "length"))
            if request.stream_options and request.stream_options.include_usage and usage:
                yield _sse({"id": completion_id, "object": "chat.completion.chunk", "created": created,
                            "model": request.model, "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"

        if request.stream:
            return StreamingResponse(stream(), media_type="text/event-stream")
        text: list[str] = []
        async for raw in stream():
            if raw.startswith(b"data: {"):
                for choice in json.loads(raw[6:]).get("choices") or ():
                    text.append(choice.get("delta", {}).get("content") or "")
        return JSONResponse({"id": completion_id, "object": "chat.completion", "created": created,
                             "model": request.model,
                             "choices": [{"index": 0, "finish_reason": "length",
                                          "message": {"role": "assistant", "content": "".join(text)}}]})

    return app


def main(argv: list[str] | None = None) -> None:
    """``python -m inferpath.demo.gateway --port N --engine-url URL [--otlp-endpoint URL]``."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="inferpath-demo-gateway")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--engine-url", required=True)
    parser.add_argument("--otlp-endpoint", default=None)
    parser.add_argument("--endpoint-class", default="interactive", choices=["interactive", "bulk"])
    parser.add_argument("--tokenize-delay-seconds", type=float, default=0.0)
    parser.add_argument("--retrieval-delay-seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    config = GatewayConfig(engine_url=args.engine_url.rstrip("/"),
                           tokenize_delay_seconds=args.tokenize_delay_seconds,
                           retrieval_delay_seconds=args.retrieval_delay_seconds)
    app = create_gateway_app(config, endpoint_class=args.endpoint_class, otlp_endpoint=args.otlp_endpoint)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
