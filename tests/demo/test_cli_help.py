"""`--help` of every command, as a new user reads it in a pipe or a log: flags carry no type
label (they take no value), and descriptions wrap rather than being cut off."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import click
import pytest
import typer

from inferpath.cli import app

COMMANDS = [
    ["demo"],
    ["up"],
    ["collect"],
    ["diagnose"],
    ["import"],
    ["whatif"],
    ["replay"],
    ["alerts", "check"],
    ["alerts", "test"],
]


def _help(command: list[str]) -> str:
    # A subprocess with its output in a pipe: no terminal, as `inferpath up --help | less`.
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH", "FORCE_COLOR")}
    done = subprocess.run(
        [sys.executable, "-m", "inferpath.cli", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _options(command: list[str]) -> list[click.Option]:
    group = typer.main.get_command(app)
    ctx = click.Context(group)
    for name in command:
        group = group.get_command(ctx, name)  # type: ignore[union-attr]
    return [p for p in group.params if isinstance(p, click.Option)]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_flags_show_no_type_and_values_do(command: list[str]) -> None:
    text = _help(command)
    for option in _options(command):
        names = [*option.opts, *option.secondary_opts]
        line = next((line for line in text.splitlines() if re.search(rf"(^|\s){re.escape(names[0])}\b", line)), None)
        assert line is not None, f"{names[0]} missing from:\n{text}"
        if option.is_flag:
            assert "<bool>" not in line and "BOOLEAN" not in line, line
        else:
            assert "<" in line or option.metavar, line
    assert "<bool>" not in text


def test_help_in_a_pipe_wraps_instead_of_cutting_words() -> None:
    text = _help(["up"])
    assert "…" not in text
    flat = " ".join(text.split())
    assert "chdb:///path or http(s)://host:port/db" in flat
    assert "'default' or 'off' (default INFERPATH_ALERT_RULES, else off)" in flat
    for command in COMMANDS:
        assert "…" not in _help(command), command
    for group in ([], ["alerts"]):
        listing = _help(group).split("Commands:")[1]
        assert "…" not in listing and "..." not in listing, listing
    assert "(scrapes with their times, OTLP" in " ".join(_help([]).split())


def test_a_table_printed_into_a_pipe_keeps_its_cells_whole() -> None:
    # `inferpath alerts test default --since 1h | less`: rich lays a table out in 80 columns
    # when its output is not a terminal and cuts cells with an ellipsis; the CLI's consoles
    # take 200 there, and COLUMNS where the user sets it.
    script = (
        "from rich.table import Table\n"
        "from inferpath.cli_app import console\n"
        "table = Table('rule', 'why')\n"
        "table.add_row('QueueDepthGrowing', 'queue depth 69, trend +244.3 per 300 s (least-squares slope)')\n"
        "console.print(table)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH", "FORCE_COLOR")}
    piped = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert piped.returncode == 0, piped.stderr
    assert "QueueDepthGrowing" in piped.stdout and "(least-squares slope)" in piped.stdout, piped.stdout
    narrow = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env={**env, "COLUMNS": "30"}
    )
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 30, narrow.stdout
