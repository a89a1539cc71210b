"""The ``inferpath`` command line (Typer).

Exit codes: 0 success, 1 the job ran and found a problem (e.g. requests failed), 2 bad usage
or configuration.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import typer

from inferpath.alerts.cli import app as alerts_app
from inferpath.cli_app import command_settings, console, err_console, new_app
from inferpath.collectors.cli import collect
from inferpath.diagnose_cli import diagnose, import_cmd
from inferpath.whatif_cli import whatif

app = new_app(help="Trace the inference request path and name the bottleneck.")


_TRACE_HELP = (
    "Request trace to replay, format recognised from the content: Azure LLM trace 2023 CSV, "
    "BurstGPT CSV, Mooncake JSONL, or JSONL of timestamp (s), input_tokens, output_tokens "
    "(default: the shipped Azure code trace)."
)


def _check_store_url(url: str | None) -> None:
    from inferpath.server_access import invalid_store_url
    from inferpath.storage.url import parse_store_url

    if url is None:
        return
    try:
        parse_store_url(url)
    except ValueError as exc:
        err_console.print(invalid_store_url(url, exc), style="red", soft_wrap=True, highlight=False, markup=False)
        raise typer.Exit(2) from exc


def _check_store_free(url: str | None) -> None:
    """Exit 2 when the embedded store at ``url`` (default: the default store) is open in
    another process: chDB would refuse it, with a raw message of its own on stderr."""
    from inferpath.server_access import store_in_use
    from inferpath.storage.store import chdb_folder_in_use
    from inferpath.storage.url import default_store_url, parse_store_url

    parsed = parse_store_url(url or default_store_url())
    if parsed.kind == "chdb" and parsed.path is not None and chdb_folder_in_use(parsed.path):
        message = store_in_use(parsed.path, "stop that process, or give this server another --store")
        err_console.print(message, style="red", soft_wrap=True, highlight=False, markup=False)
        raise typer.Exit(2)


def _check_dashboard_port(host: str, port: int, server_port: int) -> None:
    """Exit 2 when the dashboard could not listen on ``host:port`` (as for the server's own
    --port), before anything starts: the dashboard is a child process whose failure to
    listen would otherwise go unseen. A server port taken too is named in the same message."""
    import errno

    failure = _bind_failure(host, port, reuse_address=True)  # as the dashboard's server binds
    if failure is None:
        return
    if failure.errno == errno.EADDRINUSE:
        hint = "is another dashboard running? choose another with --dashboard-port"
    else:
        hint = "check --host and --dashboard-port"
    message = f"cannot listen on {host}:{port} for the dashboard: {failure.strerror or failure} ({hint})"
    server_failure = _bind_failure(host, server_port, reuse_address=True) if server_port else None
    if server_failure is not None and server_failure.errno == errno.EADDRINUSE:
        message += f"; the server's port {server_port} is in use too (choose another with --port)"
    err_console.print(message, style="red", soft_wrap=True, highlight=False, markup=False)
    raise typer.Exit(2)


def _bind_failure(host: str, port: int, *, reuse_address: bool) -> OSError | None:
    """The error binding ``host:port`` gives now (``None``: it binds); the socket is closed."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
    return None


