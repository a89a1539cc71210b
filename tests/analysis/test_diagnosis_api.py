"""The diagnosis served by the read API and the ``inferpath diagnose`` command's exit codes."""

from __future__ import annotations

import json

import httpx
from fault_scenarios import SCENARIOS, load_scenario
from typer.testing import CliRunner

from inferpath.cli import app
from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread


def test_read_api_names_the_slow_tokenizer(store_url: str) -> None:
    server = serve_in_thread(Settings(store_url=store_url), port=0)
    try:
        windows = load_scenario(server.runtime.store, SCENARIOS["slow_tokenizer"])
        params = {"start": windows["window_start"].isoformat(), "end": windows["window_end"].isoformat(),
                  "baseline_start": windows["baseline_start"].isoformat(),
                  "baseline_end": windows["baseline_end"].isoformat()}
        verdict = httpx.get(f"{server.url}/api/v1/diagnosis", params=params, timeout=30).json()
        assert verdict["healthy"] is False
        assert verdict["top_cause"] == "tokenization"
        assert verdict["causes"][0]["would_not_help"][0].startswith("adding GPUs will not help")
        # A window with no requests cannot be judged: 422 naming why, not a verdict of "healthy".
        empty = httpx.get(f"{server.url}/api/v1/diagnosis",
                          params={"start": "2001-01-01T00:00:00Z", "end": "2001-01-01T00:10:00Z"}, timeout=30)
        assert empty.status_code == 422 and "request" in empty.text
        assert empty.json()["detail"][0]["loc"] == ["query", "start"]
        # The scenario's window against an empty baseline: the 422 names the baseline.
        no_baseline = httpx.get(f"{server.url}/api/v1/diagnosis", timeout=30, params=dict(
            params, baseline_start="2001-01-01T00:00:00Z", baseline_end="2001-01-01T00:10:00Z"))
        assert no_baseline.status_code == 422 and "baseline window has 0" in no_baseline.text
        assert no_baseline.json()["detail"][0]["loc"] == ["query", "baseline_start"]
        # A window at the start of time has no room for the default baseline: say so, naming start.
        at_epoch = httpx.get(f"{server.url}/api/v1/diagnosis", timeout=30,
                             params={"start": "1970-01-01T00:00:00Z", "end": "1970-01-01T01:00:00Z"})
        assert at_epoch.status_code == 422 and at_epoch.json()["detail"][0]["loc"] == ["query", "start"]
        assert "default baseline" in at_epoch.text
    finally:
        server.stop()


def test_diagnose_command_exit_codes() -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["diagnose", "--since", "soon"])
    assert bad.exit_code == 2 and "--since" in bad.output
    unreachable = runner.invoke(app, ["diagnose", "--since", "15m", "--server", "http://127.0.0.1:9"])
    assert unreachable.exit_code == 2 and "cannot reach" in unreachable.output
    as_json = runner.invoke(app, ["diagnose", "--since", "15m", "--json", "--server", "http://127.0.0.1:9"])
    assert as_json.exit_code == 2 and "cannot reach" in json.loads(as_json.stdout)["error"]


def test_diagnose_json_prints_a_refusal_as_json(store_url: str) -> None:
    server = serve_in_thread(Settings(store_url=store_url), port=0)
    try:  # an empty store: the window cannot be judged (422)
        result = CliRunner().invoke(app, ["diagnose", "--since", "15m", "--json", "--server", server.url])
    finally:
        server.stop()
    assert result.exit_code == 2
    refusal = json.loads(result.stdout)
    assert refusal["http_status"] == 422 and "0 requests" in refusal["error"]
