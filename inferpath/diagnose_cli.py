"""``inferpath diagnose`` and ``inferpath import``: verdicts for any window, live or recorded.

Both talk to a server's HTTP API (:mod:`inferpath.server_access`): the one at ``--server``
(default ``INFERPATH_SERVER_URL``), or, with ``--store`` (and for ``diagnose`` when no server
answers and the default embedded store exists), a server started in this process over that
store.

Exit codes (scripts can trust them): ``diagnose`` 0 healthy, 1 degraded, 2 no verdict
(bad usage, insufficient data, no server); ``import`` 0 imported, 2 otherwise.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import typer

from inferpath.cli_app import command_settings
from inferpath.server_access import ask, console, fail, refusal_text, server_for, shown_store_url
from inferpath.vocabulary import SOURCES, share_basis


def diagnose(
    since: str | None = typer.Option(
        None, help="Window ending now, e.g. 15m or 1h30m (default 15m when --from is not given)."
    ),
    from_: str | None = typer.Option(
        None, "--from", help="Window start: ISO-8601 with offset, -30m, now or Unix seconds."
    ),
    to: str | None = typer.Option(None, "--to", help="Window end (default now)."),
    baseline: str | None = typer.Option(
        None, help="Also compare with the window of this length just before (e.g. 15m)."
    ),
    baseline_from: str | None = typer.Option(None, "--baseline-from", help="Baseline start (with --baseline-to)."),
    baseline_to: str | None = typer.Option(None, "--baseline-to", help="Baseline end."),
    endpoint: str | None = typer.Option(None, help="Only this endpoint (route)."),
    objectives: Path | None = typer.Option(
        None,
        help="YAML file of latency objectives per endpoint "
        "class (default INFERPATH_OBJECTIVES_FILE, else "
        "interactive TTFT p99 1 s, bulk 10 s).",
    ),
    ttft_p99: float | None = typer.Option(
        None, "--ttft-p99", min=0.001, help="TTFT p99 objective in seconds, every class."
    ),
    itl_p99: float | None = typer.Option(
        None, "--itl-p99", min=0.0001, help="ITL p99 objective in seconds, every class."
    ),
    json_output: bool = typer.Option(False, "--json", help='Print the verdict as JSON (an error as {"error": ...}).'),
    server: str | None = typer.Option(None, help="inferpath server URL (default INFERPATH_SERVER_URL)."),
    store: str | None = typer.Option(
        None, help="Read this store directly instead of a server (chdb:///path or http://host:8123/db)."
    ),
) -> None:
    """Name the bottleneck of a window against the latency objectives, and against a baseline
    when given. Exit 0 healthy, 1 degraded, 2 no verdict."""
    from inferpath.timespec import command_window, parse_time, positive_duration_seconds

    now = datetime.now(timezone.utc)

    def when(text: str, option: str) -> datetime:
        try:
            return parse_time(text, now=now)
        except ValueError as exc:
            fail(f"{option}: {exc}", json_output)
            raise

    def seconds(text: str, option: str) -> float:
        try:
            return positive_duration_seconds(text, option)
        except ValueError as exc:
            fail(str(exc), json_output)
            raise

    try:
        start, end = command_window(since=since, from_=from_, to=to, default_since="15m", now=now)
    except ValueError as exc:
        fail(str(exc), json_output)
        raise
    params: dict[str, Any] = {"start": start.isoformat(), "end": end.isoformat()}
    if baseline and (baseline_from or baseline_to):
        fail("give --baseline or --baseline-from/--baseline-to, not both", json_output)
    if baseline:
        length = seconds(baseline, "--baseline")
        params |= {"baseline_start": (start - timedelta(seconds=length)).isoformat(), "baseline_end": start.isoformat()}
    elif baseline_from or baseline_to:
        if not (baseline_from and baseline_to):
            fail("give --baseline-from and --baseline-to together", json_output)
        base_start, base_end = when(baseline_from, "--baseline-from"), when(baseline_to, "--baseline-to")
        if base_end <= base_start:
            fail(
                f"--baseline-to must be after --baseline-from (from {base_start.isoformat()}, "
                f"to {base_end.isoformat()})",
                json_output,
            )
        params |= {"baseline_start": base_start.isoformat(), "baseline_end": base_end.isoformat()}
    if endpoint:
        params["endpoint"] = endpoint
    if objectives is not None:
        import yaml

        from inferpath.analysis.objectives import load_objectives

        try:
            load_objectives(objectives)  # validated here, so a bad file is named before any request
            params["objectives"] = json.dumps(yaml.safe_load(objectives.read_text(encoding="utf-8")) or {})
        except ValueError as exc:
            fail(str(exc), json_output)
    if ttft_p99 is not None:
        params["ttft_p99_seconds"] = ttft_p99
    if itl_p99 is not None:
        params["itl_p99_seconds"] = itl_p99
    response = ask("GET", "/api/v1/diagnosis", server, store, json_output, params=params, timeout_seconds=120.0)
    if response.status_code != 200:
        message = refusal_text(response)
        hint = (
            ""
            if "insufficient data" not in message
            else "\nwiden the window (--since 1h, --from/--to) or check that requests reach the server "
            "(inferpath up; GET /api/v1/summary)"
        )
        fail(f"no verdict: {message}{hint}", json_output, http_status=response.status_code)
    verdict = response.json()
    if json_output:
        print(json.dumps(verdict, indent=2))
    else:
        print_verdict(verdict)
    raise typer.Exit(0 if verdict.get("healthy") else 1)


def print_verdict(verdict: dict[str, Any]) -> None:
    """The verdict for a person: the one-line summary, the causes with their evidence and
    advice, the budget, and what could not be judged."""
    from rich.table import Table

    style = "green" if verdict.get("healthy") else "red"
    console.print(f"[bold {style}]{verdict.get('summary', '')}[/]", soft_wrap=True, highlight=False)
    if verdict.get("causes"):
        basis = share_basis(verdict.get("basis"), verdict.get("source"))
        table = Table(title=f"causes, by share of the {basis}")
        for column in ("cause", "share", "evidence", "would help", "would not help"):
            table.add_column(column, overflow="fold")  # a narrow terminal folds a cause's name, never cuts it
        for cause in verdict["causes"]:
            # A cause of failures alone (a replica's start) has no time: its share is of the failed requests.
            of_failed = not cause.get("added_ns") and any(
                e.get("measure") == "failed_requests" for e in cause.get("evidence", [])
            )
            table.add_row(
                cause["cause"],
                f"{min(1.0, max(0.0, cause['share'])) * 100:.0f}%" + (" of the failed requests" if of_failed else ""),
                "\n".join(e["text"] for e in cause.get("evidence", [])),
                "\n".join(cause.get("would_help", [])),
                "\n".join(cause.get("would_not_help", [])),
            )
        console.print(table)
    budget = verdict.get("budget")
    if budget:
        console.print(f"budget: {budget.get('text', '')}", soft_wrap=True, highlight=False)
    for note in verdict.get("notes", []):
        console.print(f"note: {note}", soft_wrap=True, highlight=False)


def import_cmd(
    path: Path = typer.Argument(
        ...,
        help="A recording: a folder (metrics_<unix_ns>.prom scrapes, otlp/*.pb "
        "bodies), a .tar.gz of one, or an exposition with timestamps.",
    ),
    server: str | None = typer.Option(
        None,
        help="Post to this running inferpath server (default: INFERPATH_SERVER_URL, else http://127.0.0.1:4318).",
    ),
    store: str | None = typer.Option(
        None, help="Import into this store directly (chdb:///path; an embedded store is created if missing)."
    ),
    shift: str = typer.Option(
        "auto",
        help="auto: move the times to now only when the recording is older than "
        "the store keeps data; now: always; none: never.",
    ),
    source: str | None = typer.Option(
        None, help=f"Collector source of the scrapes ({', '.join(SOURCES)}; default: recognised)."
    ),
    json_output: bool = typer.Option(
        False, "--json", help="Print what was imported (counts, the window, the shift) as JSON."
    ),
) -> None:
    """Load a recorded incident (scrapes with their times, OTLP trace bodies) so that
    `inferpath diagnose` can judge it afterwards."""
    import tempfile

    if shift not in ("auto", "now", "none"):
        fail(f"--shift must be auto, now or none; got {shift!r}", json_output)
    if source is not None and source not in SOURCES:  # before anything is read or written
        fail(f"--source must be one of {', '.join(SOURCES)}; got {source!r}", json_output)
    with tempfile.TemporaryDirectory(prefix="inferpath-recording-") as unpacked:  # an archive's copy, removed
        _import(path, Path(unpacked), server, store, shift, source, json_output)


def _import(
    path: Path,
    unpacked: Path,
    server: str | None,
    store: str | None,
    shift: str,
    source: str | None,
    json_output: bool = False,
) -> None:
    import time

    import httpx

    from inferpath.collectors.recording import (
        RecordingError,
        choose_offset_ns,
        open_recording,
        post_import,
        prepare_import,
    )

    settings = command_settings(json_output=json_output, server_url=server, store_url=store)
    # Every file is read and checked before a store is opened or a body posted: a bad file
    # leaves no partial import and no new store folder.
    try:
        recording = open_recording(path, workdir=unpacked)
        offset = choose_offset_ns(recording, ttl_days=settings.ttl_days, now_ns=time.time_ns(), shift=shift)
        prepared = prepare_import(recording, offset_ns=offset, source=source)
    except RecordingError as exc:
        fail(f"cannot read the recording: {exc}", json_output)
    with server_for(server, store, fallback_to_default_store=False, json_output=json_output, create_store=True) as (
        url,
        headers,
    ):
        with httpx.Client(base_url=url, headers=headers, timeout=120.0) as client:
            try:
                result = post_import(prepared, client)
            except (RecordingError, httpx.HTTPError) as exc:
                fail(f"import failed: {exc}", json_output)
    if not result.flushed:
        fail(
            f"posted {result.scrapes} scrapes and {result.trace_bodies} trace bodies, but the server did not finish "
            "storing everything in time; run the command again (nothing is stored twice)",
            json_output,
        )
    if json_output:
        print(
            json.dumps(
                {
                    "scrapes": result.scrapes,
                    "source": result.source,
                    "trace_bodies": result.trace_bodies,
                    "skipped_scrapes": len(prepared.unrecognised_scrapes),
                    "shift_seconds": offset / 1e9,
                    "start": result.start.isoformat() if result.start else None,
                    "end": result.end.isoformat() if result.end else None,
                }
            )
        )
        return
    console.print(
        f"imported {result.scrapes} scrapes ({result.source or 'no known engine'}) and "
        f"{result.trace_bodies} trace bodies into {shown_store_url(store) if store else url}",
        highlight=False,
    )
    if prepared.unrecognised_scrapes:
        skipped = prepared.unrecognised_scrapes
        console.print(
            f"skipped {len(skipped)} scrapes with no metric of a known source (the first recorded at "
            f"{datetime.fromtimestamp(skipped[0] / 1e9, tz=timezone.utc).isoformat()}); give --source if they "
            "are an engine's under other names",
            soft_wrap=True,
            highlight=False,
        )
    if offset:
        why = "--shift now" if shift == "now" else "the recording is older than the store keeps data"
        console.print(f"times moved by {offset / 1e9:+.0f} s ({why})", highlight=False)
    if result.start and result.end:
        # Where the data went: the store, or a server the user named (the default one needs no flag).
        where = f" --store {shown_store_url(store)}" if store else (f" --server {url}" if server else "")
        console.print(
            f"diagnose it: inferpath diagnose --from {result.start.isoformat()} --to {result.end.isoformat()}{where}",
            soft_wrap=True,
            highlight=False,
        )


__all__ = ["diagnose", "import_cmd", "print_verdict"]
