"""The diagnosis served by the read API and the ``inferpath diagnose`` command's exit codes."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from fault_scenarios import SCENARIOS, load_scenario
from typer.testing import CliRunner

from inferpath.cli import app
from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread


@pytest.fixture()
def tokenizer_server(store_url: str):
    server = serve_in_thread(Settings(store_url=store_url), port=0)
    try:
        yield server, load_scenario(server.runtime.store, SCENARIOS["slow_tokenizer"])
    finally:
        server.stop()


def _get(server, **params) -> httpx.Response:
    return httpx.get(f"{server.url}/api/v1/diagnosis", params=params, timeout=30)


def test_read_api_names_the_slow_tokenizer_with_and_without_a_baseline(tokenizer_server) -> None:
    server, windows = tokenizer_server
    window = {"start": windows["window_start"].isoformat(), "end": windows["window_end"].isoformat()}
    verdict = _get(
        server,
        **window,
        baseline_start=windows["baseline_start"].isoformat(),
        baseline_end=windows["baseline_end"].isoformat(),
    ).json()
    assert verdict["healthy"] is False and verdict["basis"] == "baseline"
    assert verdict["top_cause"] == "tokenization"
    assert verdict["causes"][0]["would_not_help"][0].startswith("adding GPUs will not help")
    assert verdict["baseline"]["meets_objectives"] is True
    # The same window alone: TTFT p99 ~250 ms meets the default 1 s objective...
    alone = _get(server, **window).json()
    assert alone["healthy"] is True and alone["baseline"] is None and alone["causes"] == []
    # ...and breaks a 150 ms one, where the tokenizer takes most of the slow requests' time.
    strict = _get(server, **window, ttft_p99_seconds=0.15).json()
    assert strict["healthy"] is False and strict["basis"] == "objectives"
    assert strict["top_cause"] == "tokenization" and strict["budget"]["items"][0]["cause"] == "tokenization"
    same = _get(server, **window, objectives=json.dumps({"interactive": {"ttft_p99_seconds": 0.15}})).json()
    assert same["top_cause"] == "tokenization"
    # A baseline with no requests is set aside with a note, not a refusal.
    thin = _get(server, **window, baseline_start="2001-01-01T00:00:00Z", baseline_end="2001-01-01T00:10:00Z")
    assert thin.status_code == 200 and "baseline ignored" in thin.json()["notes"][0]


@pytest.mark.parametrize(
    ("params", "status", "param", "words"),
    [
        (
            {"start": "2001-01-01T00:00:00Z", "end": "2001-01-01T00:10:00Z"},
            422,
            "start",
            "insufficient data: 0 requests",
        ),
        # Without start, the 15 minutes before end (as the views): judged, and found empty.
        ({"end": "2001-01-01T00:10:00Z"}, 422, "start", "insufficient data: 0 requests"),
        ({"start": "2001-01-01T00:10:00Z", "end": "2001-01-01T00:00:00Z"}, 422, "end", "after start"),
        ({"start": "2099-01-01T00:00:00Z", "end": "2099-01-01T00:10:00Z"}, 422, "start", "future"),
        (
            {"start": "2001-01-01T00:00:00Z", "end": "2001-01-01T00:10:00Z", "baseline_start": "2000-12-31T00:00:00Z"},
            422,
            "baseline_end",
            "together",
        ),
        (
            {"start": "2001-01-01T00:00:00Z", "end": "2001-01-01T00:10:00Z", "endpoint": "/nowhere"},
            404,
            "endpoint",
            "no request of endpoint",
        ),
        (
            {
                "start": "2001-01-01T00:00:00Z",
                "end": "2001-01-01T00:10:00Z",
                "objectives": '{"interactive": {"ttft": 1}}',
            },
            422,
            "objectives",
            "ttft_p99_seconds",
        ),
        (
            {"start": "2001-01-01T00:00:00Z", "end": "2001-01-01T00:10:00Z", "objectives": "garbage"},
            422,
            "objectives",
            "objectives must be JSON in the objectives file's shape",
        ),
    ],
)
def test_bad_windows_and_parameters_get_a_4xx_naming_the_parameter(
    tokenizer_server, params, status, param, words
) -> None:
    server, _ = tokenizer_server
    response = _get(server, **params)
    assert response.status_code == status, response.text
    detail = response.json()["detail"][0]
    assert detail["loc"][-1] == param and words in detail["msg"]


def test_diagnose_command_exit_codes() -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["diagnose", "--since", "soon"])
    assert bad.exit_code == 2 and "--since" in bad.output
    both = runner.invoke(app, ["diagnose", "--since", "15m", "--from", "-1h"])
    assert both.exit_code == 2 and "not both" in both.output
    unreachable = runner.invoke(app, ["diagnose", "--since", "15m", "--server", "http://127.0.0.1:9"])
    assert unreachable.exit_code == 2 and "cannot reach" in unreachable.output and "--store" in unreachable.output
    as_json = runner.invoke(app, ["diagnose", "--since", "1h30m", "--json", "--server", "http://127.0.0.1:9"])
    assert as_json.exit_code == 2 and "cannot reach" in json.loads(as_json.stdout)["error"]


def test_diagnose_json_prints_a_refusal_as_json(store_url: str) -> None:
    server = serve_in_thread(Settings(store_url=store_url), port=0)
    try:  # an empty store: the window cannot be judged (422)
        result = CliRunner().invoke(
            app, ["diagnose", "--from", "-15m", "--to", "now", "--json", "--server", server.url]
        )
    finally:
        server.stop()
    assert result.exit_code == 2
    refusal = json.loads(result.stdout)
    assert refusal["http_status"] == 422 and "insufficient data: 0 requests" in refusal["error"]


def test_diagnose_reads_a_store_directly_when_no_server_holds_it(store_url: str) -> None:
    server = serve_in_thread(Settings(store_url=store_url), port=0)
    try:
        windows = load_scenario(server.runtime.store, SCENARIOS["slow_tokenizer"])
    finally:
        server.stop()
    start, end = windows["window_start"], windows["window_end"]
    result = CliRunner().invoke(
        app,
        [
            "diagnose",
            "--from",
            start.isoformat(),
            "--to",
            end.isoformat(),
            "--baseline",
            f"{int((end - start).total_seconds())}s",
            "--json",
            "--store",
            store_url,
        ],
    )
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout)["top_cause"] == "tokenization"
    assert datetime.fromisoformat(json.loads(result.stdout)["current_window"][0]) == start.astimezone(timezone.utc)
    assert end - start == timedelta(minutes=10)
