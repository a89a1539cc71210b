"""How a command reaches the read API: the server at ``--server``, or one it starts over a store.

The server at ``--server`` (default ``INFERPATH_SERVER_URL``) is asked; with ``--store``
(and, for commands that allow it, when no server answers and the default embedded store
exists) a server is started in this process on a free loopback port over that store, with
the services of :func:`inferpath.serve.server_services` (answering, notifying no one), and
stopped when the command ends. An embedded chDB store is owned by one process, so that only
works while no other server holds it; the error then says which option to use instead.
``inferpath diagnose``, ``import``, ``whatif`` and ``alerts test`` all go this way.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from inferpath.cli_app import command_settings, console, err_console
from inferpath.storage.url import invalid_store_url, shown_store_url, store_open_failure

if TYPE_CHECKING:
    import httpx


def fail(message: str, json_output: bool = False, **extra: Any) -> NoReturn:
    """Print ``message`` (as ``{"error": message, **extra}`` on stdout with ``json_output``,
    for scripts) and exit 2."""
    if json_output:  # scripts read stdout: an error is JSON there too
        print(json.dumps({"error": message, **extra}))
    else:
        err_console.print(f"[red]{message}[/]", soft_wrap=True, highlight=False)
    raise typer.Exit(2)


SERVER_URL_EXAMPLE = "http://127.0.0.1:4318"


def store_in_use(folder: Path, advice: str) -> str:
    """The message for an embedded store another process holds, ending with ``advice``."""
    return f"the store at {folder} is in use by another process (an inferpath up?): {advice}"


@contextlib.contextmanager
def quiet_store_driver() -> Iterator[None]:
    """While inside, clickhouse-connect logs errors only: its warnings (a stray "Unexpected
    Http Driver Exception" before every failed request) say less than the message the
    command prints about the same failure."""
    driver = logging.getLogger("clickhouse_connect")
    level = driver.level
    driver.setLevel(logging.ERROR)
    try:
        yield
    finally:
        driver.setLevel(level)


def _check_server_url(url: str, option: str, json_output: bool) -> None:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url.strip())
        valid = parts.scheme.lower() in ("http", "https") and bool(parts.hostname) and (parts.port or 1) > 0
    except ValueError:  # an unbalanced IPv6 bracket, a port that is not a number
        valid = False
    if not valid:
        fail(
            f"{option}: expected an http(s) URL such as {SERVER_URL_EXAMPLE}, got {shown_store_url(url)!r}", json_output
        )


def check_store_folder(store: str, *, create: bool, in_use_hint: str, json_output: bool) -> None:
    """Fail on a store URL that does not parse, an embedded store that is not there (unless
    ``create``: a folder that does not exist, or one without chDB's ``metadata`` folder, which
    a read would turn into an empty store), a file where the folder should be, a folder of
    other files to create one in, or one that another process holds (``in_use_hint``: what
    to do then)."""
    from inferpath.storage.store import chdb_folder_in_use
    from inferpath.storage.url import parse_store_url

    try:
        parsed = parse_store_url(store)
    except ValueError as bad:
        fail(invalid_store_url(store, bad), json_output)
    if parsed.kind != "chdb" or parsed.path is None:
        return
    if not create and not (parsed.path / "metadata").is_dir():  # chDB keeps its table definitions there
        where = (
            "the folder does not exist"
            if not parsed.path.exists()
            else "it is a file, not a folder"
            if not parsed.path.is_dir()
            else "the folder holds no store"
        )
        fail(
            f"no store at {parsed.path} ({where}): check the path (inferpath up and inferpath import create one)",
            json_output,
        )
    if create and parsed.path.exists() and not parsed.path.is_dir():
        fail(f"{parsed.path} is a file, not a folder: give a new or empty folder for the store", json_output)
    if (
        create
        and parsed.path.is_dir()
        and not (parsed.path / "metadata").is_dir()
        and any(entry.name != "lost+found" for entry in parsed.path.iterdir())
    ):  # a mistyped path (a home folder, a project) would become a store among its files
        fail(
            f"{parsed.path} holds other files and no store: give a new or empty folder for the store "
            "(or the folder of an existing one)",
            json_output,
        )
    if parsed.path.exists() and chdb_folder_in_use(parsed.path):
        fail(store_in_use(parsed.path, in_use_hint), json_output)


@contextlib.contextmanager
def server_for(
    server: str | None,
    store: str | None,
    *,
    fallback_to_default_store: bool,
    json_output: bool = False,
    create_store: bool = False,
) -> Iterator[tuple[str, dict[str, str]]]:
    """Yield ``(base URL, headers)`` of the server to talk to (module docstring).

    An embedded store that does not exist is created only with ``create_store`` (commands
    that write, such as ``import``); a command that only reads refuses it, as it would
    otherwise answer from an empty store made at a mistyped path."""
    import httpx

    if server is not None and store is not None:
        fail(
            "give --server or --store, not both: --server reads through a running server, --store reads a store directly",
            json_output,
        )
    settings = command_settings(json_output=json_output, server_url=server, store_url=store)
    headers = {"Authorization": f"Bearer {settings.token}"} if settings.token else {}
    verb = "import it" if create_store else "read it"
    with quiet_store_driver():
        if store is None:
            url = settings.server_url.rstrip("/")
            _check_server_url(settings.server_url, "--server" if server else "INFERPATH_SERVER_URL", json_output)
            try:
                httpx.get(f"{url}/healthz", headers=headers, timeout=5.0)
                yield url, headers
                return
            except httpx.HTTPError as exc:
                from inferpath.storage.url import default_store_url, parse_store_url

                default = settings.store_url or default_store_url()
                try:
                    parsed = parse_store_url(default)
                except ValueError as bad:
                    fail(invalid_store_url(default, bad), json_output)
                folder = parsed.path if parsed.kind == "chdb" else None
                if server or not fallback_to_default_store or not folder or not Path(folder).exists():
                    fail(
                        f"cannot reach the inferpath server at {shown_store_url(url)} "
                        f"({str(exc).replace(url, shown_store_url(url))}). Start it with `inferpath up`, "
                        f"point --server at it, or {'import into' if create_store else 'read'} a store directly "
                        "with --store chdb:///path/to/store",
                        json_output,
                    )
                store = default
                if not json_output:
                    err_console.print(
                        f"no server at {url}: reading the store {shown_store_url(store)} directly", highlight=False
                    )
        check_store_folder(
            store,
            create=create_store,
            in_use_hint=f"{verb} through that server with --server URL",
            json_output=json_output,
        )
        from inferpath.config import Settings
        from inferpath.serve import server_services
        from inferpath.server.runtime import serve_in_thread

        local = Settings(
            store_url=store,
            port=0,
            token=settings.token,
            ttl_days=settings.ttl_days,
            objectives_file=settings.objectives_file,
            assembly_settle_seconds=0.2,
        )
        try:
            # Its services answer (alert back-tests) but notify no one: it is this command's own.
            running = serve_in_thread(local, port=0, services=server_services(local, evaluate_rules=False))
        except Exception as exc:  # the store cannot be opened: say which and why, in one sentence
            fail(store_open_failure(store, exc), json_output)
        try:
            yield running.url, headers
        finally:
            running.stop()


def ask(
    method: str,
    path: str,
    server: str | None,
    store: str | None,
    json_output: bool,
    *,
    timeout_seconds: float,
    params: dict[str, Any] | None = None,
    json_body: dict[str, Any] | None = None,
    announce: str | None = None,
) -> httpx.Response:
    """``method path`` (with query ``params``, a JSON body ``json_body``) on the server
    :func:`server_for` picks, falling back to the default store when no server answers;
    exits 2 when it does not answer. ``announce``: a line printed to stderr once the server is
    found, before the request (what a long request is doing). Returns the response, whatever
    its status."""
    import httpx

    with server_for(server, store, fallback_to_default_store=True, json_output=json_output) as (url, headers):
        shown = shown_store_url(url)
        if announce:
            err_console.print(announce, highlight=False)
        try:
            response = httpx.request(
                method, f"{url}{path}", params=params, json=json_body, headers=headers, timeout=timeout_seconds
            )
        except httpx.HTTPError as exc:
            fail(f"the inferpath server at {shown} did not answer: {str(exc).replace(url, shown)}", json_output)
            raise
    # The read API answers JSON, refusals included, and has every route it is asked for (its
    # own 404s name what was not found): anything else is another program on that port.
    json_answer = response.headers.get("content-type", "").split(";")[0].strip() == "application/json"
    no_such_route = response.status_code in (404, 405) and refusal_text(response) in ("Not Found", "Method Not Allowed")
    if response.status_code == 401 and json_answer:
        given = "the token INFERPATH_TOKEN gives" if headers else "no token (INFERPATH_TOKEN is not set)"
        fail(
            f"the inferpath server at {shown} refused {given}: set INFERPATH_TOKEN to the token it was started "
            "with, then run the command again",
            json_output,
            http_status=401,
        )
    if not json_answer or no_such_route:
        fail(
            f"{shown} is not an inferpath server: it answered {method} {path} with "
            f"{response.status_code} {response.reason_phrase or ''}".rstrip()
            + f" ({response.headers.get('content-type') or 'no content type'}); give --server the address "
            f"`inferpath up` printed (by default {SERVER_URL_EXAMPLE}), not the dashboard's",
            json_output,
        )
    return response


def refusal_text(response: httpx.Response) -> str:
    """The server's own words for a refusal: FastAPI's ``detail`` messages joined, else the body."""
    try:
        detail = response.json().get("detail")
        return "; ".join(d.get("msg", str(d)) for d in detail) if isinstance(detail, list) else str(detail)
    except (ValueError, AttributeError):
        return response.text


__all__ = [
    "SERVER_URL_EXAMPLE",
    "ask",
    "console",
    "fail",
    "invalid_store_url",
    "quiet_store_driver",
    "refusal_text",
    "server_for",
    "shown_store_url",
    "store_in_use",
    "store_open_failure",
]
