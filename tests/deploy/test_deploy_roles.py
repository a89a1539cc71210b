"""Each role run with the command its manifest gives, on loopback: server → agent/app push →
read API (as the dashboard queries it), the dashboard's own process, and the schema Job.

The server runs on an embedded chDB store standing in for ClickHouse, unless
``INFERPATH_TEST_CLICKHOUSE_URL`` names a reachable ClickHouse server
(``http://user:password@host:8123/db``), in which case it runs exactly in ClickHouse mode.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
from deploy_manifests import compose, workload

from inferpath.demo.processes import free_port as _free_port

TOKEN = "role-test-token"
DASHBOARD_SCRIPT = "/opt/inferpath/dashboard_app.py"
STARTUP_TIMEOUT_SECONDS = 60.0


def _local_argv(command: list[str]) -> list[str]:
    """The manifest's command with `inferpath`/`python` resolved in this environment."""
    bin_dir = Path(sys.executable).parent
    head = {"python": sys.executable, "inferpath": str(bin_dir / "inferpath")}
    return [head.get(command[0], command[0]), *command[1:]]


def _wait_http(url: str, process: subprocess.Popen, timeout_seconds: float = STARTUP_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[:3]} exited with {process.returncode} before serving {url}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout_seconds} s")


def _stop(process: subprocess.Popen, sig: int = signal.SIGINT) -> int:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    return process.returncode


