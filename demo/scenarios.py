"""Fault scenarios: one known fault injected into the real reference path, then diagnosed.

Each run starts the inferpath server (embedded chDB, scraping the engine), the emulated
engine and the instrumented gateway as separate processes, and plays the same requests
twice: a *baseline phase* with nothing wrong, then a *fault phase* with the fault turned on
through the gateway's ``POST /admin/faults`` or the engine's ``POST /admin/config`` (or a
new process: the proxy of an extra hop, a replica that starts mid-run). Replaying exactly
the same requests (token counts of the Azure LLM trace 2023, prompts capped at
:data:`CONTEXT_TOKENS_CAP`, outputs at :data:`OUTPUT_TOKENS_CAP`) at the same relative times
makes the fault the only difference between the two windows; arrivals are a seeded Poisson
process at ``rate_per_second``, well below the engine's capacity, so the healthy path does
not queue. Then ``/api/v1/diagnosis`` compares the fault window with the baseline window.

| scenario | fault phase | cause the diagnosis must name |
|---|---|---|
| healthy | nothing changes | (healthy) |
| slow-tokenizer | +250 ms per prompt tokenization | tokenization |
| slow-retrieval | +300 ms per retrieval call | retrieval |
| network-hop | gateway → proxy (+250 ms) → engine | network_hop |
| batch-window | engine holds the queue head 500 ms to batch prefills | batching |
| kv-pressure | KV pool shrunk from 16,384 to 160 blocks (about two sequences) | gpu_memory |
| gpu-saturated | engine steps 5x longer: arrivals exceed capacity, KV ample | gpu_compute |
| cold-start | a second replica finishes loading (start-up spans) and joins; its first 5 s of requests at 8x step time | cold_start |

Scaling the engine's step time rather than the arrival rate keeps the processes' own CPU
load unchanged (on a 2-core machine 5x the arrivals saturate the gateway's event loop
first, which is a different bottleneck). The cold replica's process is started with the
others and "loads" through the baseline phase, so its interpreter start-up does not steal
CPU from the measured path when it joins.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx

from inferpath.demo.processes import ChildService, free_port, start_module, start_server
from inferpath.demo.replay import ReplayResult, replay
from inferpath.demo.trace import TraceRequest, load_trace
from inferpath.storage.url import embedded_store_url

CONTEXT_TOKENS_CAP = 2048
"""Longest prompt replayed: keeps one prefill under ~0.2 s at the scenarios' time scale."""
OUTPUT_TOKENS_CAP = 96
"""Longest output replayed (the trace's p90 is 45 tokens): bounds the length of a phase."""
ENDPOINT = "/v1/chat/completions"
WARMUP_REQUESTS = 10
WARMUP_RATE_PER_SECOND = 5.0
_ENGINE_HEALTHY: dict[str, Any] = {"batch_window_seconds": 0.0}
"""Values of engine faults that turn them off again (the tail phase); others stay as they are."""
DRAIN_SECONDS = 1.5
"""Gap after a phase's last arrival, so its requests finish before the fault is turned on."""


@dataclass(frozen=True)
class Scenario:
    """One fault and the cause it must be diagnosed as.

    ``cause``: a :data:`inferpath.vocabulary.CAUSES` name, ``None`` for the healthy run.
    ``gateway_faults`` / ``engine_faults``: bodies of ``POST /admin/faults`` (gateway) and
    ``POST /admin/config`` (engine) sent when the fault phase starts. ``proxy_delay_seconds``:
    route the gateway through a proxy that adds this delay. ``cold_replica``: start a second
    engine (``cold_replica_args``) whose loading ends as the fault phase starts, then add it to
    the gateway's rotation.
    ``fault_rate_multiplier``: arrivals of the fault phase come this many times faster.
    ``engine_faults`` values that scale (``time_scale``) multiply the scenario's own setting.
    """

    name: str
    cause: str | None
    description: str
    gateway_faults: dict[str, Any] = field(default_factory=dict)
    engine_faults: dict[str, Any] = field(default_factory=dict)
    proxy_delay_seconds: float | None = None
    cold_replica: bool = False
    cold_replica_args: tuple[str, ...] = ("--cold-seconds", "5", "--cold-slowdown", "8")
    fault_rate_multiplier: float = 1.0


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("healthy", None, "no fault: the same requests twice"),
        Scenario(
            "slow-tokenizer",
            "tokenization",
            "tokenization takes 250 ms longer (a pure-Python tokenizer)",
            gateway_faults={"tokenize_delay_seconds": 0.25},
        ),
        Scenario(
            "slow-retrieval",
            "retrieval",
            "each retrieval call takes 300 ms longer (a slow vector store)",
            gateway_faults={"retrieval_delay_seconds": 0.3},
        ),
        Scenario(
            "network-hop",
            "network_hop",
            "an extra proxy hop adding 250 ms between gateway and engine",
            proxy_delay_seconds=0.25,
        ),
        Scenario(
            "batch-window",
            "batching",
            "the engine holds new requests 500 ms to batch their prefills",
            engine_faults={"batch_window_seconds": 0.5},
        ),
        Scenario(
            "kv-pressure",
            "gpu_memory",
            "the KV-cache pool shrinks to 160 blocks (2,560 tokens)",
            engine_faults={"num_kv_blocks": 160},
        ),
        Scenario(
            "gpu-saturated",
            "gpu_compute",
            "every engine step takes 5x longer (a GPU shared with another "
            "job): the same arrivals now exceed its capacity, KV ample",
            engine_faults={"time_scale": 5.0},
        ),
        Scenario(
            "cold-start",
            "cold_start",
            "a second replica finishes loading mid-run and serves its first requests cold",
            cold_replica=True,
        ),
    )
}


