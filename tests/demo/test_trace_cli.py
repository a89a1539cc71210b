"""`inferpath replay --trace` and `inferpath demo --trace` on every trace format, recognised
from the content; bad rows are named by line and exit 2 before anything is sent."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from typer.testing import CliRunner

from inferpath.cli import app

runner = CliRunner()


def _openai_stub() -> FastAPI:
    """An OpenAI-compatible streaming endpoint (one word per output token) and an OTLP sink."""
    stub = FastAPI()
    stub.state.max_tokens = []

    @stub.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        stub.state.max_tokens.append(body["max_tokens"])

        def chunks():
            for _ in range(body["max_tokens"]):
                yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "w "}}]}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    @stub.post("/v1/traces")
    async def traces() -> Response:
        return Response(b"", media_type="application/x-protobuf")

    return stub


def test_replay_plays_a_mooncake_trace(tmp_path: Path, serve_app) -> None:
    # Mooncake FAST'25 shape: milliseconds from the start, prefix hash blocks.
    trace = tmp_path / "conversation_trace.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 30, "output_length": 3, "hash_ids": [0, 1]}\n'
        '{"timestamp": 40, "input_length": 12, "output_length": 2, "hash_ids": [0, 2]}\n'
    )
    stub = _openai_stub()
    with serve_app(stub) as url:
        result = runner.invoke(
            app,
            ["replay", "--gateway", url, "--trace", str(trace), "--speed", "10"],
            env={"INFERPATH_OTLP_ENDPOINT": url},
        )
    assert result.exit_code == 0, result.output
    assert "Mooncake FAST'25 JSONL): 2 requests" in result.output
    assert "2 of 2 requests completed" in result.output
    assert sorted(stub.state.max_tokens) == [2, 3]


def test_bad_rows_stop_replay_and_demo_before_anything_starts(tmp_path: Path) -> None:
    trace = tmp_path / "burst.csv"
    trace.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "6,ChatGPT,lots,18,490,Conversation log\n"
    )
    for command in (
        ["replay", "--gateway", "http://127.0.0.1:9"],
        ["demo", "--exit", "--store", f"chdb://{tmp_path / 'store'}"],
    ):
        result = runner.invoke(app, [*command, "--trace", str(trace)])
        assert result.exit_code == 2, result.output
        assert "line 3: Request tokens 'lots' is not an integer" in result.output
        assert "Traceback" not in result.output


def test_replay_names_the_end_it_cannot_reach_before_sending_anything(serve_app) -> None:
    result = runner.invoke(app, ["replay", "--gateway", "http://127.0.0.1:9", "--requests", "3"])
    assert result.exit_code == 2, result.output
    assert "cannot reach the gateway at http://127.0.0.1:9: ConnectError" in " ".join(result.output.split())
    stub = _openai_stub()
    with serve_app(stub) as url:
        result = runner.invoke(
            app, ["replay", "--gateway", url, "--requests", "3"], env={"INFERPATH_OTLP_ENDPOINT": "http://127.0.0.1:9"}
        )
    flat = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "cannot reach the inferpath server (INFERPATH_OTLP_ENDPOINT) at http://127.0.0.1:9" in flat, flat
    assert stub.state.max_tokens == [] and "Transient error" not in result.output


def test_a_binary_file_given_as_a_trace_is_named_with_the_formats_expected(tmp_path: Path) -> None:
    trace = tmp_path / "rand.bin"
    trace.write_bytes(b"\x00\xa0\xff\xfe binary \x9c\x01" * 64)
    for command in (
        ["replay", "--gateway", "http://127.0.0.1:9"],
        ["demo", "--exit", "--store", f"chdb://{tmp_path / 'store'}"],
    ):
        result = runner.invoke(app, [*command, "--trace", str(trace)])
        said = " ".join(result.output.split())
        assert result.exit_code == 2, said
        assert "rand.bin: not a text trace" in said and "expected CSV or JSON Lines" in said, said
        assert "Traceback" not in said