class RunningRole:
    def __init__(self, url: str, process: subprocess.Popen, log_path: Path) -> None:
        self.url, self.process, self.log_path = url, process, log_path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRole]:
    """The compose `server` service's command and environment, moved to loopback."""
    service = compose()["services"]["server"]
    folder = tmp_path_factory.mktemp("server-role")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERPATH_", "CLICKHOUSE_"))}
    env.update({key: str(value) for key, value in service["environment"].items()})
    # The manifest's ClickHouse URL points at the compose network; here either a real
    # ClickHouse server from the environment or the embedded engine stands in.
    assert env["INFERPATH_STORE"].startswith("http://")
    env["INFERPATH_STORE"] = os.environ.get("INFERPATH_TEST_CLICKHOUSE_URL") or f"chdb://{folder / 'store'}"
    env.pop("CLICKHOUSE_PASSWORD", None)
    env.update(
        INFERPATH_HOST="127.0.0.1",
        INFERPATH_PORT=str(port),
        INFERPATH_TOKEN=TOKEN,
        INFERPATH_ASSEMBLY_SETTLE_SECONDS="0.5",
    )
    log_path = folder / "server.log"
    with open(log_path, "wb") as log:
        # SIGINT back to its default in the child: a test run started in the background
        # by a shell inherits it ignored, and the image's stop signal would then do nothing.
        process = subprocess.Popen(
            _local_argv(service["command"]),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{url}/healthz", process)
    except BaseException as exc:
        _stop(process, signal.SIGKILL)
        raise RuntimeError(log_path.read_text(errors="replace")[-2000:]) from exc
    yield RunningRole(url, process, log_path)
    _stop(process)


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def _send_gateway_trace(server_url: str) -> str:
    """A gateway SERVER span with a tokenize child, through the standard OTLP/HTTP exporter
    (what an instrumented service sends); returns the trace id as 32 hex digits."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind

    provider = TracerProvider(
        resource=Resource.create({"service.name": "role-test-gateway", "inferpath.endpoint_class": "interactive"})
    )
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{server_url}/v1/traces", headers=_auth(), timeout=10))
    )
    tracer = provider.get_tracer("role-test")
    with tracer.start_as_current_span(
        "POST /v1/chat/completions",
        kind=SpanKind.SERVER,
        attributes={
            "inferpath.stage": "gateway",
            "http.request.method": "POST",
            "http.route": "/v1/chat/completions",
            "inferpath.endpoint": "/v1/chat/completions",
            "inferpath.endpoint_class": "interactive",
            "http.response.status_code": 200,
            "gen_ai.response.time_to_first_chunk": 0.02,
        },
    ) as root:
        with tracer.start_as_current_span(
            "tokenize", attributes={"inferpath.stage": "tokenize", "gen_ai.usage.input_tokens": 12}
        ):
            time.sleep(0.005)
        time.sleep(0.03)
    trace_id = format(root.get_span_context().trace_id, "032x")
    provider.shutdown()
    return trace_id


def _flush(server_url: str) -> None:
    response = httpx.post(f"{server_url}/api/v1/flush", headers=_auth(), timeout=60)
    assert response.status_code == 200, response.text


def test_server_role_guards_with_the_token_from_its_environment(server: RunningRole) -> None:
    assert httpx.get(f"{server.url}/healthz", timeout=5).json()["status"] == "ok"
    assert httpx.get(f"{server.url}/api/v1/requests/count", timeout=5).status_code == 401
    assert httpx.get(f"{server.url}/api/v1/requests/count", headers=_auth(), timeout=5).status_code == 200


def test_spans_flow_from_an_app_through_the_server_to_the_dashboard_query(server: RunningRole) -> None:
    from inferpath.dashboard.client import ReadApiClient

    start = datetime.now(timezone.utc) - timedelta(minutes=1)
    trace_id = _send_gateway_trace(server.url)
    _flush(server.url)
    dashboard_env = compose()["services"]["dashboard"]["environment"]
    assert dashboard_env["INFERPATH_SERVER_URL"] == "http://server:4318"
    # The dashboard's client, as the dashboard process builds it from its environment.
    with ReadApiClient(server.url, token=TOKEN) as client:
        end = datetime.now(timezone.utc) + timedelta(minutes=1)
        requests = client.requests(start, end, limit=10)
        assert trace_id in set(requests["trace_id"])
        row = requests.set_index("trace_id").loc[trace_id]
        assert row["endpoint_class"] == "interactive"
        assert row["ttft_ns"] == 20_000_000
        assert row["tokenize_ns"] > 0
        summary = client.summary(start, end)
        assert summary.attrs.get("request_count", 0) >= 1


def _collect_options() -> set[str]:
    """Every option name `inferpath collect` accepts, from the installed CLI itself."""
    import typer

    from inferpath.cli import app

    command = typer.main.get_command(app).commands["collect"]
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)}


def test_every_agent_command_uses_options_inferpath_collect_accepts() -> None:
    options = _collect_options()
    commands = {
        name: service["command"]
        for name, service in compose()["services"].items()
        if service.get("command", [None])[:2] == ["inferpath", "collect"]
    }
    commands["DaemonSet inferpath-agent"] = workload("DaemonSet", "inferpath-agent")["spec"]["template"]["spec"][
        "containers"
    ][0]["command"]
    assert {"agent", "agent-gpu"} <= set(commands)
    for name, command in commands.items():
        assert command[:2] == ["inferpath", "collect"], name
        used = {arg for arg in command[2:] if arg.startswith("--")}
        assert used and used <= options, (name, used - options)


def test_agent_role_pushes_recorded_dcgm_metrics_to_the_server(
    server: RunningRole, shared_data: Path, serve_app
) -> None:
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    from inferpath.dashboard.client import ReadApiClient

    recorded = (shared_data / "dcgm_exporter_metrics" / "cncf_ai_conformance_upcloud_L40S.prom").read_text()
    exporter = FastAPI()
    exporter.get("/metrics", response_class=PlainTextResponse)(lambda: recorded)
    command = compose()["services"]["agent-gpu"]["command"]
    assert command[:3] == ["inferpath", "collect", "--nvml"]
    with serve_app(exporter) as exporter_url:
        argv = []
        skip_next = False
        for position, arg in enumerate(command):
            if skip_next:
                skip_next = False
                continue
            if arg == "--nvml":
                continue  # NVML is the hardware boundary: no GPU on this machine
            if arg == "--scrape" and command[position + 1].startswith("vllm="):
                skip_next = True
                continue
            argv.append(arg)
        argv = [re.sub(r"^dcgm=.*", f"dcgm={exporter_url}/metrics", a) for a in argv]
        argv[argv.index("--server") + 1] = server.url
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERPATH_")}
        env["INFERPATH_TOKEN"] = TOKEN
        agent = subprocess.Popen(
            _local_argv(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        try:
            start = datetime.now(timezone.utc) - timedelta(minutes=1)
            deadline = time.monotonic() + 30
            frame = None
            with ReadApiClient(server.url, token=TOKEN) as client:
                while time.monotonic() < deadline:
                    _flush(server.url)
                    frame = client.gauge_timeseries(
                        "gpu_utilization_ratio",
                        start,
                        datetime.now(timezone.utc) + timedelta(minutes=1),
                        step_seconds=60,
                    )
                    if len(frame):
                        break
                    assert agent.poll() is None, agent.stdout.read().decode(errors="replace")[-2000:]
                    time.sleep(0.5)
            assert frame is not None and len(frame), "no agent metric reached the read API in 30 s"
            assert ((frame["value"] >= 0) & (frame["value"] <= 1)).all()
        finally:
            _stop(agent)


def test_dashboard_role_serves_with_its_manifest_command(server: RunningRole) -> None:
    from inferpath.dashboard.launch import APP_PATH, wait_until_ready

    service = compose()["services"]["dashboard"]
    port = _free_port()
    argv = [str(APP_PATH) if arg == DASHBOARD_SCRIPT else arg for arg in service["command"]]
    argv[argv.index("--server.port") + 1] = str(port)
    argv[argv.index("--server.address") + 1] = "127.0.0.1"
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERPATH_")}
    env.update(INFERPATH_SERVER_URL=server.url, INFERPATH_TOKEN=TOKEN)
    process = subprocess.Popen(
        _local_argv(argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
    )
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", timeout_seconds=STARTUP_TIMEOUT_SECONDS, process=process)
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200
    finally:
        _stop(process, signal.SIGTERM)


def test_server_stops_gracefully_on_the_image_stop_signal(server: RunningRole) -> None:
    # Last in this module: SIGINT (the Dockerfile's STOPSIGNAL) must end `inferpath up` cleanly.
    assert _stop(server.process, signal.SIGINT) == 0, server.log_path.read_text(errors="replace")[-2000:]


def test_schema_job_render_command_produces_cluster_ddl(tmp_path: Path) -> None:
    job = workload("Job", "inferpath-cluster-schema")
    render = job["spec"]["template"]["spec"]["initContainers"][0]["command"]
    script = render[2].replace("/ddl/", f"{tmp_path}/").replace("python ", f"{sys.executable} ", 1)
    result = subprocess.run(["sh", "-c", script], capture_output=True, timeout=60, text=True)
    assert result.returncode == 0, result.stderr
    ddl = (tmp_path / "cluster.sql").read_text()
    assert "CREATE DATABASE IF NOT EXISTS `inferpath` ON CLUSTER `inferpath`" in ddl
    for table in (
        "otel_traces",
        "otel_metrics_gauge",
        "otel_metrics_sum",
        "otel_metrics_histogram",
        "inferpath_requests",
    ):
        assert re.search(rf"Distributed\(`inferpath`, `inferpath`, {table}_local\b", ddl), table
        assert f"`inferpath`.{table}_local ON CLUSTER `inferpath`" in ddl, table
    assert "ReplicatedReplacingMergeTree(" in ddl
