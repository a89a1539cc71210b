"""``inferpath alerts``: check a rule file, and replay it over past data.

Exit codes: 0 fine (``check``: valid; ``test``: nothing would have fired), 1 ``test``: some
alert would have fired, 2 bad usage, an invalid rule file or no server and no store.

``test`` asks a server's read API (``POST /api/v1/alerts/backtest``) to replay the rules over
its store, as ``inferpath diagnose`` does (:mod:`inferpath.server_access`): the server at
``--server`` (default ``INFERPATH_SERVER_URL``), so it runs while ``inferpath up`` holds the
store; with ``--store``, or when no server answers and the default embedded store exists, a
server started in this process over that store.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import typer

from inferpath.cli_app import console, err_console, new_app

app = new_app(help="Alert rules: check them, and see what they would have done over past data.")


def _load(file: str):
    from inferpath.alerts.rules import RuleFileError, load_rule_file

    try:
        return load_rule_file(file)
    except RuleFileError as exc:
        count = len(exc.problems)
        err_console.print(f"[red]invalid rule file[/] ({count} problem{'s' if count != 1 else ''}):", highlight=False)
        for line in str(exc).splitlines():
            err_console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2) from exc


@app.command()
def check(file: str = typer.Argument(..., help="Rule file (YAML), or 'default' for the shipped pack.")) -> None:
    """Validate a rule file; print its rules. Exit 0 valid, 2 invalid (each problem with file:line: field)."""
    rule_file = _load(file)
    console.print(
        f"{file}: {len(rule_file.rules)} rules, evaluated every {rule_file.evaluation_interval:g} s",
        highlight=False,
        soft_wrap=True,
    )
    for rule in rule_file.rules:
        console.print(
            f"  {rule.name}  kind={rule.kind} class={rule.endpoint_class or 'all'} window={rule.window:g}s "
            f"for={rule.for_:g}s keep_firing_for={rule.keep_firing_for:g}s",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    receivers = ", ".join(f"{r.name} ({r.type})" for r in rule_file.receivers) or "log (default)"
    console.print(f"receivers: {receivers}", highlight=False, markup=False, soft_wrap=True)


def _duration(text: str, option: str) -> float:
    from inferpath.timespec import positive_duration_seconds

    try:
        return positive_duration_seconds(text, option)
    except ValueError as exc:
        err_console.print(str(exc), style="red", highlight=False, markup=False)
        raise typer.Exit(2) from None


def _replay_window(since: str | None, from_: str | None, to: str | None) -> tuple[datetime, datetime, str, str]:
    """``(start, end, words, options)`` of the replay: ``--since`` ending now (default 1h), or
    ``--from`` to ``--to`` (default now); ``words`` says the window, ``options`` the flags that
    set it. Exits 2 naming the option for a bad or mixed window."""
    from inferpath.timespec import command_window

    if from_ is None and to is not None:
        err_console.print("[red]--to needs --from (or use --since for a window ending now)")
        raise typer.Exit(2)
    try:
        start, end = command_window(since=since, from_=from_, to=to, default_since="1h", now=datetime.now(timezone.utc))
    except ValueError as exc:
        err_console.print(str(exc), style="red", highlight=False, markup=False)
        raise typer.Exit(2) from None
    if from_ is None:
        return start, end, f"the last {since or '1h'}", "--since"
    return start, end, f"{start.isoformat()} to {end.isoformat()}", "--from/--to"


@app.command()
def test(
    file: str = typer.Argument(..., help="Rule file (YAML), or 'default'."),
    since: str | None = typer.Option(
        None, help="How far back to replay, ending now (e.g. 30m, 1h, 1d; default 1h when --from is not given)."
    ),
    from_: str | None = typer.Option(
        None, "--from", help="Replay from: ISO-8601 with offset, -30m, now or Unix seconds (a recording's window)."
    ),
    to: str | None = typer.Option(None, "--to", help="Replay until (default now; with --from)."),
    step: str | None = typer.Option(None, help="Evaluation step (default: the file's evaluation_interval)."),
    server: str | None = typer.Option(None, help="inferpath server URL (default INFERPATH_SERVER_URL)."),
    store: str | None = typer.Option(
        None, help="Replay over this store directly instead of a server (chdb:///path or http://host:8123/db)."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the transitions as JSON lines."),
) -> None:
    """Replay the rules over past data: which alerts would have gone pending, fired and resolved.
    Exit 0 when none would have fired, 1 when some would have, 2 for a bad rule file or window."""
    import json

    from inferpath.alerts.rules import DEFAULT_RULES_PATH
    from inferpath.alerts.service import replay_evaluations
    from inferpath.server_access import ask, fail, refusal_text

    rule_file = _load(file)  # checked here first: its problems are named by file, line and field
    start, end, span, options = _replay_window(since, from_, to)
    step_seconds = _duration(step, "--step") if step else None
    every = step_seconds or rule_file.evaluation_interval
    try:
        evaluations = replay_evaluations((end - start).total_seconds(), every)
    except ValueError as exc:
        console.print(
            f"[red]{options}: {span} with a step of {every:g} s is {exc};[/] shorten {options} or lengthen --step",
            highlight=False,
        )
        raise typer.Exit(2) from exc
    path = DEFAULT_RULES_PATH if file == "default" else Path(file)
    body = {
        "rules": path.read_text(encoding="utf-8"),
        "source": str(path),
        "start": start.isoformat(),
        "end": end.isoformat(),
        "step_seconds": step_seconds,
    }
    response = ask(
        "POST",
        "/api/v1/alerts/backtest",
        server,
        store,
        json_output,
        json_body=body,
        timeout_seconds=3600.0,
        announce=None if json_output else f"replaying {evaluations} evaluations (one per {every:g} s of {span})…",
    )
    if response.status_code != 200:
        fail(f"cannot replay the rules: {refusal_text(response)}", json_output, http_status=response.status_code)
    transitions = response.json()["transitions"]
    fired = [t for t in transitions if t["change"] == "firing"]
    if json_output:
        for t in transitions:
            print(json.dumps({key: t[key] for key in ("at", "rule", "labels", "change", "value", "reason")}))
    else:
        from rich.table import Table

        table = Table(title=f"what the rules would have done over {span}")
        for column in ("time (UTC)", "rule", "labels", "change", "value", "why"):
            table.add_column(column, overflow="fold")  # a narrow terminal folds a rule name, never cuts it
        for t in transitions:
            labels = ", ".join(f"{k}={v}" for k, v in t["labels"].items() if k != "alertname")
            at = datetime.fromisoformat(t["at"]).astimezone(timezone.utc)
            table.add_row(
                at.strftime("%Y-%m-%d %H:%M:%S"),
                t["rule"],
                labels,
                t["change"],
                "" if t["value"] is None else f"{t['value']:.4g}",
                t["reason"],
            )
        if not transitions:
            console.print("no alert would have gone pending or fired")
        else:
            console.print(table)
            console.print(f"{len(fired)} alert{'' if len(fired) == 1 else 's'} would have fired", highlight=False)
    raise typer.Exit(1 if fired else 0)


__all__ = ["app", "check", "test"]
