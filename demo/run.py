"""``inferpath demo``: the whole pipeline on real input, on the embedded store.

1. the inferpath server (OTLP receiver, assembler, read API) on embedded chDB, scraping the
   engine's vLLM-compatible ``/metrics`` and dcgm-exporter-compatible ``/gpu/metrics``;
2. the emulated GPU engine (its own process) and the instrumented gateway (its own process);
3. a real request trace replayed with its arrival times (``speed`` compresses): the Azure LLM
   inference trace 2023 unless ``trace_path`` names another (any format of
   :mod:`inferpath.demo.trace`);
4. a per-stage latency table read back through the read API, and the dashboard URL.
"""

from __future__ import annotations

import asyncio
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from inferpath.config import Settings
from inferpath.demo.engine.scheduler import EngineConfig
from inferpath.demo.processes import ChildService, ensure_port_free, free_port, start_module, start_server
from inferpath.demo.replay import ReplayResult, replay
from inferpath.demo.trace import load_trace
from inferpath.storage.url import embedded_store_url
from inferpath.vocabulary import MEASURE_TITLES


@dataclass
class DemoOptions:
    """Options of one demo run (see ``inferpath demo --help``)."""

    requests: int = 300
    speed: float = 10.0
    exit_when_done: bool = False
    store_url: str | None = None
    """Where the demo stores what it measures (default :func:`~inferpath.storage.url.demo_store_url`,
    never the default store that ``inferpath up`` serves)."""
    port: int | None = None  # None: INFERPATH_PORT or 4318; 0: any free port
    dashboard: bool = True
    dashboard_port: int = 8501
    results_path: Path | None = None
    trace_path: Path | None = None
    """The request trace to replay (default: the shipped Azure code trace)."""
    engine_args: list[str] = field(default_factory=list)
    gateway_args: list[str] = field(default_factory=list)
    log_dir: Path | None = None
    settle_timeout_seconds: float = 60.0
    scenario: str | None = None
    """A fault scenario of :mod:`inferpath.demo.scenarios` (``slow-tokenizer``, …): run it
    (baseline phase, then the fault) on the same ports, print the diagnosis and serve the
    dashboard on the incident as the plain demo does; ``requests``, ``speed`` and
    ``engine_args`` do not apply to it (the scenario sets its own load), ``trace_path``
    gives its token counts."""


@dataclass
class DemoOutcome:
    server_url: str
    window_start: datetime
    window_end: datetime
    results: list[ReplayResult]
    summary: list[dict[str, Any]]
    stored_requests: int
    timings_seconds: dict[str, float]
    dashboard_url: str | None = None
    verdict: dict[str, Any] | None = None


def _fmt_ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1000:.1f}"


def summary_table(summary: list[dict[str, Any]], title: str) -> Table:
    """A rich table of count, avg, p50, p95, p99 (ms) per measure; measures with no data are left out."""
    table = Table(title=title)
    table.add_column("stage / measure")
    for name in ("count", "avg ms", "p50 ms", "p95 ms", "p99 ms"):
        table.add_column(name, justify="right")
    for row in summary:
        if not row.get("count"):
            continue
        table.add_row(
            MEASURE_TITLES.get(row["measure"], row["measure"]),
            str(row["count"]),
            _fmt_ms(row["avg_seconds"]),
            _fmt_ms(row["p50_seconds"]),
            _fmt_ms(row["p95_seconds"]),
            _fmt_ms(row["p99_seconds"]),
        )
    return table


