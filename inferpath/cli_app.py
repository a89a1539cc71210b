"""The one way inferpath builds a Typer app, so that every command's ``--help`` reads alike,
and the one way a command reads its settings (:func:`command_settings`).

Help is printed by click's plain formatter, not by Typer's rich panels. The rich panels of
Typer 0.29 put a type label after every option, flags included (``--help <bool>``), so a
flag looks as if it took a value; and when the output is not a terminal (a pipe, a log, CI)
they lay the options out in a fixed 80-column table that cuts long descriptions mid-word
(``http(s)://host:por…``). Click's formatter prints flags bare, options that take a value
with their type (``--store <str>``), and wraps every description at the terminal's width
(80 columns in a pipe, at most :data:`HELP_WIDTH_MAX`), never cutting one; the list of
commands gives each one's first sentence whole (:class:`WrappingGroup`).

Commands print their answer through :data:`console` (stdout) and their errors through
:data:`err_console` (stderr), so that ``> file`` keeps no error as its content; with
``--json`` an error is ``{"error": ...}`` on stdout, for scripts. In a pipe, rich lays a table
out in 80 columns and cuts its cells with an ellipsis (``QueueDepthG…``); there the consoles
take :data:`PIPED_WIDTH` columns instead, unless ``COLUMNS`` says otherwise.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

if TYPE_CHECKING:
    from inferpath.config import Settings

HELP_WIDTH_MAX = 120
"""Columns of help text on a wide terminal (click's default is 80)."""
PIPED_WIDTH = 200
"""Columns of a command's output when it is not a terminal and ``COLUMNS`` is not set."""


def make_console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr) that is :data:`PIPED_WIDTH` wide in a pipe."""
    made = Console(stderr=stderr)
    if not made.is_terminal and not os.environ.get("COLUMNS"):
        made.width = PIPED_WIDTH
    return made


console = make_console()
err_console = make_console(stderr=True)


class WrappingGroup(TyperGroup):
    """A command group whose command list wraps each command's summary (its help's first
    sentence) instead of cutting it to one line with ``...`` as click does."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        # ``ctx`` and ``formatter`` are the Context and HelpFormatter of the click that Typer
        # vendors (``typer._click``), which has no public name to annotate with.
        rows = [
            (name, command.get_short_help_str(limit=10_000))
            for name in self.list_commands(ctx)
            if (command := self.get_command(ctx, name)) is not None and not command.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def new_app(*, help: str, **settings: Any) -> typer.Typer:
    """A Typer app (the root ``inferpath`` or a command group such as ``inferpath alerts``)
    with inferpath's help settings; ``settings`` go to :class:`typer.Typer` as they are."""
    return typer.Typer(
        cls=WrappingGroup,
        add_completion=False,
        no_args_is_help=True,
        rich_markup_mode=None,
        context_settings={"max_content_width": HELP_WIDTH_MAX},
        help=help,
        **settings,
    )


# Settings fields whose command-line option is not named after the field.
_OPTION_OF_FIELD = {
    "store_url": "--store",
    "server_url": "--server",
    "alert_rules": "--alerts",
    "scrape_targets": "--scrape",
}


def command_settings(*, json_output: bool = False, **overrides: Any) -> Settings:
    """Settings from ``INFERPATH_*`` and the command's options (``overrides``: settings field →
    the option's value, ``None`` when not given). On an invalid value, prints one line per
    problem naming its flag (the command's own options) or ``INFERPATH_*`` variable (with
    ``json_output``: ``{"error": ...}`` on stdout, the lines joined by "; ") and exits 2."""
    import json

    from pydantic import ValidationError

    from inferpath.config import Settings, describe_invalid_settings

    try:
        return Settings.from_env(**overrides)
    except ValidationError as exc:
        # The command's own options are the fields it passed; their flags:
        flags = {field: _OPTION_OF_FIELD.get(field, f"--{field.replace('_', '-')}") for field in overrides}
        lines = describe_invalid_settings(exc, flags)
        if json_output:
            print(json.dumps({"error": "invalid configuration: " + "; ".join(lines)}))
        for line in [] if json_output else lines:
            err_console.print(f"[red]invalid configuration:[/] {line}", soft_wrap=True)
        raise typer.Exit(2) from exc