@dataclass
class ScenarioOptions:
    """How a scenario runs: load, engine speed, where the store and the logs go."""

    requests_per_phase: int = 60
    rate_per_second: float = 6.0
    time_scale: float = 0.2
    kv_blocks: int = 16384
    seed: int = 7
    store_url: str | None = None
    log_dir: Path | None = None
    settle_timeout_seconds: float = 30.0
    engine_args: list[str] = field(default_factory=list)
    server_env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the server process (e.g. ``INFERPATH_ALERT_RULES``)."""
    tail_seconds: float = 0.0
    """After the diagnosis, keep the processes running this long with the fault turned off
    and no traffic, so sliding-window consumers (the alert evaluator) see the fault end."""
    port: int | None = None
    """The inferpath server's port (None: any free port)."""
    trace_path: Path | None = None
    """The trace whose token counts are replayed (default: the Azure code trace)."""
    on_done: Callable[[ScenarioOutcome, Sequence[ChildService]], None] | None = None
    """Called with the outcome while every process still runs (``inferpath demo`` prints it
    and serves the dashboard on the incident until Ctrl-C); the processes stop after it."""


@dataclass
class ScenarioOutcome:
    """What a scenario run produced: windows, client results and the diagnosis (JSON form)."""

    scenario: Scenario
    server_url: str
    baseline_window: tuple[datetime, datetime]
    fault_window: tuple[datetime, datetime]
    results: list[ReplayResult]
    verdict: dict[str, Any]
    timings_seconds: dict[str, float]
    store_url: str = ""
    log_dir: Path | None = None

    @property
    def diagnosed_cause(self) -> str | None:
        """The cause named first, ``"healthy"`` for a healthy verdict, ``None`` for no cause."""
        return "healthy" if self.verdict.get("healthy") else self.verdict.get("top_cause")

    @property
    def correct(self) -> bool:
        """The injected cause was named first (healthy for the healthy scenario)."""
        return self.diagnosed_cause == (self.scenario.cause or "healthy")


def scenario_requests(
    count: int, rate_per_second: float, seed: int, trace_path: Path | None = None
) -> list[TraceRequest]:
    """The first ``count`` requests of a trace (default: the Azure code trace; any format of
    :mod:`inferpath.demo.trace`), token counts capped, re-timed as a Poisson process of
    ``rate_per_second`` (seeded, so every run plays the same arrivals)."""
    if count < 1 or rate_per_second <= 0:
        raise ValueError(f"count must be >= 1 and rate_per_second > 0, got {count}, {rate_per_second}")
    rng = random.Random(seed)
    at, out = 0.0, []
    for request in load_trace(trace_path, limit=count).requests:
        out.append(
            TraceRequest(
                request.index,
                at,
                min(request.context_tokens, CONTEXT_TOKENS_CAP),
                min(request.generated_tokens, OUTPUT_TOKENS_CAP),
            )
        )
        at += rng.expovariate(rate_per_second)
    return out


def two_phases(requests: list[TraceRequest], rate_multiplier: float) -> tuple[list[TraceRequest], float]:
    """The baseline phase followed by the same requests again (arrivals compressed by
    ``rate_multiplier``); returns the combined list and the fault phase's start offset (s)."""
    fault_start = requests[-1].arrival_offset_seconds + DRAIN_SECONDS
    fault = [
        replace(
            r,
            index=len(requests) + r.index,
            arrival_offset_seconds=fault_start + r.arrival_offset_seconds / rate_multiplier,
        )
        for r in requests
    ]
    return requests + fault, fault_start


async def _post(url: str, body: dict[str, Any]) -> None:
    async with httpx.AsyncClient(timeout=10.0) as client:
        (await client.post(url, json=body)).raise_for_status()


