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
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console

from inferpath.cli_app import command_settings

if TYPE_CHECKING:
    import httpx

console = Console()


def fail(message: str, json_output: bool = False, **extra: Any) -> NoReturn:
    """Print ``message`` (as ``{"error": message, **extra}`` on stdout with ``json_output``,
    for scripts) and exit 2."""
    if json_output:  # scripts read stdout: an error is JSON there too
        print(json.dumps({"error": message, **extra}))
    else:
        console.print(f"[red]{message}[/]", soft_wrap=True, highlight=False)
    raise typer.Exit(2)


@contextlib.contextmanager
def server_for(
    server: str | None, store: str | None, *, fallback_to_default_store: bool, json_output: bool = False
) -> Iterator[tuple[str, dict[str, str]]]:
    """Yield ``(base URL, headers)`` of the server to talk to (module docstring)."""
    import httpx

    settings = command_settings(server_url=server, store_url=store)
    headers = {"Authorization": f"Bearer {settings.token}"} if settings.token else {}
    if store is None:
        url = settings.server_url.rstrip("/")
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
                fail(f"invalid store URL {default!r}: {bad}", json_output)
            folder = parsed.path if parsed.kind == "chdb" else None
            if server or not fallback_to_default_store or not folder or not Path(folder).exists():
                fail(
                    f"cannot reach the inferpath server at {url} ({exc}). Start it with `inferpath up`, "
                    f"point --server at it, or read a store directly with --store chdb:///path/to/store",
                    json_output,
                )
            store = default
            if not json_output:
                console.print(f"no server at {url}: reading the store {store} directly", highlight=False)
    from inferpath.config import Settings
    from inferpath.serve import server_services
    from inferpath.server.runtime import StoreOpenError, serve_in_thread

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
    except Exception as exc:  # the store is held by another process, or cannot be opened
        fail(
            str(StoreOpenError(store, exc)) + "\nwhile a server owns it, use --server URL instead of --store",
            json_output,
        )
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
) -> httpx.Response:
    """``method path`` (with query ``params``, a JSON body ``json_body``) on the server
    :func:`server_for` picks, falling back to the default store when no server answers;
    exits 2 when it does not answer. Returns the response, whatever its status."""
    import httpx

    with server_for(server, store, fallback_to_default_store=True, json_output=json_output) as (url, headers):
        try:
            return httpx.request(
                method, f"{url}{path}", params=params, json=json_body, headers=headers, timeout=timeout_seconds
            )
        except httpx.HTTPError as exc:
            fail(f"the inferpath server at {url} did not answer: {exc}", json_output)
            raise


def refusal_text(response: httpx.Response) -> str:
    """The server's own words for a refusal: FastAPI's ``detail`` messages joined, else the body."""
    try:
        detail = response.json().get("detail")
        return "; ".join(d.get("msg", str(d)) for d in detail) if isinstance(detail, list) else str(detail)
    except (ValueError, AttributeError):
        return response.text


__all__ = ["ask", "console", "fail", "refusal_text", "server_for"]
