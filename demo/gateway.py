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
import itertools
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

import inferpath
from inferpath.demo.assets import load_tokenizer

# Below uvicorn's 5 s keep-alive timeout on the other side: an idle pooled connection is
# dropped here before the server closes it, so a request never goes out on a connection the
# server is closing at that moment (an httpx.ReadError on the response headers).
_KEEPALIVE_EXPIRY_SECONDS = 2.0


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
    ``engine_urls``: model servers to spread calls over, round robin (default: ``[engine_url]``).
    These may change while the gateway runs (``POST /admin/faults``). ``engine_max_connections``:
    the HTTP client's pool toward the model servers, set at start; each streamed call holds one
    connection, so a small pool is a queue in front of the engine (a client pool sized for
    another load).
    """

    engine_url: str
    retrieval_k: int = 3
    tokenize_delay_seconds: float = 0.0
    retrieval_delay_seconds: float = 0.0
    engine_urls: list[str] = field(default_factory=list)
    engine_max_connections: int = 512

    def __post_init__(self) -> None:
        if not self.engine_urls:
            self.engine_urls = [self.engine_url]


class FaultSettings(BaseModel):
    """Body of ``POST /admin/faults``: gateway knobs the demo's fault scenarios turn while it
    runs; fields left out keep their value."""

    model_config = ConfigDict(extra="forbid")

    tokenize_delay_seconds: float | None = Field(None, ge=0, le=60)
    retrieval_delay_seconds: float | None = Field(None, ge=0, le=60)
    engine_urls: list[str] | None = Field(None, min_length=1)


class _DelayedTokenizer:
    """A tokenizer whose ``encode`` first burns ``config.tokenize_delay_seconds`` (read at every
    call): the slow-tokenizer fault, inside the traced tokenizer call as a slow tokenizer's
    time would be."""

    def __init__(self, tokenizer: Any, config: GatewayConfig) -> None:
        self._tokenizer, self._config = tokenizer, config

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        if self._config.tokenize_delay_seconds:
            time.sleep(self._config.tokenize_delay_seconds)
        return self._tokenizer.encode(*args, **kwargs)


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _error(status_code: int, message: str) -> JSONResponse:
    """An OpenAI-style error body (``{"error": {"message", "type", "code"}}``)."""
    return JSONResponse(
        {"error": {"message": message, "type": "model_server_error", "code": status_code}}, status_code=status_code
    )


def create_gateway_app(
    config: GatewayConfig,
    *,
    service_name: str = "demo-gateway",
    endpoint_class: str = "interactive",
    otlp_endpoint: str | None = None,
    span_exporter: Any = None,
) -> FastAPI:
    """Build the gateway app, instrumented with ``inferpath.instrument``."""
    from inferpath.demo.retrieval import BM25Retriever
    from inferpath.instrumentation.clients import stream_chat_completion
    from inferpath.instrumentation.tokenizers import instrument_tokenizer

    raw_tokenizer = load_tokenizer()
    tokenizer = instrument_tokenizer(raw_tokenizer)
    # The fault slows the prompt's tokenization only; the retrieved passages' encoding stays as
    # it was, so the slow-tokenizer scenario does not also grow the retrieval stage.
    prompt_tokenizer = instrument_tokenizer(_DelayedTokenizer(raw_tokenizer, config))
    retriever = BM25Retriever()
    state: dict[str, httpx.AsyncClient] = {}
    turn = itertools.count()

    async def lifespan(app: FastAPI):
        state["client"] = httpx.AsyncClient(
            timeout=httpx.Timeout(600.0, connect=5.0),
            limits=httpx.Limits(
                max_connections=config.engine_max_connections, keepalive_expiry=_KEEPALIVE_EXPIRY_SECONDS
            ),
        )
        yield
        await state["client"].aclose()
        from inferpath.instrumentation.provider import shutdown

        shutdown()

    app = FastAPI(title="inferpath demo gateway", lifespan=lifespan)
    inferpath.instrument(
        app,
        service_name=service_name,
        endpoint_class=endpoint_class,
        otlp_endpoint=otlp_endpoint,
        span_exporter=span_exporter,
    )

    def encode(text: str) -> list[int]:
        return prompt_tokenizer.encode(text, add_special_tokens=False).ids

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

    @app.post("/admin/faults")
    async def faults(body: FaultSettings) -> dict[str, Any]:
        """Change the fault knobs (demo scenarios); answers the settings now in force."""
        for name, value in body.model_dump(exclude_none=True).items():
            setattr(config, name, [u.rstrip("/") for u in value] if name == "engine_urls" else value)
        return {
            "tokenize_delay_seconds": config.tokenize_delay_seconds,
            "retrieval_delay_seconds": config.retrieval_delay_seconds,
            "engine_urls": config.engine_urls,
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest):
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
        urls = config.engine_urls
        engine_url = urls[next(turn) % len(urls)]
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": request.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }

        # The engine's first chunk (or its refusal) before anything is answered: a model server
        # that is down or starting gets a 503 here, not a 200 cut off mid-stream.
        events = stream_chat_completion(state["client"], f"{engine_url}/v1/completions", payload, stage="model")
        try:
            first = await anext(events, None)
        except httpx.HTTPStatusError as exc:
            code = exc.response.status_code
            return _error(code if code < 500 else 502, f"the model server at {engine_url} answered HTTP {code}")
        except httpx.HTTPError as exc:
            return _error(503, f"the model server at {engine_url} is not reachable ({type(exc).__name__})")

        async def engine_events() -> AsyncIterator[dict[str, Any]]:
            async with events:  # a caller gone mid-stream closes the engine call too
                if first is not None:
                    yield first
                    async for event in events:
                        yield event

        async def stream() -> AsyncIterator[bytes]:
            usage: dict[str, Any] | None = None
            yield _sse(chunk({"role": "assistant", "content": ""}))
            try:
                async for event in engine_events():
                    if event.get("usage"):
                        usage = event["usage"]
                    for choice in event.get("choices") or ():
                        if choice.get("text"):
                            yield _sse(chunk({"content": choice["text"]}))
            except httpx.HTTPError as exc:
                # The model server broke off mid-stream: an error event and no [DONE], so the
                # caller (and this gateway's span) sees an incomplete answer, not a short one.
                message = f"the model server at {engine_url} broke off the stream ({type(exc).__name__})"
                yield _sse({"error": {"message": message, "type": "model_server_error", "code": 502}})
                return
            yield _sse(chunk({}, "length"))
            if request.stream_options and request.stream_options.include_usage and usage:
                yield _sse(
                    {
                        "id": completion_id,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": request.model,
                        "choices": [],
                        "usage": usage,
                    }
                )
            yield b"data: [DONE]\n\n"

        if request.stream:
            return StreamingResponse(stream(), media_type="text/event-stream")
        text: list[str] = []
        async for raw in stream():
            if raw.startswith(b"data: {"):
                data = json.loads(raw[6:])
                if "error" in data:
                    return _error(502, data["error"]["message"])
                for choice in data.get("choices") or ():
                    text.append(choice.get("delta", {}).get("content") or "")
        return JSONResponse(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": request.model,
                "choices": [
                    {"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "".join(text)}}
                ],
            }
        )

    return app


def _positive(text: str) -> int:
    """An integer >= 1 (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


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
    parser.add_argument(
        "--engine-max-connections",
        type=_positive,
        default=512,
        help="connections in the HTTP pool toward the model servers (default 512); each streamed call holds one "
        "for its whole answer, so fewer than the engine's --max-num-seqs caps the calls that reach it",
    )
    args = parser.parse_args(argv)
    # The fault knobs are the demo's admin API, not requests of the service: excluded from
    # tracing as any FastAPI route is, with OpenTelemetry's variable (a user's value wins).
    os.environ.setdefault("OTEL_PYTHON_FASTAPI_EXCLUDED_URLS", "^/admin/")
    config = GatewayConfig(
        engine_url=args.engine_url.rstrip("/"),
        tokenize_delay_seconds=args.tokenize_delay_seconds,
        retrieval_delay_seconds=args.retrieval_delay_seconds,
        engine_max_connections=args.engine_max_connections,
    )
    app = create_gateway_app(config, endpoint_class=args.endpoint_class, otlp_endpoint=args.otlp_endpoint)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False, timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