def _start_cold_replica(
    scenario: Scenario, options: ScenarioOptions, server_url: str, loading_seconds: float, log_dir: Path
) -> ChildService:
    """A second engine whose emulated loading lasts ``loading_seconds`` (it listens only then)."""
    port = free_port()
    return start_module(
        "engine-2",
        "inferpath.demo.engine",
        [
            "--port",
            str(port),
            "--otlp-endpoint",
            server_url,
            "--time-scale",
            str(options.time_scale),
            "--kv-blocks",
            str(options.kv_blocks),
            "--startup-seconds",
            f"{loading_seconds:.2f}",
            *options.engine_args,
            *scenario.cold_replica_args,
        ],
        port=port,
        log_path=str(log_dir / "engine-2.log"),
    )


async def _join_when_ready(replica: ChildService, gateway_url: str, engine_url: str) -> None:
    # Like a load balancer behind a readiness probe: routed to once it answers.
    await asyncio.to_thread(replica.wait_ready, "/health", 120.0)
    await _post(f"{gateway_url}/admin/faults", {"engine_urls": [engine_url, replica.url]})


def run_scenario(
    name: str, options: ScenarioOptions | None = None, log: Callable[[str], None] = print
) -> ScenarioOutcome:
    """Run scenario ``name`` (a key of :data:`SCENARIOS`) end to end and diagnose it.

    Raises ``KeyError`` for an unknown name, ``RuntimeError`` if a process fails to start or
    the diagnosis cannot be read.
    """
    if name not in SCENARIOS:
        raise KeyError(f"unknown scenario {name!r}; one of {', '.join(SCENARIOS)}")
    scenario, options = SCENARIOS[name], options or ScenarioOptions()
    log_dir = options.log_dir or Path(tempfile.mkdtemp(prefix=f"inferpath-{name}-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    store_url = options.store_url or embedded_store_url(log_dir / "store")
    timings: dict[str, float] = {}
    children: list[ChildService] = []
    t0 = time.perf_counter()
    try:
        server_port = options.port or free_port()
        engine_port, gateway_port = free_port(), free_port()
        engine_url = f"http://127.0.0.1:{engine_port}"
        server = start_server(store_url, server_port, engine_url, log_dir, extra_env=dict(options.server_env))
        children.append(server)
        engine = start_module(
            "engine",
            "inferpath.demo.engine",
            [
                "--port",
                str(engine_port),
                "--otlp-endpoint",
                server.url,
                "--time-scale",
                str(options.time_scale),
                "--kv-blocks",
                str(options.kv_blocks),
                *options.engine_args,
            ],
            port=engine_port,
            log_path=str(log_dir / "engine.log"),
        )
        children.append(engine)
        gateway = start_module(
            "gateway",
            "inferpath.demo.gateway",
            ["--port", str(gateway_port), "--engine-url", engine_url, "--otlp-endpoint", server.url],
            port=gateway_port,
            log_path=str(log_dir / "gateway.log"),
        )
        children.append(gateway)
        proxy = None
        if scenario.proxy_delay_seconds is not None:
            proxy_port = free_port()
            proxy = start_module(
                "proxy",
                "inferpath.demo.proxy",
                [
                    "--port",
                    str(proxy_port),
                    "--upstream",
                    engine_url,
                    "--delay-seconds",
                    str(scenario.proxy_delay_seconds),
                ],
                port=proxy_port,
                log_path=str(log_dir / "proxy.log"),
            )
            children.append(proxy)
        for child in children:
            child.wait_ready("/healthz" if child is server else "/health")
        timings["start"] = time.perf_counter() - t0
        requests, fault_offset = two_phases(
            scenario_requests(options.requests_per_phase, options.rate_per_second, options.seed, options.trace_path),
            scenario.fault_rate_multiplier,
        )
        cold = (
            _start_cold_replica(scenario, options, server.url, fault_offset + 1.0, log_dir)
            if scenario.cold_replica
            else None
        )
        if cold is not None:
            children.append(cold)
            time.sleep(3.0)  # its interpreter start-up, out of the measured phases
        log(f"scenario {name}: {scenario.description}; server {server.url}, logs in {log_dir}")

        from inferpath.instrumentation.provider import configure
        from inferpath.instrumentation.provider import shutdown as shutdown_tracing

        configure("demo-client", endpoint_class="interactive", otlp_endpoint=server.url)

        async def play() -> list[ReplayResult]:
            async def inject() -> None:
                await asyncio.sleep(max(0.0, fault_offset - 0.3))
                if scenario.gateway_faults:
                    await _post(f"{gateway.url}/admin/faults", scenario.gateway_faults)
                if scenario.engine_faults:
                    faults = dict(scenario.engine_faults)
                    if "time_scale" in faults:
                        faults["time_scale"] *= options.time_scale
                    await _post(f"{engine.url}/admin/config", faults)
                if proxy is not None:
                    await _post(f"{gateway.url}/admin/faults", {"engine_urls": [proxy.url]})
                if cold is not None:
                    await _join_when_ready(cold, gateway.url, engine_url)

            injector = asyncio.create_task(inject())
            results = await replay(gateway.url, requests, speed=1.0)
            await injector
            return results

        t1 = time.perf_counter()
        # Warm-up outside both windows: the first requests through fresh processes pay for lazy
        # imports, connection set-up and first inserts, which would inflate the baseline's tail.
        asyncio.run(
            replay(
                gateway.url,
                scenario_requests(WARMUP_REQUESTS, WARMUP_RATE_PER_SECOND, options.seed + 1, options.trace_path),
                speed=1.0,
            )
        )
        timings["warm-up"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        start = datetime.now(timezone.utc)
        results = asyncio.run(play())
        end = datetime.now(timezone.utc) + timedelta(seconds=1)
        timings["replay"] = time.perf_counter() - t1
        shutdown_tracing()
        fault_start = start + timedelta(seconds=fault_offset)
        failed = [r for r in results if r.error]
        if failed:
            log(f"{len(failed)} of {len(results)} requests failed; first: {failed[0].error}")

        t2 = time.perf_counter()
        verdict = _diagnose_when_stored(
            server.url,
            start,
            fault_start,
            end,
            expected=sum(1 for r in results if r.trace_id),
            timeout_seconds=options.settle_timeout_seconds,
        )
        timings["assembly + diagnosis"] = time.perf_counter() - t2
        if options.tail_seconds > 0:
            # Only engine faults are turned off; the tail carries no traffic either way.
            reset = {key: _ENGINE_HEALTHY[key] for key in scenario.engine_faults if key in _ENGINE_HEALTHY}
            if "time_scale" in scenario.engine_faults:
                reset["time_scale"] = options.time_scale
            if "num_kv_blocks" in scenario.engine_faults:
                reset["num_kv_blocks"] = options.kv_blocks
            if reset:
                asyncio.run(_post(f"{engine.url}/admin/config", reset))
            time.sleep(options.tail_seconds)
            timings["tail"] = options.tail_seconds
        outcome = ScenarioOutcome(
            scenario,
            server.url,
            (start, fault_start),
            (fault_start, end),
            results,
            verdict,
            timings,
            store_url,
            log_dir,
        )
        if options.on_done is not None:
            options.on_done(outcome, list(children))
        return outcome
    finally:
        for child in reversed(children):
            child.stop()


def _diagnose_when_stored(
    server_url: str, start: datetime, fault_start: datetime, end: datetime, *, expected: int, timeout_seconds: float
) -> dict[str, Any]:
    """Flush until ``expected`` rows are stored (or time runs out), then read the diagnosis."""
    window = {"start": start.isoformat(), "end": end.isoformat()}
    deadline = time.monotonic() + timeout_seconds
    with httpx.Client(base_url=server_url, timeout=120.0) as client:
        while True:
            client.post("/api/v1/flush").raise_for_status()
            count = int(client.get("/api/v1/requests/count", params=window).json()["count"])
            if count >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        # Late engine spans re-assemble rows: one more flush after they had time to arrive.
        time.sleep(1.0)
        client.post("/api/v1/flush").raise_for_status()
        response = client.get(
            "/api/v1/diagnosis",
            params={
                "start": fault_start.isoformat(),
                "end": end.isoformat(),
                "baseline_start": start.isoformat(),
                "baseline_end": fault_start.isoformat(),
                "endpoint": ENDPOINT,
            },
        )
        if response.status_code != 200:
            raise RuntimeError(f"diagnosis failed ({response.status_code}): {response.text}")
        return response.json()


def confusion_table(outcomes: list[ScenarioOutcome]) -> str:
    """A plain-text confusion table: one row per injected scenario, the cause named first, and
    whether it matches; then the count of correct diagnoses."""
    lines = [f"{'scenario':<16} {'expected':<14} {'diagnosed':<14} ok", "-" * 50]
    for outcome in outcomes:
        lines.append(
            f"{outcome.scenario.name:<16} {outcome.scenario.cause or 'healthy':<14} "
            f"{outcome.diagnosed_cause or '-':<14} {'yes' if outcome.correct else 'NO'}"
        )
    lines.append(f"{sum(o.correct for o in outcomes)}/{len(outcomes)} named correctly")
    return "\n".join(lines)


__all__ = [
    "CONTEXT_TOKENS_CAP",
    "OUTPUT_TOKENS_CAP",
    "SCENARIOS",
    "Scenario",
    "ScenarioOptions",
    "ScenarioOutcome",
    "confusion_table",
    "run_scenario",
    "scenario_requests",
    "two_phases",
]
