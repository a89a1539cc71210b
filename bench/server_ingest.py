"""Benchmark: sustained OTLP/HTTP ingest into embedded chDB with zero loss, against a raw
clickhouse-connect insert of the same rows, plus span end → visible latency.

In one run, alternating so that both sides see the same background load of the machine:

1. reference phase: the next pre-built bodies, decoded here (untimed), inserted by the bare
   clickhouse-connect client (no checks, no dedup token) in batches of ``--spans-per-request``
   rows into a second chDB folder, for ``--reference-seconds`` of insert time. These are the
   same rows the server is sent (the bodies are taken in the same order).
2. server phase: the server (``python -m inferpath.server``, its own process, a fresh chDB
   folder) takes ``--clients`` concurrent exporters posting those pre-built protobuf bodies
   for ``--seconds / --rounds``; every body is retried until its 200, as an OTLP exporter
   does. Throughput = spans acknowledged per second of server phase (200 = committed to
   the store, or to the server's span log, whose un-inserted backlog is bounded to ~1 s
   of inserts; loss and duplicates are counted after the kill and restart below).
   Meanwhile a probe posts a one-span trace every 200 ms, with the span's end = now, and
   polls ``GET /api/v1/traces/{id}`` every ``--probe-poll-seconds`` until it is there: span
   end → visible latency, an upper bound that overshoots by less than one poll interval.
   The probe is a reader of the server under test, and not a light one: a lookup of a trace
   not yet there costs the server ~5-8 ms of CPU, one that finds it 15-70 ms (bench/README.md),
   so polling every 25 ms (~650 lookups a minute) took ~6 % of the machine from ingest;
   every 100 ms (the default) the answer is ≤ 75 ms coarser and the lookups half as many
   (``probe_reads``). ``--no-probe`` runs without it (``visible_*`` are then null).

A second reference side, ``async``, inserts the same kind of rows from ``--clients`` threads
at once, each insert with ``async_insert=1, wait_for_async_insert=1`` (ClickHouse's own
server-side batching, each insert answered once its rows are flushed); it reports the
store's ``AsyncInsertQuery`` count, which says whether the engine batched them at all
(embedded chDB does not: it answers each such insert as a plain synchronous one).

The last server phase ends with ``kill -9`` of the server while the exporters are still
posting (``--no-kill``: a graceful stop instead); the server is then started again on the
same store, flushed and stopped gracefully. Acknowledged spans missing from the store
(``lost_spans``) and spans stored twice (``stored_twice``) must both be 0. The server's
resident set (``VmRSS``, its child processes included) is sampled every 0.5 s during the
server phases (``rss_peak_mb``, ``rss_last_mb``).

Phases run reference, server, reference, … , server, reference (``--rounds`` server
phases; one round = one sustained run of ``--seconds``). The load average (1 min) is read
at the start and end of each phase; each server phase also records its CPU seconds split
into the server process's user and system time, this process's (the exporters and the probe) and the machine's busy and idle time (``cpu_split_seconds``):
idle near 0 means the run was bound by the machine's two cores.

The machine's own speed varies from day to day by up to 2× (a shared virtual machine):
``python_loop_ms`` is the best of five timings of ``sum(range(1_000_000))`` in this process,
taken before the first phase and after the last, so that runs of different days can be
compared (the raw reference moves with it).

``python bench/server_ingest.py [--seconds 60] [--clients 4] [--spans-per-request 1000]
[--rounds 1] [--reference-seconds 5] [--probe-poll-seconds 0.1 | --no-probe] [--no-kill]
[--server-env NAME=VALUE …]`` (``--server-env``: settings of the server under test, e.g.
``INFERPATH_SPAN_LOG=false``)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratch import scratch_folder  # noqa: E402,F401  (server_soak takes it from here too)
from server.otlp_factory import trace_body  # noqa: E402

from inferpath.demo.processes import free_port  # noqa: E402
from inferpath.server.otlp import decode_trace_request  # noqa: E402
from inferpath.storage.rows import SPAN_COLUMNS  # noqa: E402
from inferpath.storage.store import Store  # noqa: E402

PROTOBUF = {"content-type": "application/x-protobuf"}


def _free_port() -> int:
    return free_port()  # below the ephemeral range: no outgoing connection takes it first


def _start(store_url: str, port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m inferpath.server`` on ``store_url`` and ``port`` (``env``: variables added
    to this process's), once its ``/healthz`` answers; raises ``RuntimeError`` after 60 s."""
    process = subprocess.Popen(
        [sys.executable, "-m", "inferpath.server", "--port", str(port), "--store", store_url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("server did not start")


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def children(pid: int) -> list[int]:
    """Child process ids of ``pid`` (``/proc/PID/task/*/children``, Linux)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.extend(int(c) for c in (task / "children").read_text().split())
        except FileNotFoundError:
            continue
    return found


def _process_user_system_seconds(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _cpu_split(pid: int) -> dict[str, float]:
    """User and system CPU seconds of the server process, and the machine's busy and idle
    seconds (all cores, ``/proc/stat``), Linux."""
    out = dict.fromkeys(("server_user", "server_system"), 0.0)
    try:
        out["server_user"], out["server_system"] = _process_user_system_seconds(pid)
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return {key: float("nan") for key in (*out, "machine_busy", "machine_idle")}
    tick = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + ticks[4]  # idle + iowait
    out["machine_busy"], out["machine_idle"] = (sum(ticks[:8]) - idle) / tick, idle / tick
    return out


def _rss_bytes(pid: int) -> int:
    """Resident set of ``pid`` and its child processes (``VmRSS``, Linux); 0 once gone."""
    total = 0
    for one in (pid, *children(pid)):
        try:
            for line in Path(f"/proc/{one}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return total


def _async_insert_queries(client) -> int:
    """Inserts the engine of ``client`` queued for server-side batching (``AsyncInsertQuery``)."""
    rows = client.query("SELECT value FROM system.events WHERE event = 'AsyncInsertQuery'").result_rows
    return int(rows[0][0]) if rows else 0


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), from /proc (Linux)."""
    try:
        return sum(_process_user_system_seconds(pid))
    except (OSError, ValueError, IndexError):
        return float("nan")


def _check_arguments(
    seconds: float,
    clients: int,
    spans_per_request: int,
    rounds: int,
    reference_seconds: float,
    max_rate: float,
    probe_poll_seconds: float | None,
) -> None:
    """Raise ``ValueError`` naming the first argument out of range: times and rates must be
    finite and > 0, ``clients`` and ``rounds`` ≥ 1, ``spans_per_request`` a positive multiple
    of 10 (bodies hold whole 10-span traces)."""
    positive = {"seconds": seconds, "reference_seconds": reference_seconds, "max_rate": max_rate}
    if probe_poll_seconds is not None:
        positive["probe_poll_seconds"] = probe_poll_seconds
    for name, value in positive.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value}")
    for name, value in (("clients", clients), ("rounds", rounds)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if spans_per_request < 10 or spans_per_request % 10:
        raise ValueError(f"spans_per_request must be a positive multiple of 10, got {spans_per_request}")


def run(
    seconds: float = 60.0,
    clients: int = 4,
    spans_per_request: int = 1000,
    bodies: int | None = None,
    workdir: str | None = None,
    rounds: int = 1,
    reference_seconds: float = 5.0,
    max_rate: float = 60_000.0,
    probe_poll_seconds: float | None = 0.1,
    kill: bool = True,
    server_env: dict[str, str] | None = None,
) -> dict:
    """Run the benchmark; returns the figures as a dict (also printed by ``main``).

    ``max_rate`` (spans/s) sizes the pool of distinct pre-built bodies; if the server drains
    it, ``all_bodies_used`` says so and the rate is a lower bound. ``probe_poll_seconds``:
    the visibility probe's poll interval (> 0), ``None`` for no probe. ``kill``: end the
    last server phase with ``kill -9`` (module docstring); ``server_env``: variables for
    the server process (``{"INFERPATH_SPAN_LOG": "false"}``). Raises
    ``ValueError`` naming the first argument out of range (:func:`_check_arguments`).
    """
    _check_arguments(seconds, clients, spans_per_request, rounds, reference_seconds, max_rate, probe_poll_seconds)
    with scratch_folder(workdir, "inferpath-bench-") as folder:
        return _run(
            folder,
            seconds,
            clients,
            spans_per_request,
            bodies,
            rounds,
            reference_seconds,
            max_rate,
            probe_poll_seconds,
            kill,
            dict(server_env or {}),
        )


def python_loop_ms() -> float:
    """Best of five CPU timings of ``sum(range(1_000_000))``, in ms: the interpreter's speed
    on this machine now."""
    best = math.inf
    for _ in range(5):
        started = time.process_time()
        sum(range(1_000_000))
        best = min(best, time.process_time() - started)
    return round(best * 1000, 1)


def _run(
    folder: Path,
    seconds: float,
    clients: int,
    spans_per_request: int,
    bodies: int | None,
    rounds: int,
    reference_seconds: float,
    max_rate: float,
    probe_poll_seconds: float | None,
    kill: bool,
    server_env: dict[str, str],
) -> dict:
    spans_per_trace = 10
    loop_ms = [python_loop_ms()]
    count = bodies or max(clients * 4, int(seconds * max_rate / spans_per_request) + clients)
    prepared = [
        trace_body(spans_per_trace=spans_per_trace, traces=spans_per_request // spans_per_trace) for _ in range(count)
    ]
    store_url = f"chdb://{folder / 'store'}"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = _start(store_url, port, server_env)
    acked: list[int] = []
    retries = [0]
    next_body = iter(range(count))
    lock = threading.Lock()
    visible_seconds: list[float] = []
    probe_reads = [0]
    loads: list[float] = []
    phases: list[dict] = []
    rss_samples: list[int] = []
    metrics = [""]

    def server_phase(phase_seconds: float, last: bool) -> None:
        stop_at = time.monotonic() + phase_seconds
        acked_before = len(acked)
        killed = threading.Event()
        cpu_killed: list = [0.0]
        split_killed: list = [{}]

        until_killed = last and kill  # then the exporters post until the kill, so that some are in flight

        def exporter() -> None:
            with httpx.Client(base_url=url, timeout=60) as http:
                while not killed.is_set() if until_killed else time.monotonic() < stop_at:
                    with lock:
                        index = next(next_body, None)
                    if index is None:
                        return
                    while True:
                        try:
                            response = http.post("/v1/traces", content=prepared[index][0], headers=PROTOBUF)
                        except httpx.HTTPError:
                            if killed.is_set():  # killed with this export in flight: never acknowledged
                                return
                            raise
                        if response.status_code == 200:
                            with lock:
                                acked.append(index)
                            break
                        retries[0] += 1
                        time.sleep(float(response.headers.get("retry-after", "0.1")))

        def probe() -> None:
            with httpx.Client(base_url=url, timeout=60) as http:
                while time.monotonic() < stop_at and not killed.is_set():
                    # The factory's root span lasts 560 ms: start it so that it ends now.
                    ended_ns = time.time_ns()
                    body, ids = trace_body(spans_per_trace=1, start_ns=ended_ns - 560_000_000, service_name="probe")
                    trace_id = next(iter(ids))
                    try:
                        http.post("/v1/traces", content=body, headers=PROTOBUF)
                        while True:
                            probe_reads[0] += 1
                            if http.get(f"/api/v1/traces/{trace_id}").status_code == 200:
                                break
                            time.sleep(probe_poll_seconds)
                    except httpx.HTTPError:
                        if killed.is_set():
                            return
                        raise
                    visible_seconds.append((time.time_ns() - ended_ns) / 1e9)
                    time.sleep(0.2)

        loads.append(os.getloadavg()[0])
        cpu_before = _cpu_seconds(server.pid)
        split_before, bench_before = _cpu_split(server.pid), time.process_time()
        started = time.monotonic()
        threads = [threading.Thread(target=exporter) for _ in range(clients)]
        prober = threading.Thread(target=probe) if probe_poll_seconds is not None else None
        if prober is not None:
            threads.append(prober)
        for thread in threads:
            thread.start()
        while time.monotonic() < stop_at:
            rss_samples.append(_rss_bytes(server.pid))
            time.sleep(min(0.5, max(0.0, stop_at - time.monotonic())))
        if last:
            if prober is not None:  # its last probe completes before the kill
                prober.join(120)
            metrics[0] = httpx.get(f"{url}/metrics", timeout=30).text
            cpu_killed[0], split_killed[0] = _cpu_seconds(server.pid), _cpu_split(server.pid)
            if kill:  # while the exporters still post: what was answered 200 must survive it
                killed.set()
                server.kill()
                server.wait(60)
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        cpu_after = cpu_killed[0] if killed.is_set() else _cpu_seconds(server.pid)
        cpu = cpu_after - cpu_before
        split_after = split_killed[0] if killed.is_set() else _cpu_split(server.pid)
        split = {key: round(value - split_before[key], 2) for key, value in split_after.items()}
        # This process: the exporters and the probe (and Python's own threads' overhead).
        split["bench_clients"] = round(time.process_time() - bench_before, 2)
        loads.append(os.getloadavg()[0])
        spans = (len(acked) - acked_before) * spans_per_request
        phases.append(
            {
                "side": "server",
                "seconds": round(elapsed, 2),
                "spans": spans,
                "spans_per_second": round(spans / elapsed),
                "cpu_seconds": round(cpu, 2),
                "cpu_split_seconds": split,
                "load_average": loads[-1],
            }
        )

    ref_cursor = [0]

    def reference_phase(client) -> None:
        # The bare clickhouse-connect client: no checks, no dedup token, row-oriented.
        loads.append(os.getloadavg()[0])
        insert_seconds, cpu, rows_total = 0.0, 0.0, 0
        while insert_seconds < reference_seconds and ref_cursor[0] < count:
            body = prepared[ref_cursor[0]][0]
            ref_cursor[0] += 1
            rows = [
                s.to_insert_row()
                for s in decode_trace_request(body, content_type="application/x-protobuf", content_encoding=None).spans
            ]
            began, cpu_began = time.perf_counter(), time.process_time()
            client.insert("otel_traces", rows, column_names=list(SPAN_COLUMNS))
            insert_seconds += time.perf_counter() - began
            cpu += time.process_time() - cpu_began
            rows_total += len(rows)
        loads.append(os.getloadavg()[0])
        phases.append(
            {
                "side": "reference",
                "seconds": round(insert_seconds, 2),
                "spans": rows_total,
                "spans_per_second": round(rows_total / insert_seconds) if insert_seconds else 0,
                "cpu_seconds": round(cpu, 2),
                "load_average": loads[-1],
            }
        )

    async_cursor = [0]

    def async_phase(store: Store, exports: int) -> None:
        # ``clients`` threads at once, one connection each, every insert with ClickHouse's
        # async_insert and wait_for_async_insert=1; rows decoded before the clock starts.
        batches = []
        for _ in range(exports):
            body = prepared[async_cursor[0] % count][0]
            async_cursor[0] += 1
            batches.append(
                [
                    s.to_insert_row()
                    for s in decode_trace_request(
                        body, content_type="application/x-protobuf", content_encoding=None
                    ).spans
                ]
            )
        queued_before = _async_insert_queries(store._client)
        pending = iter(batches)
        take = threading.Lock()

        def inserter() -> None:
            with store._connection() as client:
                while True:
                    with take:
                        rows = next(pending, None)
                    if rows is None:
                        return
                    client.insert(
                        "otel_traces",
                        rows,
                        column_names=list(SPAN_COLUMNS),
                        settings={"async_insert": 1, "wait_for_async_insert": 1},
                    )

        threads = [threading.Thread(target=inserter) for _ in range(clients)]
        began, cpu_began = time.perf_counter(), time.process_time()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu_began
        rows_total = sum(map(len, batches))
        phases.append(
            {
                "side": "async",
                "seconds": round(wall, 2),
                "spans": rows_total,
                "spans_per_second": round(rows_total / wall) if wall else 0,
                "cpu_seconds": round(cpu, 2),
                "async_insert_queries": _async_insert_queries(store._client) - queued_before,
            }
        )

    def reference_phases(ref: Store, async_ref: Store) -> None:
        reference_phase(ref._client)
        async_phase(async_ref, max(clients, round(phases[-1]["spans"] / spans_per_request)))

    with (
        Store.open(f"chdb://{folder / 'reference'}?database=rawref") as ref,
        Store.open(f"chdb://{folder / 'reference'}?database=rawasync") as async_ref,
    ):
        reference_phases(ref, async_ref)
        for round_index in range(rounds):
            server_phase(seconds / rounds, last=round_index == rounds - 1)
            reference_phases(ref, async_ref)
    metrics = metrics[0]
    inserts = _metric(metrics, "inferpath_ingest_insert_seconds_count")
    exports = _metric(metrics, "inferpath_ingest_commits_total")
    # Whether request assembly kept up: traces derived from held spans or read back, and the
    # traces noted and not yet assembled when the last phase ended (~2 s of them if it keeps up).
    assembly = {
        name: int(_metric(metrics, f"inferpath_assembler_{name}_total"))
        for name in ("rows", "rows_from_memory", "rows_from_store", "errors")
    }
    assembly["pending_traces"] = int(_metric(metrics, "inferpath_assembler_pending_traces"))
    if kill:  # start again on the same store: what was acknowledged before the kill is inserted
        server = _start(store_url, port, server_env)
        httpx.post(f"{url}/api/v1/flush", timeout=120)
    server.send_signal(signal.SIGTERM)
    server.wait(300)
    loop_ms.append(python_loop_ms())
    acked_spans = len(acked) * spans_per_request
    expected = {s for i in acked for spans in prepared[i][1].values() for s in spans}
    with Store.open(store_url) as store:
        rows, distinct = store.query(
            "SELECT count(), uniqExact(SpanId) FROM otel_traces WHERE ServiceName = 'bench-engine'"
        )[0]
        stored = {r[0] for r in store.query("SELECT SpanId FROM otel_traces WHERE ServiceName = 'bench-engine'")}
    lost = len(expected - stored)
    server_seconds = sum(p["seconds"] for p in phases if p["side"] == "server")
    ref_seconds = sum(p["seconds"] for p in phases if p["side"] == "reference")
    ref_spans = sum(p["spans"] for p in phases if p["side"] == "reference")
    server_cpu = sum(p["cpu_seconds"] for p in phases if p["side"] == "server")
    ref_cpu = sum(p["cpu_seconds"] for p in phases if p["side"] == "reference")
    server_rate = acked_spans / server_seconds
    raw_rate = ref_spans / ref_seconds if ref_seconds else float("nan")
    async_phases = [p for p in phases if p["side"] == "async"]
    async_rate = sum(p["spans"] for p in async_phases) / max(sum(p["seconds"] for p in async_phases), 1e-9)
    return {
        "seconds": round(server_seconds, 1),
        "clients": clients,
        "spans_per_request": spans_per_request,
        "rounds": rounds,
        "acked_spans": acked_spans,
        "server_spans_per_second": round(server_rate),
        "raw_insert_spans_per_second": round(raw_rate),
        "ratio": round(server_rate / raw_rate, 3),
        "async_insert_spans_per_second": round(async_rate),
        "async_ratio": round(async_rate / raw_rate, 3),
        "async_insert_queries": sum(p["async_insert_queries"] for p in async_phases),
        "killed": kill,
        "lost_spans": lost,
        "stored_twice": int(rows) - int(distinct),
        "retries_503": retries[0],
        "rss_peak_mb": round(max(rss_samples, default=0) / 2**20, 1),
        "rss_last_mb": round(rss_samples[-1] / 2**20, 1) if rss_samples else None,
        "server_env": server_env,
        # CPU per span (all threads, both cores) is less
        # sensitive to other load than rates.
        "server_cpu_us_per_span": round(server_cpu / acked_spans * 1e6, 1) if acked_spans else None,
        "raw_insert_cpu_us_per_span": round(ref_cpu / ref_spans * 1e6, 1) if ref_spans else None,
        "exports_per_insert": round(exports / inserts, 2) if inserts else None,
        "assembly": assembly,
        "visible_p50_seconds": round(_p(visible_seconds, 0.5), 4) if visible_seconds else None,
        "visible_p99_seconds": round(_p(visible_seconds, 0.99), 4) if visible_seconds else None,
        "probes": len(visible_seconds),
        "probe_poll_seconds": probe_poll_seconds,
        "probe_reads": probe_reads[0],
        "load_average_min": min(loads),
        "load_average_max": max(loads),
        "python_loop_ms": loop_ms,
        "all_bodies_used": len(acked) == count,
        "phases": phases,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--spans-per-request", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1, help="server phases, each between two reference phases")
    parser.add_argument("--reference-seconds", type=float, default=5.0, help="insert time per reference phase")
    parser.add_argument("--max-rate", type=float, default=60_000.0, help="spans/s the body pool is sized for")
    parser.add_argument(
        "--probe-poll-seconds", type=float, default=0.1, help="the visibility probe's poll interval (> 0)"
    )
    parser.add_argument("--no-probe", action="store_true", help="run without the visibility probe")
    parser.add_argument("--no-kill", action="store_true", help="stop the server gracefully instead of kill -9")
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a variable for the server process (repeatable)",
    )
    args = parser.parse_args()
    if any("=" not in item for item in args.server_env):
        parser.error("--server-env takes NAME=VALUE")
    probe_poll_seconds = None if args.no_probe else args.probe_poll_seconds
    try:
        _check_arguments(
            args.seconds,
            args.clients,
            args.spans_per_request,
            args.rounds,
            args.reference_seconds,
            args.max_rate,
            probe_poll_seconds,
        )
    except ValueError as exc:
        parser.error(str(exc))
    result = run(
        args.seconds,
        args.clients,
        args.spans_per_request,
        rounds=args.rounds,
        reference_seconds=args.reference_seconds,
        max_rate=args.max_rate,
        probe_poll_seconds=probe_poll_seconds,
        kill=not args.no_kill,
        server_env=dict(item.split("=", 1) for item in args.server_env),
    )
    print(json.dumps(result, indent=2))
    print(
        f"server {result['server_spans_per_second']} spans/s vs raw clickhouse-connect "
        f"{result['raw_insert_spans_per_second']} spans/s: ratio {result['ratio']}; "
        f"{result['clients']} async_insert clients {result['async_insert_spans_per_second']} spans/s "
        f"(ratio {result['async_ratio']}, {result['async_insert_queries']} queued by the engine); "
        f"lost {result['lost_spans']} after {'kill -9' if result['killed'] else 'a graceful stop'}, "
        f"stored twice {result['stored_twice']}; RSS peak {result['rss_peak_mb']} MB; span end -> visible p99 {result['visible_p99_seconds']} s "
        f"(poll {result['probe_poll_seconds']} s); "
        f"load average {result['load_average_min']:.1f}-{result['load_average_max']:.1f}; "
        f"python loop {result['python_loop_ms'][0]}/{result['python_loop_ms'][1]} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