@app.command()
def demo(
    requests: int = typer.Option(300, min=1, max=19366, help="How many trace requests to replay."),
    speed: float = typer.Option(10.0, min=0.01, help="Replay speed-up of the trace's arrival times."),
    exit_: bool = typer.Option(False, "--exit", help="Exit after printing the table instead of serving."),
    store: str | None = typer.Option(
        None,
        help="Store URL (default: the demo's own embedded store, "
        "<XDG_DATA_HOME or ~/.local/share>/inferpath/demo-store, never "
        "the store of `inferpath up` or INFERPATH_STORE).",
    ),
    port: int | None = typer.Option(
        None, min=0, max=65535, help="inferpath server port (default INFERPATH_PORT or 4318; 0: any free port)."
    ),
    dashboard_port: int | None = typer.Option(None, min=1, max=65535, help="Dashboard port (default 8501)."),
    results: Path | None = typer.Option(None, help="Write the replay client's own measurements here (JSONL)."),
    scenario: str | None = typer.Option(
        None,
        help="Inject one known fault after a healthy baseline and diagnose it: healthy, slow-tokenizer, "
        "slow-retrieval, network-hop, batch-window, kv-pressure, gpu-saturated, cold-start.",
    ),
    trace: Path | None = typer.Option(None, exists=True, dir_okay=False, help=_TRACE_HELP),
) -> None:
    """Run the reference inference path on a real request trace (default: the Azure LLM trace 2023) and print
    the per-stage latency table."""
    from inferpath.demo.processes import ListenAddressError
    from inferpath.demo.run import DemoOptions, run_demo
    from inferpath.demo.trace import TraceError

    settings = command_settings(dashboard_port=dashboard_port)
    _check_store_url(store)
    if store is not None:  # a file in the folder's place, a folder of other files, a store in use
        from inferpath.server_access import check_store_folder

        check_store_folder(
            store, create=True, in_use_hint="give the demo a store of its own with --store", json_output=False
        )
    if scenario is not None:
        from inferpath.demo.scenarios import SCENARIOS

        if scenario not in SCENARIOS:
            err_console.print(f"[red]unknown scenario {scenario!r};[/] one of {', '.join(SCENARIOS)}")
            raise typer.Exit(2)
    import signal

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the child processes as Ctrl-C does

    signal.signal(signal.SIGTERM, _terminate)
    try:
        outcome = run_demo(
            DemoOptions(
                requests=requests,
                speed=speed,
                exit_when_done=exit_,
                store_url=store,
                port=port,
                dashboard_port=settings.dashboard_port,
                results_path=results,
                scenario=scenario,
                trace_path=trace,
            ),
            console,
        )
    except TraceError as exc:
        err_console.print(f"[red]cannot read trace:[/] {exc}", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from exc
    except ListenAddressError as exc:  # as `inferpath up` answers a taken port or a foreign host
        err_console.print(f"[red]demo cannot start:[/] {exc}", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from exc
    except (RuntimeError, OSError, ValueError) as exc:
        err_console.print(f"[red]demo failed:[/] {exc}")
        raise typer.Exit(1) from exc
    except KeyboardInterrupt:
        console.print("stopped")
        raise typer.Exit(130) from None
    if scenario is not None:  # exit 0 only when the diagnosis named the injected fault
        expected = SCENARIOS[scenario].cause
        verdict = outcome.verdict or {}
        named = None if verdict.get("healthy") else verdict.get("top_cause")
        raise typer.Exit(0 if named == expected else 1)
    failed = sum(1 for r in outcome.results if r.error)
    if failed or outcome.stored_requests < len(outcome.results):
        raise typer.Exit(1)


@app.command()
def up(
    store: str | None = typer.Option(None, help="Store URL: chdb:///path or http(s)://host:port/db."),
    host: str | None = typer.Option(None, help="Listen address (default 127.0.0.1)."),
    port: int | None = typer.Option(None, min=0, max=65535, help="Listen port (default 4318)."),
    scrape: list[str] | None = typer.Option(None, help="Scrape target, e.g. vllm=http://h:8000/metrics (repeatable)."),
    dashboard: bool = typer.Option(True, help="Also serve the dashboard."),
    dashboard_port: int | None = typer.Option(None, min=1, max=65535, help="Dashboard port (default 8501)."),
    alerts: str | None = typer.Option(
        None, help="Alert rules to evaluate: a YAML file, 'default' or 'off' (default INFERPATH_ALERT_RULES, else off)."
    ),
) -> None:
    """Run the inferpath server: OTLP/HTTP receiver, assembler, read API, collectors and the dashboard."""
    from inferpath.server.runtime import serve_in_thread

    overrides: dict[str, Any] = {
        "store_url": store,
        "host": host,
        "port": port,
        "dashboard_port": dashboard_port,
        "alert_rules": alerts,
    }
    if scrape:
        overrides["scrape_targets"] = ",".join(scrape)
    settings = command_settings(**overrides)
    _check_store_url(settings.store_url)
    _check_store_free(settings.store_url)
    if dashboard:
        _check_dashboard_port(settings.host, settings.dashboard_port, settings.port)
    from inferpath.alerts.rules import RuleFileError
    from inferpath.serve import server_services

    try:
        services = server_services(settings)  # the alert evaluator, with the rules of --alerts
    except RuleFileError as exc:
        err_console.print(f"[red]invalid alert rules:[/] {exc}")
        raise typer.Exit(2) from exc
    from inferpath.analysis.objectives import load_objectives
    from inferpath.config import ENV_OBJECTIVES_FILE

    try:  # every diagnosis would answer 500 naming it: say it once, before anything starts
        load_objectives(settings.objectives_file)
    except ValueError as exc:
        err_console.print(f"[red]invalid objectives ({ENV_OBJECTIVES_FILE}):[/] {exc}", soft_wrap=True)
        raise typer.Exit(2) from exc
    from inferpath.server.runtime import ListenError, cap_c_heap_arenas, tune_gc_for_server
    from inferpath.server_access import quiet_store_driver, store_open_failure

    cap_c_heap_arenas()  # this process is the server: before its threads start
    try:
        with quiet_store_driver():  # a store that cannot be opened is said once, below
            server = serve_in_thread(settings, services=services)
    except ListenError as exc:
        err_console.print(exc.strerror, style="red", highlight=False, markup=False)
        raise typer.Exit(2) from exc
    except Exception as exc:  # the store could not be opened: say which and why, no traceback
        message = store_open_failure(settings.store_url, exc)
        err_console.print(message, style="red", soft_wrap=True, highlight=False, markup=False)
        raise typer.Exit(2) from exc
    tune_gc_for_server()  # this process is the server (the dashboard runs in its own)
    console.print(f"inferpath server on {server.url} (store {server.runtime.store.url})")
    dash = None
    if dashboard:
        from inferpath.dashboard.launch import launch_dashboard

        dash = launch_dashboard(server.url, port=settings.dashboard_port, host=settings.host, token=settings.token)
        console.print(f"dashboard on http://{settings.host}:{settings.dashboard_port}")
    import signal
    import time

    def _terminate(signum: int, frame: object) -> None:
        # SIGTERM (Kubernetes, systemd) stops as gracefully as Ctrl-C: flush, assemble, close.
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        if dash is not None:
            dash.terminate()
        server.stop()


@app.command("replay")
def replay_cmd(
    gateway: str = typer.Option(..., help="Base URL of an OpenAI-compatible gateway."),
    requests: int = typer.Option(100, min=1, help="Most requests taken from the trace."),
    speed: float = typer.Option(
        1.0, min=0.01, help="Play the trace's arrival times this many times faster (2 = twice as fast)."
    ),
    trace: Path | None = typer.Option(None, exists=True, dir_okay=False, help=_TRACE_HELP),
    results: Path | None = typer.Option(None, help="Write per-request measurements here (JSONL)."),
    model: str = typer.Option("llama2-70b", help="The model name sent in each request."),
) -> None:
    """Replay a real request trace against a gateway, as the instrumented root client. Its
    spans go to INFERPATH_OTLP_ENDPOINT (default http://127.0.0.1:4318, an `inferpath up`)."""
    import asyncio

    from inferpath.demo.replay import replay
    from inferpath.demo.trace import load_trace
    from inferpath.instrumentation.provider import configure, shutdown

    settings = command_settings()
    if not gateway.startswith(("http://", "https://")):
        err_console.print(f"[red]--gateway must be an http(s):// URL, got {gateway!r}")
        raise typer.Exit(2)
    try:
        loaded = load_trace(trace, limit=requests)
    except (ValueError, OSError) as exc:
        err_console.print(f"[red]cannot read trace:[/] {exc}", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from exc
    import httpx

    # Both ends answer before the first request: a replay that reaches neither prints one line,
    # not a failure per request and the exporter's retries.
    for what, url in (("gateway", gateway), ("inferpath server (INFERPATH_OTLP_ENDPOINT)", settings.otlp_endpoint)):
        try:
            httpx.get(url, timeout=5.0)
        except httpx.HTTPError as exc:
            err_console.print(
                f"[red]cannot reach the {what} at {url}:[/] {type(exc).__name__}: {exc}",
                soft_wrap=True,
                highlight=False,
            )
            raise typer.Exit(2) from None
    console.print(f"trace: {loaded.describe()}", highlight=False)
    trace_requests = loaded.requests
    console.print(f"spans to {settings.otlp_endpoint}", highlight=False)
    configure("replay-client", otlp_endpoint=settings.otlp_endpoint)
    done = asyncio.run(replay(gateway, trace_requests, speed=speed, model=model, results_path=results))
    shutdown()
    failed = [r for r in done if r.error]
    console.print(f"{len(done) - len(failed)} of {len(done)} requests completed")
    if failed:
        err_console.print(f"[red]{len(failed)} failed; first error:[/] {failed[0].error}")
    raise typer.Exit(1 if failed else 0)


# Component commands live with their component; each imports its own heavy dependencies only
# when run.
app.command("collect")(collect)
app.command("diagnose")(diagnose)
app.command("import")(import_cmd)
app.command("whatif")(whatif)
app.add_typer(alerts_app, name="alerts")


class _ClosablePipe:
    """``sys.stdout`` for a command whose reader may stop reading (``inferpath diagnose | head
    -1``): once a write or flush meets a closed pipe, the rest goes to ``/dev/null`` (the way
    Python's documentation on SIGPIPE advises), so the command ends with its own exit code.
    Click turns the error into exit 1, which reads as "degraded"."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main() -> None:
    sys.stdout = _ClosablePipe(sys.stdout)
    if "--json" not in sys.argv[1:]:
        app()
        return
    # A script asked for JSON: an option it got wrong (a value that is not a number, an
    # unknown option) is an {"error": ...} on stdout as every other refusal is, exit 2.
    try:
        code = app(standalone_mode=False)
    except typer.Abort:  # Ctrl-C, as click says "Aborted!"
        sys.exit(1)
    except typer.TyperException as exc:  # typer's click: usage errors and bad values
        format_message = getattr(exc, "format_message", None)
        print(json.dumps({"error": format_message() if callable(format_message) else str(exc)}))
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