def _wait_for_rows(
    server_url: str, token: str | None, start: datetime, end: datetime, expected: int, timeout_seconds: float
) -> int:
    """Flush the server until ``expected`` request rows exist in [start, end) or time runs out."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    params = {"start": start.isoformat(), "end": end.isoformat()}
    deadline = time.monotonic() + timeout_seconds
    count = 0
    with httpx.Client(base_url=server_url, headers=headers, timeout=60.0) as client:
        while True:
            client.post("/api/v1/flush").raise_for_status()
            count = int(client.get("/api/v1/requests/count", params=params).json()["count"])
            if count >= expected or time.monotonic() > deadline:
                return count
            time.sleep(0.5)


def serve_until_stopped(
    options: DemoOptions,
    console: Console,
    server_url: str,
    token: str | None,
    log_dir: Path,
    children: list[ChildService],
) -> str | None:
    """Serve the dashboard on ``options.dashboard_port`` (unless ``options.dashboard`` is off)
    while ``children`` run, until Ctrl-C; returns the dashboard URL. Raises ``RuntimeError``
    naming a child that exits meanwhile (a crash, the OOM killer, a signal sent to it alone)
    rather than leaving a half-dead path up."""
    watched = list(children)
    dash = dashboard_url = None
    if options.dashboard:
        from inferpath.dashboard.launch import launch_dashboard

        dash_log = log_dir / "dashboard.log"
        dash = launch_dashboard(server_url, port=options.dashboard_port, token=token, log_path=dash_log)
        dashboard_url = f"http://127.0.0.1:{options.dashboard_port}"
        watched.append(ChildService("dashboard", dashboard_url, dash, str(dash_log)))
        console.print(f"dashboard: [bold]{dashboard_url}[/]  (Ctrl-C to stop)")
    else:
        console.print("serving (Ctrl-C to stop)")
    try:
        while not (exited := [m for m in map(ChildService.exit_message, watched) if m]):
            time.sleep(0.5)
        raise RuntimeError("; ".join(exited) + " while the demo was serving")
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        if dash is not None:
            dash.terminate()
    return dashboard_url


def _server_port(options: DemoOptions, settings: Settings) -> int:
    """The server's port: ``--port``, else ``INFERPATH_PORT`` (4318); 0 picks a free one.
    Checked, with the dashboard's, before anything starts: a demo that talked to someone
    else's server would report that server's data as its own."""
    port = options.port if options.port is not None else settings.port
    if options.dashboard and not options.exit_when_done:
        ensure_port_free(options.dashboard_port, settings.host, what="the dashboard port", option="--dashboard-port")
    ensure_port_free(port, settings.host, what="the inferpath server port")  # port 0: the host alone
    return port or free_port()


def _print_scenario(outcome: Any, console: Console) -> None:
    verdict = outcome.verdict
    table = Table(title=f"scenario {outcome.scenario.name}: {outcome.scenario.description}")
    for column in ("cause", "share", "evidence", "would help", "would not help"):
        table.add_column(column)
    for cause in verdict.get("causes", []):
        table.add_row(
            cause["cause"],
            f"{cause['share']:.0%}",
            "\n".join(e["text"] for e in cause["evidence"]),
            "\n".join(cause["would_help"]),
            "\n".join(cause["would_not_help"]),
        )
    console.print(table)
    verdict_word = "[green]correct[/]" if outcome.correct else "[red]wrong[/]"
    console.print(f"diagnosis: {verdict['summary']} — expected {outcome.scenario.cause or 'healthy'}: {verdict_word}")
    console.print("timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in outcome.timings_seconds.items()))
    (base_start, base_end), (start, end) = outcome.baseline_window, outcome.fault_window
    console.print(
        f"diagnose this incident again: inferpath diagnose --from {start.isoformat()} --to {end.isoformat()} "
        f"--baseline-from {base_start.isoformat()} --baseline-to {base_end.isoformat()} --store {outcome.store_url}",
        soft_wrap=True,
        highlight=False,
    )


def _run_scenario(options: DemoOptions, console: Console) -> DemoOutcome:
    """``inferpath demo --scenario NAME``: one fault scenario, diagnosed, on the ports of the
    plain demo; then, unless ``exit_when_done``, the dashboard on the incident until Ctrl-C."""
    from inferpath.demo.scenarios import ScenarioOptions, run_scenario

    settings = Settings.from_env()
    log_dir = options.log_dir or Path(tempfile.mkdtemp(prefix=f"inferpath-{options.scenario}-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    # The scenario's own store unless one is named: its two windows are the whole incident.
    store_url = options.store_url or embedded_store_url(log_dir / "store")
    server_port = _server_port(options, settings)
    dashboard_url: list[str | None] = [None]

    def done(outcome: Any, children: Any) -> None:
        _print_scenario(outcome, console)
        console.print(
            f"store: {store_url} (this scenario's own; open it again with "
            f"`{up_command(store_url, options.dashboard_port)}`)",
            soft_wrap=True,
            highlight=False,
        )
        if options.exit_when_done:
            return
        dashboard_url[0] = serve_until_stopped(
            options, console, outcome.server_url, settings.token, log_dir, list(children)
        )

    outcome = run_scenario(
        options.scenario or "",
        ScenarioOptions(
            store_url=store_url, log_dir=log_dir, port=server_port, trace_path=options.trace_path, on_done=done
        ),
        log=console.print,
    )
    verdict = outcome.verdict
    return DemoOutcome(
        outcome.server_url,
        outcome.baseline_window[0],
        outcome.fault_window[1],
        outcome.results,
        [],
        verdict.get("current_requests", 0) + verdict.get("baseline_requests", 0),
        outcome.timings_seconds,
        dashboard_url=dashboard_url[0],
        verdict=verdict,
    )


def print_demo_verdict(console: Console, verdict: dict | None, answer: httpx.Response) -> None:
    """The verdict for the replayed window under the table: summary, top cause and its first
    action; or why there is none, as a sentence."""
    if verdict is None:
        try:
            detail = answer.json()["detail"][0]["msg"]
        except (ValueError, KeyError, IndexError, TypeError):
            detail = answer.text[:200]
        console.print(f"verdict: none for this window ({detail})", highlight=False)
        return
    style = "green" if verdict.get("healthy") else "red"
    console.print(f"[bold {style}]verdict:[/] {verdict.get('summary', '')}", soft_wrap=True, highlight=False)
    causes = verdict.get("causes") or []
    if causes and causes[0].get("would_help"):
        console.print(f"would help: {causes[0]['would_help'][0]}", soft_wrap=True, highlight=False)


def up_command(store_url: str, dashboard_port: int) -> str:
    """The ``inferpath up`` command line that serves ``store_url``'s dashboard on
    ``dashboard_port`` (shell-quoted; the port flag only when it is not the default)."""
    words = ["inferpath", "up", "--store", store_url]
    if dashboard_port != DemoOptions.dashboard_port:
        words += ["--dashboard-port", str(dashboard_port)]
    return shlex.join(words)


def run_demo(options: DemoOptions, console: Console | None = None) -> DemoOutcome:
    """Run the demo end to end; returns what it measured. Raises ``RuntimeError`` if a part fails to start."""
    from inferpath.instrumentation.provider import configure
    from inferpath.instrumentation.provider import shutdown as shutdown_tracing
    from inferpath.storage.url import demo_store_url, parse_store_url

    console = console or Console()
    if options.scenario is not None:
        return _run_scenario(options, console)
    timings: dict[str, float] = {}
    engine_port, gateway_port = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"

    t0 = time.perf_counter()
    settings = Settings.from_env()
    # The demo's own store unless --store names one (INFERPATH_STORE names the real store).
    store_url = options.store_url or demo_store_url()
    parse_store_url(store_url)  # a bad URL fails here, naming what is wrong, before anything starts
    trace = load_trace(options.trace_path, limit=options.requests)  # a bad file fails here
    if options.results_path is not None and not Path(options.results_path).parent.is_dir():
        raise RuntimeError(
            f"cannot write the results to {options.results_path}: "
            f"folder {Path(options.results_path).parent} does not exist"
        )
    server_port = _server_port(options, settings)
    server_url = f"http://127.0.0.1:{server_port}"
    # The children's logs, made once the inputs are checked (a refused run leaves no folder).
    log_dir = options.log_dir or Path(tempfile.mkdtemp(prefix="inferpath-demo-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    children: list[ChildService] = []
    try:
        # The engine first, so that the server's first scrape finds it; its spans are exported
        # only once requests arrive, when the server is up.
        engine = start_module(
            "engine",
            "inferpath.demo.engine",
            ["--port", str(engine_port), "--otlp-endpoint", server_url, *options.engine_args],
            port=engine_port,
            log_path=str(log_dir / "engine.log"),
        )
        children.append(engine)
        engine.wait_ready("/health")
        # The server owns the embedded store in its own process, as in production; this
        # process only replays, so its clock readings are not disturbed by ingest work.
        server = start_server(store_url, server_port, engine_url, log_dir)
        children.append(server)
        server.wait_ready("/healthz")
        timings["server + engine start"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        gateway = start_module(
            "gateway",
            "inferpath.demo.gateway",
            [
                "--port",
                str(gateway_port),
                "--engine-url",
                engine_url,
                "--otlp-endpoint",
                server_url,
                *options.gateway_args,
            ],
            port=gateway_port,
            log_path=str(log_dir / "gateway.log"),
        )
        children.append(gateway)
        gateway.wait_ready("/health")
        timings["gateway start"] = time.perf_counter() - t1
        console.print(
            f"[bold]inferpath[/] server {server_url} (store {store_url}), "
            f"engine {engine_url}, gateway {gateway.url}; logs in {log_dir}"
        )

        console.print(f"trace: {trace.describe()}", highlight=False)
        configure("demo-client", endpoint_class="interactive", otlp_endpoint=server_url)
        window_start = datetime.now(timezone.utc)
        t2 = time.perf_counter()
        with Progress(
            TextColumn(f"replaying {trace.source.name}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as progress:
            task = progress.add_task("replay", total=len(trace.requests))
            results = asyncio.run(
                replay(
                    gateway.url,
                    trace.requests,
                    speed=options.speed,
                    results_path=options.results_path,
                    on_done=lambda _r: progress.advance(task),
                )
            )
        timings["replay"] = time.perf_counter() - t2
        failed = [r for r in results if r.error or r.e2e_seconds is None]
        if failed:
            console.print(f"[yellow]{len(failed)} of {len(results)} requests failed; first: {failed[0].error}")

        t3 = time.perf_counter()
        shutdown_tracing()
        if options.exit_when_done:
            for child in (gateway, engine):  # graceful stop flushes their span exporters
                child.stop()
        window_end = datetime.now(timezone.utc) + timedelta(seconds=1)
        expected = sum(1 for r in results if r.trace_id)
        stored = _wait_for_rows(
            server_url, settings.token, window_start, window_end, expected, options.settle_timeout_seconds
        )
        # A last forced assembly so late engine spans are folded into the rows we print.
        time.sleep(1.0)
        stored = _wait_for_rows(server_url, settings.token, window_start, window_end, expected, 0)
        timings["export + assembly"] = time.perf_counter() - t3
        with httpx.Client(
            base_url=server_url,
            timeout=60.0,
            headers={"Authorization": f"Bearer {settings.token}"} if settings.token else {},
        ) as c:
            summary = c.get(
                "/api/v1/summary", params={"start": window_start.isoformat(), "end": window_end.isoformat()}
            ).json()
            answer = c.get(
                "/api/v1/diagnosis", params={"start": window_start.isoformat(), "end": window_end.isoformat()}
            )
        summary_rows = summary["measures"] if isinstance(summary, dict) else summary
        console.print(summary_table(summary_rows, f"{stored} requests stored of {len(results)} replayed"))
        verdict = answer.json() if answer.status_code == 200 else None
        if options.speed != 1:
            # The default --speed 10 is more load than the one emulated replica takes: the
            # verdict names what that load filled, not a fault of the demo.
            console.print(
                f"the trace was played {options.speed:g}× as fast as it was recorded; the verdict judges that load "
                "(--speed 1 plays it at its real pace)",
                soft_wrap=True,
                highlight=False,
            )
        print_demo_verdict(console, verdict, answer)
        console.print("timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
        outcome = DemoOutcome(
            server_url, window_start, window_end, results, summary_rows, stored, timings, verdict=verdict
        )
        # While the demo serves, its server holds the store: ask the server; once it exits, the store.
        again = f"--server {server_url}" if not options.exit_when_done else f"--store {store_url}"
        console.print(
            f"diagnose this window again: inferpath diagnose --from {window_start.isoformat()} "
            f"--to {window_end.isoformat()} {again}",
            soft_wrap=True,
            highlight=False,
        )
        # Engines do not export their token budget per step: the demo's server is told it, a
        # server opened on the store later is not (the what-if would assume vLLM's 2048).
        console.print(
            f"what would a second replica do: inferpath whatif --from {window_start.isoformat()} "
            f"--to {window_end.isoformat()} --replicas 2 --max-num-batched-tokens "
            f"{EngineConfig.max_num_batched_tokens} {again}",
            soft_wrap=True,
            highlight=False,
        )

        console.print(
            f"store: {store_url} (the demo's own; open it again with "
            f"`{up_command(store_url, options.dashboard_port)}`)",
            soft_wrap=True,
            highlight=False,
        )
        if not options.exit_when_done:
            outcome.dashboard_url = serve_until_stopped(options, console, server_url, settings.token, log_dir, children)
        else:
            console.print(
                f"dashboard: run `{up_command(store_url, options.dashboard_port)}` and open "
                f"http://127.0.0.1:{options.dashboard_port}",
                soft_wrap=True,
                highlight=False,
            )
        return outcome
    finally:
        for child in reversed(children):
            child.stop()
