"""``inferpath collect``: run the collection agent in the foreground until Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
import threading

import typer

from inferpath.config import ENV_SERVER_URL, ENV_TOKEN
from inferpath.ratelimited_log import configure_logging
from inferpath.vocabulary import SOURCES


def collect(
    nvml: bool = typer.Option(False, "--nvml/--no-nvml", help="Poll this machine's GPUs through NVML."),
    scrape: list[str] | None = typer.Option(
        None,
        "--scrape",
        metavar="SOURCE=URL",
        help="A Prometheus endpoint to scrape, e.g. dcgm=http://127.0.0.1:9400/metrics or "
        f"vllm=http://127.0.0.1:8000/metrics (repeatable; sources: {', '.join(SOURCES)}; a bare URL is "
        "vllm, as for inferpath up).",
    ),
    server: str = typer.Option(
        "http://127.0.0.1:4318", "--server", envvar=ENV_SERVER_URL, help="The inferpath server to push OTLP metrics to."
    ),
    interval_seconds: float = typer.Option(1.0, "--interval", min=0.05, help="Seconds between polls."),
    token: str | None = typer.Option(None, "--token", envvar=ENV_TOKEN, help="Bearer token of the server."),
) -> None:
    """Collect GPU and engine metrics on this node and push them to an inferpath server."""
    from inferpath.collectors.agent import parse_scrape_targets, run_agent

    targets = list(scrape or [])
    try:
        parse_scrape_targets(targets)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--scrape") from None
    if not server.startswith(("http://", "https://")):
        raise typer.BadParameter(
            f"expected the inferpath server's http(s) URL, e.g. http://127.0.0.1:4318, got {server!r}",
            param_hint=f"--server (or {ENV_SERVER_URL})",
        )
    if not nvml and not targets:
        raise typer.BadParameter(
            "nothing to collect: pass --nvml and/or --scrape SOURCE=URL", param_hint="--nvml / --scrape"
        )
    configure_logging()
    stop = threading.Event()
    # Both signals only set the stop event, so the agent exports what it buffered before exiting.
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    typer.echo(f"collecting every {interval_seconds:g} s -> {server}/v1/metrics (Ctrl-C stops)")
    try:
        stats = run_agent(
            server, nvml=nvml, scrape_targets=targets, interval_seconds=interval_seconds, token=token, stop_event=stop
        )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    typer.echo(f"sent {stats.samples_sent_total} samples, dropped {stats.samples_dropped_total}")
