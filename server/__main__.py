"""``python -m inferpath.server [--host H] [--port P] [--store URL] [--scrape SOURCE=URL ...]``:
the server alone in the foreground: what ``inferpath up`` runs, without the dashboard and
without the services wired in above the server (alert evaluation: ``python -m
inferpath.serve`` runs this with them)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from pydantic import ValidationError

from inferpath.analysis.objectives import load_objectives
from inferpath.config import (
    ENV_HOST,
    ENV_MAX_BODY_BYTES,
    ENV_PORT,
    ENV_SCRAPE_TARGETS,
    ENV_STORE,
    ENV_TOKEN,
    ENV_TTL_DAYS,
    Settings,
    describe_invalid_settings,
)
from inferpath.ratelimited_log import configure_logging
from inferpath.server.runtime import ListenError, StoreOpenError, serve_forever
from inferpath.server.services import BackgroundService


def main(
    argv: list[str] | None = None,
    *,
    services_for: Callable[[Settings], Sequence[BackgroundService]] | None = None,
    prog: str = "python -m inferpath.server",
) -> int:
    """Parse ``argv``, build the settings, serve until SIGINT/SIGTERM. ``services_for``: the
    services to run over the settings (none by default). Returns 0 after a clean stop, 1
    when the address or the store cannot be used, 2 for invalid configuration (a
    ``ValueError`` of ``services_for`` included, e.g. a bad alert rule file)."""
    defaults = Settings.model_fields
    parser = argparse.ArgumentParser(
        prog=prog,
        description=("The inferpath server alone" if services_for is None else "The inferpath server")
        + ": OTLP/HTTP receiver, request assembly, read API. Each flag overrides its INFERPATH_*"
        " variable.",
        epilog=f"Other settings come from the environment only, e.g. {ENV_TOKEN} (a bearer token that ingest,"
        f" reads and /metrics then require), {ENV_MAX_BODY_BYTES} (413 above it, default"
        f" {defaults['max_body_bytes'].default} bytes), {ENV_TTL_DAYS}; all of them: the Settings class in"
        " inferpath/config.py.",
    )
    parser.add_argument(
        "--host", default=None, help=f"listen address (default {ENV_HOST} or {defaults['host'].default})"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"listen port (default {ENV_PORT} or {defaults['port'].default}; 0: any free port)",
    )
    parser.add_argument(
        "--store",
        default=None,
        help=f"chdb:///path or http(s)://host:port/db (default {ENV_STORE} or embedded chDB in the user data folder)",
    )
    parser.add_argument(
        "--scrape",
        action="append",
        default=None,
        help="scrape target SOURCE=URL, e.g. vllm=http://127.0.0.1:8000/metrics (repeatable;"
        f" default {ENV_SCRAPE_TARGETS} or none)",
    )
    args = parser.parse_args(argv)
    overrides: dict[str, object] = {"host": args.host, "port": args.port, "store_url": args.store}
    if args.scrape:
        overrides["scrape_targets"] = ",".join(args.scrape)
    try:
        settings = Settings.from_env(None, **overrides)  # environ: the process environment
    except ValidationError as exc:
        flags = {"host": "--host", "port": "--port", "store_url": "--store", "scrape_targets": "--scrape"}
        for line in describe_invalid_settings(exc, {f: flags[f] for f, v in overrides.items() if v is not None}):
            print(f"invalid configuration: {line}", file=sys.stderr)
        return 2
    try:
        services = services_for(settings) if services_for is not None else ()
        load_objectives(settings.objectives_file)  # else every diagnosis answers 500 naming it
    except ValueError as exc:
        print(f"invalid configuration: {exc}", file=sys.stderr)
        return 2
    configure_logging()
    try:
        serve_forever(settings, services)
    except ListenError as exc:  # the address is taken or not ours: say which, without a traceback
        print(exc.strerror, file=sys.stderr)
        return 1
    except StoreOpenError as exc:  # a path that cannot be made, a server that refuses, a folder in use
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
