"""``inferpath alerts``: lint a rule file, and replay it over past data.

Exit codes: 0 fine (``check``: valid; ``test``: nothing would have fired), 1 ``test``: some
alert would have fired, 2 bad usage, an invalid rule file or an unreachable store.

``test`` reads the store directly (``--store`` or ``INFERPATH_STORE``): a ClickHouse server
at any time; an embedded chDB folder only while no inferpath server holds it.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import Optional

import typer
from rich.console import Console

from inferpath.cli_app import new_app

app = new_app(help="Alert rules: lint them, and see what they would have done over past data.")
console = Console()
err_console = Console(stderr=True)
# A replay evaluates every rule once per step; each evaluation reads the store (tens of ms).
MAX_REPLAY_EVALUATIONS = 20_000
MAX_REPLAY_SECONDS = 3650 * 86_400  # the longest retention a table can have (ttl_days)


def _load(file: str):  # type: ignore[no-untyped-def]
    from inferpath.alerts.rules import RuleFileError, load_rule_file

    try:
        return load_rule_file(file)
    except RuleFileError as exc:
        console.print(f"[red]invalid rule file[/] ({len(exc.problems)} problems):", highlight=False)
        for line in str(exc).splitlines():
            console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2) from exc


@app.command()
def check(file: str = typer.Argument(..., help="Rule file (YAML), or 'default' for the shipped pack.")) -> None:
    """Validate a rule file; print its rules. Exit 0 valid, 2 invalid (each problem with file:line: field)."""
    rule_file = _load(file)
    console.print(f"{file}: {len(rule_file.rules)} rules, evaluated every {rule_file.evaluation_interval:g} s",
                  highlight=False, soft_wrap=True)
    for rule in rule_file.rules:
        console.print(f"  {rule.name}  kind={rule.kind} class={rule.endpoint_class or 'all'} window={rule.window:g}s "
                      f"for={rule.for_:g}s keep_firing_for={rule.keep_firing_for:g}s",
                      highlight=False, markup=False, soft_wrap=True)
    receivers = ", ".join(f"{r.name} ({r.type})" for r in rule_file.receivers) or "log (default)"
    console.print(f"receivers: {receivers}", highlight=False, markup=False, soft_wrap=True)


def _duration(text: str, option: str) -> float:
    from inferpath.timespec import parse_duration_seconds

    try:
        seconds = parse_duration_seconds(text)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        console.print(f"[red]{option} must be a positive duration like 15m, 1h or 90s; got {text!r}")
        raise typer.Exit(2)
    return seconds


@app.command()
def test(
    file: str = typer.Argument(..., help="Rule file (YAML), or 'default'."),
    since: str = typer.Option("1h", help="How far back to replay, ending now (e.g. 30m, 1h, 1d)."),
    step: Optional[str] = typer.Option(None, help="Evaluation step (default: the file's evaluation_interval)."),
    store: Optional[str] = typer.Option(None, help="Store URL (default INFERPATH_STORE or the embedded default)."),
    json_output: bool = typer.Option(False, "--json", help="Print the transitions as JSON lines."),
) -> None:
    """Replay the rules over past data: which alerts would have gone pending, fired and resolved."""
    import json

    from pydantic import ValidationError

    from inferpath.alerts.evaluator import backtest
    from inferpath.config import Settings
    from inferpath.storage.store import Store

    rule_file = _load(file)
    window = _duration(since, "--since")
    step_seconds = _duration(step, "--step") if step else None
    evaluations = math.ceil(window / (step_seconds or rule_file.evaluation_interval))
    if window > MAX_REPLAY_SECONDS or evaluations > MAX_REPLAY_EVALUATIONS:
        console.print(f"[red]--since {since} with a step of {step_seconds or rule_file.evaluation_interval:g} s is "
                      f"{evaluations} evaluations over {window / 86_400:g} days;[/] at most "
                      f"{MAX_REPLAY_EVALUATIONS} over {MAX_REPLAY_SECONDS // 86_400} days (the store's longest "
                      "retention): shorten --since or lengthen --step", highlight=False)
        raise typer.Exit(2)
    if not json_output:
        err_console.print(f"replaying {evaluations} evaluations (one per "
                          f"{step_seconds or rule_file.evaluation_interval:g} s of the last {since})…",
                          highlight=False)
    try:
        settings = Settings.from_env(store_url=store)
    except ValidationError as exc:
        console.print(f"[red]invalid configuration:[/] {exc}")
        raise typer.Exit(2) from exc
    try:
        opened = Store.open(settings.store_url)
    except Exception as exc:  # noqa: BLE001 - any store failure is exit 2 with its reason
        console.print(f"[red]cannot open the store:[/] {exc}", highlight=False)
        raise typer.Exit(2) from exc
    end = datetime.now(timezone.utc)
    try:
        transitions = backtest(rule_file, opened, end - timedelta(seconds=window), end, step_seconds)
    finally:
        opened.close()
    fired = [t for t in transitions if t.change == "firing"]
    if json_output:
        for t in transitions:
            print(json.dumps({"at": t.at.isoformat(), "rule": t.rule, "labels": t.labels, "change": t.change,
                              "value": t.value, "reason": t.reason}))
    else:
        from rich.table import Table

        table = Table(title=f"what the rules would have done over the last {since}")
        for column in ("time (UTC)", "rule", "labels", "change", "value", "why"):
            table.add_column(column)
        for t in transitions:
            labels = ", ".join(f"{k}={v}" for k, v in t.labels.items() if k != "alertname")
            table.add_row(t.at.strftime("%Y-%m-%d %H:%M:%S"), t.rule, labels, t.change,
                          "" if t.value is None else f"{t.value:.4g}", t.reason)
        console.print(table if transitions else "no alert would have gone pending or fired")
        console.print(f"{len(fired)} alerts would have fired", highlight=False)
    raise typer.Exit(1 if fired else 0)


__all__ = ["app", "check", "test"]
