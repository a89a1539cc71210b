"""``inferpath alerts test``: replaying rules over data already in a store."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from alert_scenarios import FAULT_END, FAULT_START, T0, batch_window_traffic, insert_requests
from typer.testing import CliRunner

from inferpath.alerts.cli import app
from inferpath.storage.store import Store

RULES = """
evaluation_interval: 15s
rules:
  - name: TTFTTailDivergence
    kind: tail_divergence
    endpoint_class: interactive
    ratio_threshold: 4
    min_samples: 100
    window: 1m
    for: 1m
"""


def test_cli_test_replays_past_data(store_url: str, tmp_path) -> None:
    # The scenario of case 3, ending a few minutes ago.
    t0 = (datetime.now(timezone.utc) - timedelta(minutes=16)).replace(second=0, microsecond=0)
    fault_start, fault_end = t0 + (FAULT_START - T0), t0 + (FAULT_END - T0)
    with Store.open(store_url, ttl_days=3650) as store:
        insert_requests(store, batch_window_traffic(t0))
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    runner = CliRunner()
    # chDB: the CLI opens the folder itself, so no store may be open in this process.
    result = runner.invoke(app, ["test", str(rules), "--since", "20m", "--step", "30s", "--store", store_url, "--json"])
    assert result.exit_code == 1, result.output  # something would have fired
    lines = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert [line["change"] for line in lines] == ["pending", "firing", "resolved"]
    firing_at = datetime.fromisoformat(lines[1]["at"])
    assert fault_start < firing_at <= fault_start + timedelta(seconds=60 + 2 * 30)
    assert fault_end < datetime.fromisoformat(lines[2]["at"]) <= fault_end + timedelta(seconds=90)
    # The last minutes hold only healthy traffic: nothing fires, exit 0.
    quiet = runner.invoke(app, ["test", str(rules), "--since", "4m", "--store", store_url])
    assert quiet.exit_code == 0, quiet.output
    assert "0 alerts would have fired" in quiet.output


def test_cli_test_rejects_bad_since(tmp_path) -> None:
    result = CliRunner().invoke(app, ["test", "default", "--since", "an hour"])
    assert result.exit_code == 2
    assert "--since" in result.output
