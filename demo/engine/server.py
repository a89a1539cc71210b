"""The emulated engine behind an OpenAI-compatible HTTP API, shaped like vLLM's server.

Routes:

- ``POST /v1/completions``: ``prompt`` (a string, or a list of token ids), ``max_tokens``
  (default 16, OpenAI's), ``stream``, ``stream_options.include_usage``. Streamed responses are
  ``text_completion`` chunks as Server-Sent Events (``data: {...}\\n\\n``) ending with
  ``data: [DONE]``; each chunk's text is one emitted word (no model runs: the words are
  placeholders, the timing is the engine's).
- ``POST /v1/chat/completions``: the same for ``messages``; the first streamed chunk carries
  only the assistant role, as vLLM's does.
- ``GET /v1/models``, ``GET /health``.
- ``GET /metrics``: vLLM's Prometheus metrics (:mod:`.metrics`).
- ``GET /gpu/metrics``: dcgm-exporter-compatible GPU gauges (:mod:`.metrics`).

Prompt length of a string is estimated as ceil(characters / 4), the usual rule of thumb for
English BPE tokenizers; send token ids for exact counts (the demo gateway tokenizes for real).
Errors use OpenAI's body ``{"error": {"message", "type", "param", "code"}}`` with status 400
for invalid input (naming the field) and 404 for an unknown model, as vLLM answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from inferpath.demo.engine.metrics import EngineMetrics, gpu_registry
from inferpath.demo.engine.scheduler import Engine, EngineConfig, RequestAborted, RequestStream, TokenEvent
from inferpath.demo.engine.tracing import (
    RequestSpanRecorder,
    build_tracer_provider,
    extract_parent,
    record_startup_spans,
    shutdown_tracer_provider,
)

logger = logging.getLogger(__name__)

_WORDS = (
    "the",
    "model",
    "returns",
    "a",
    "token",
    "for",
    "each",
    "step",
    "of",
    "decode",
    "and",
    "every",
    "request",
    "waits",
    "in",
    "queue",
    "until",
    "blocks",
    "are",
    "free",
    "then",
    "prefill",
    "runs",
    "over",
    "its",
    "prompt",
    "while",
    "batch",
    "grows",
    "with",
    "load",
    "so",
)
_CHAT_TOKENS_PER_MESSAGE = 4  # role and separator tokens a chat template adds per message
_SPAN_SHUTDOWN_SECONDS = 2.0


class StreamOptions(BaseModel):
    include_usage: bool = False


class _GenerationParams(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI clients send many fields we ignore

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: Literal[1] = 1


class CompletionRequest(_GenerationParams):
    """Body of ``POST /v1/completions`` (the subset the emulator honours)."""

    prompt: str | list[int] | list[str]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_GenerationParams):
    """Body of ``POST /v1/chat/completions``; ``max_completion_tokens`` wins over ``max_tokens``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = "NotFoundError" if status == 404 else "BadRequestError"
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status
    )


def _text_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def _prompt_tokens(prompt: str | list[int] | list[str]) -> int:
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt: must not be empty")
        return _text_tokens(prompt)
    if not prompt:
        raise ValueError("prompt: must not be empty")
    if all(isinstance(item, str) for item in prompt):
        if len(prompt) != 1:
            raise ValueError("prompt: only one prompt per request is supported")
        return _prompt_tokens(str(prompt[0]))
    return len(prompt)


def _chat_prompt_tokens(messages: list[ChatMessage]) -> int:
    total = 0
    for message in messages:
        content = message.content
        if isinstance(content, list):
            content = " ".join(str(part.get("text", "")) for part in content)
        total += _CHAT_TOKENS_PER_MESSAGE + (_text_tokens(content) if content else 0)
    return total


def _word(event: TokenEvent) -> str:
    return " " + _WORDS[event.token_id % len(_WORDS)]


def _sse(payload: dict[str, Any] | str) -> str:
    body = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {body}\n\n"


class AdminConfig(BaseModel):
    """Body of ``POST /admin/config``: the fault knobs to change while the engine runs
    (see :class:`EngineConfig`); fields left out keep their value."""

    model_config = ConfigDict(extra="forbid")

    time_scale: float | None = Field(None, gt=0)
    prefill_slowdown: float | None = Field(None, gt=0)
    decode_slowdown: float | None = Field(None, gt=0)
    batch_window_seconds: float | None = Field(None, ge=0, le=60)
    num_kv_blocks: int | None = Field(None, ge=1)


