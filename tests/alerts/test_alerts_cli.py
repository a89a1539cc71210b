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
    said = " ".join(quiet.output.split())
    assert said.endswith("no alert would have gone pending or fired") and "would have fired" not in said, said


def test_cli_test_rejects_bad_since(tmp_path) -> None:
    result = CliRunner().invoke(app, ["test", "default", "--since", "an hour"])
    assert result.exit_code == 2
    assert "--since" in result.output


def test_cli_refuses_a_replay_too_long_to_run_before_opening_the_store(tmp_path) -> None:
    store = tmp_path / "never-opened"
    result = CliRunner().invoke(
        app, ["test", "default", "--since", "100000d", "--step", "1d", "--store", f"chdb://{store}"]
    )
    assert result.exit_code == 2
    assert "100000 evaluations" in result.output and "shorten --since" in result.output
    many = CliRunner().invoke(app, ["test", "default", "--since", "30d", "--step", "15s", "--store", f"chdb://{store}"])
    assert many.exit_code == 2 and "172800 evaluations" in many.output
    assert not store.exists()


def test_cli_check_names_a_rule_file_that_is_not_text(tmp_path) -> None:
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\x00\xff\xfe")
    result = CliRunner().invoke(app, ["check", str(binary)])
    assert result.exit_code == 2
    assert "bin.yaml: not UTF-8 text: byte 0xff at offset 1" in result.output
    assert "(1 problem):" in result.output
    missing = CliRunner().invoke(app, ["check", str(tmp_path / "nosuch.yaml")])
    said = " ".join(missing.output.split())
    assert missing.exit_code == 2 and "nosuch.yaml: cannot read: No such file or directory" in said, said


def test_cli_test_replays_a_window_given_by_its_bounds(store_url: str, tmp_path) -> None:
    # A recording's window, long past: --from/--to replay exactly it.
    t0 = (datetime.now(timezone.utc) - timedelta(days=2)).replace(second=0, microsecond=0)
    fault_start = t0 + (FAULT_START - T0)
    with Store.open(store_url, ttl_days=3650) as store:
        insert_requests(store, batch_window_traffic(t0))
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    end = t0 + timedelta(minutes=16)
    args = ["test", str(rules), "--from", t0.isoformat(), "--to", end.isoformat(), "--step", "30s"]
    result = CliRunner().invoke(app, [*args, "--store", store_url, "--json"])
    assert result.exit_code == 1, result.output
    lines = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert [line["change"] for line in lines] == ["pending", "firing", "resolved"]
    assert fault_start < datetime.fromisoformat(lines[1]["at"]) <= fault_start + timedelta(seconds=60 + 2 * 30)
    for bad, said in (
        (["--from", t0.isoformat(), "--since", "1h"], "give --since or --from, not both"),
        (["--to", end.isoformat()], "--to needs --from"),
        (["--from", end.isoformat(), "--to", t0.isoformat()], "--to must be after --from"),
        (["--from", "yesterday"], "--from:"),
    ):
        refused = CliRunner().invoke(app, ["test", str(rules), *bad, "--store", store_url])
        assert refused.exit_code == 2 and said in refused.output, (bad, refused.output)


def test_cli_test_says_it_replays_only_once_a_server_answers() -> None:
    import socket

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    result = CliRunner().invoke(app, ["test", "default", "--since", "10m", "--server", url])
    assert result.exit_code == 2, result.output
    assert "replaying" not in result.output and url in " ".join(result.output.split()), result.output