def create_app(
    engine_config: EngineConfig,
    *,
    service_name: str = "demo-engine",
    otlp_endpoint: str | None = None,
    span_exporter: SpanExporter | None = None,
    hostname: str | None = None,
    startup_seconds: float = 0.0,
) -> FastAPI:
    """Build the emulated engine's FastAPI app (the engine runs while the app is served).

    ``otlp_endpoint``: base URL of an OTLP/HTTP receiver (spans go to ``/v1/traces``);
    ``span_exporter``: an extra exporter (tests); ``hostname``: the dcgm ``Hostname`` label
    (default: this machine's). ``startup_seconds``: emulated model loading before the app
    accepts requests (uvicorn listens only after start-up, as vLLM's API server does), then
    recorded as vLLM-style start-up spans (``Overall Loading`` …). ``app.state`` holds
    ``engine``, ``tracer_provider``, ``engine_metrics`` and ``span_recorder``.
    Raises ``ValueError`` naming ``startup_seconds`` when it is negative.
    """
    if not math.isfinite(startup_seconds) or startup_seconds < 0:
        raise ValueError(f"startup_seconds: must be a finite number >= 0, got {startup_seconds!r}")
    engine = Engine(engine_config)
    model_name = engine_config.served_model_name or engine_config.model
    provider = build_tracer_provider(service_name, otlp_endpoint, span_exporter)
    recorder = RequestSpanRecorder(provider, model_name)
    engine_metrics = EngineMetrics(engine, model_name)
    gpu_metrics = gpu_registry(engine, hostname)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if startup_seconds > 0:
            loading_start_ns = time.time_ns()
            await asyncio.sleep(startup_seconds)
            record_startup_spans(provider, loading_start_ns, time.time_ns())
        engine.start()
        try:
            yield
        finally:
            await engine.stop()
            shutdown_tracer_provider(provider, _SPAN_SHUTDOWN_SECONDS)

    app = FastAPI(title="inferpath emulated engine", lifespan=lifespan)
    app.state.engine = engine
    app.state.tracer_provider = provider
    app.state.engine_metrics = engine_metrics
    app.state.span_recorder = recorder

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        field = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        return _error(400, f"{field or 'body'}: {first.get('msg')}", field or None)

    def finish(metrics, previous_emits: list[float], parent, params: _GenerationParams) -> None:
        gaps = [b - a for a, b in zip(previous_emits, previous_emits[1:])]
        try:
            engine_metrics.observe_finished(metrics, gaps)
        except Exception:  # a metrics failure must not fail the request
            logger.warning("metrics for %s not recorded", metrics.request_id, exc_info=True)
        recorder.record(metrics, parent, temperature=params.temperature, top_p=params.top_p, n=params.n)

    def check_model(params: _GenerationParams) -> JSONResponse | None:
        if params.model is not None and params.model != model_name:
            return _error(404, f"The model `{params.model}` does not exist.", "model")
        return None

    async def run(
        request: Request, params: _GenerationParams, prompt_tokens: int, max_tokens: int, chat: bool
    ) -> Response:
        parent = extract_parent(request.headers)
        try:
            stream = engine.submit(prompt_tokens, max_tokens)
        except ValueError as exc:
            return _error(400, str(exc), "max_tokens")
        created = int(time.time())
        rid = stream.request_id if not chat else stream.request_id.replace("cmpl-", "chatcmpl-", 1)
        obj = "chat.completion" if chat else "text_completion"
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max_tokens,
            "total_tokens": prompt_tokens + max_tokens,
        }
        if params.stream:
            include_usage = bool(params.stream_options and params.stream_options.include_usage)
            return StreamingResponse(
                _stream(stream, params, parent, rid, created, chat, include_usage, usage),
                media_type="text/event-stream",
            )
        emits: list[float] = []
        words: list[str] = []
        try:
            async for event in stream:
                emits.append(event.emitted_s)
                words.append(_word(event))
                if event.finished:
                    finish(event.metrics, emits, parent, params)
        except RequestAborted as exc:
            return _error(503, str(exc))
        finally:
            await stream.aclose()
        text = "".join(words)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse(
            {"id": rid, "object": obj, "created": created, "model": model_name, "choices": [choice], "usage": usage}
        )

    async def _stream(
        stream: RequestStream,
        params: _GenerationParams,
        parent,
        rid: str,
        created: int,
        chat: bool,
        include_usage: bool,
        usage: dict[str, int],
    ) -> AsyncIterator[str]:
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choice: dict[str, Any] | None) -> dict[str, Any]:
            body: dict[str, Any] = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model_name,
                "choices": [choice] if choice else [],
            }
            if include_usage:
                body["usage"] = None
            return body

        emits: list[float] = []
        try:
            if chat:
                yield _sse(
                    chunk(
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    )
                )
            async for event in stream:
                emits.append(event.emitted_s)
                reason = "length" if event.finished else None
                if chat:
                    choice = {"index": 0, "delta": {"content": _word(event)}, "logprobs": None, "finish_reason": reason}
                else:
                    choice = {
                        "index": 0,
                        "text": _word(event),
                        "logprobs": None,
                        "finish_reason": reason,
                        "stop_reason": None,
                    }
                yield _sse(chunk(choice))
                if event.finished:
                    finish(event.metrics, emits, parent, params)
            if include_usage:
                final = chunk(None)
                final["usage"] = usage
                yield _sse(final)
            yield _sse("[DONE]")
        except RequestAborted:
            logger.info("stream %s ended: engine stopped", rid)
        finally:
            await stream.aclose()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        if (bad := check_model(body)) is not None:
            return bad
        try:
            prompt_tokens = _prompt_tokens(body.prompt)
        except ValueError as exc:
            return _error(400, str(exc), "prompt")
        return await run(request, body, prompt_tokens, body.max_tokens or 16, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        if (bad := check_model(body)) is not None:
            return bad
        max_tokens = body.max_completion_tokens or body.max_tokens or 16
        return await run(request, body, _chat_prompt_tokens(body.messages), max_tokens, chat=True)

    @app.post("/admin/config")
    async def admin_config(body: AdminConfig) -> Any:
        """Turn fault knobs while running (the demo's scenarios); answers the values now in force."""
        try:
            return engine.reconfigure(**body.model_dump(exclude_none=True))
        except ValueError as exc:
            return _error(400, str(exc), str(exc).split(":", 1)[0])

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "inferpath-demo",
                    "root": engine_config.model,
                }
            ],
        }

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    # async so that collectors read the engine on the event loop's thread, between steps.
    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(engine_metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/gpu/metrics")
    async def gpu() -> Response:
        return Response(generate_latest(gpu_metrics), media_type=CONTENT_TYPE_LATEST)

    return app
