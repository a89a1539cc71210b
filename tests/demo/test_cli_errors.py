"""Bad input to the command line gets a clear message naming what was wrong, never a traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from typer.testing import CliRunner

from inferpath.cli import app
from inferpath.demo.run import DemoOptions, run_demo

runner = CliRunner()


def test_invalid_environment_value_names_the_variable() -> None:
    result = runner.invoke(app, ["up", "--no-dashboard"], env={"INFERPATH_PORT": "abc"})
    assert result.exit_code == 2
    assert "INFERPATH_PORT" in result.output and "'abc'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("value", ["abc", "-1", "inf"])
def test_a_setting_without_a_flag_names_only_its_variable(value: str) -> None:
    result = runner.invoke(app, ["up", "--no-dashboard"], env={"INFERPATH_ROLLUP_INTERVAL_SECONDS": value})
    assert result.exit_code == 2
    assert "INFERPATH_ROLLUP_INTERVAL_SECONDS" in result.output and repr(value) in result.output
    assert "--rollup-interval-seconds" not in result.output  # no such option exists
    assert len(result.output.strip().splitlines()) == 1


def test_server_module_names_the_variable_in_one_line(tmp_path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "INFERPATH_ROLLUP_MIN_WINDOW_SECONDS": "-5", "INFERPATH_STORE": f"chdb://{tmp_path}/s"}
    done = subprocess.run(
        [sys.executable, "-m", "inferpath.server"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "invalid configuration: INFERPATH_ROLLUP_MIN_WINDOW_SECONDS = '-5': Input should be greater than or equal to 0"
    ]


@pytest.mark.parametrize("command", [["up", "--no-dashboard"], ["demo", "--exit"]])
def test_bad_store_url_is_named_before_anything_starts(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--store", "bogus://x"])
    assert result.exit_code == 2
    assert "invalid store URL 'bogus://x'" in result.output and "scheme" in result.output


def test_replay_rejects_a_gateway_that_is_not_a_url() -> None:
    result = runner.invoke(app, ["replay", "--gateway", "notaurl"])
    assert result.exit_code == 2 and "--gateway" in result.output


@contextmanager
def port_taken() -> Iterator[int]:
    """A loopback port someone else listens on, for the duration."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_demo_refuses_a_port_someone_else_serves_on(tmp_path) -> None:
    with port_taken() as port:
        with pytest.raises(RuntimeError, match=f"{port} is already in use"):
            run_demo(
                DemoOptions(
                    requests=1,
                    exit_when_done=True,
                    port=port,
                    dashboard=False,
                    store_url=f"chdb://{tmp_path}/store",
                    log_dir=tmp_path / "logs",
                )
            )


def test_demo_checks_the_dashboard_port_and_results_folder_before_starting_anything(tmp_path) -> None:
    with port_taken() as port:
        with pytest.raises(RuntimeError, match=f"dashboard port 127.0.0.1:{port} is already in use.*--dashboard-port"):
            run_demo(
                DemoOptions(
                    requests=1,
                    exit_when_done=False,
                    port=0,
                    dashboard_port=port,
                    store_url=f"chdb://{tmp_path}/store",
                    log_dir=tmp_path / "logs",
                )
            )
    with pytest.raises(RuntimeError, match="cannot write the results to .*folder .*missing does not exist"):
        run_demo(
            DemoOptions(
                requests=1,
                exit_when_done=True,
                port=0,
                dashboard=False,
                results_path=tmp_path / "missing" / "results.jsonl",
                store_url=f"chdb://{tmp_path}/store",
                log_dir=tmp_path / "logs",
            )
        )
    assert not (tmp_path / "store").exists()  # nothing was started


@pytest.mark.parametrize(
    "args, env", [(["--scrape", "garbage"], {}), ([], {"INFERPATH_SCRAPE_TARGETS": "vllm=garbage"})]
)
def test_a_scrape_target_that_is_not_a_url_stops_the_start(args, env) -> None:
    result = runner.invoke(app, ["up", "--no-dashboard", *args], env=env)
    assert result.exit_code == 2
    assert "must be an http(s)://host[:port]/path URL, got 'garbage'" in result.output
    assert "Traceback" not in result.output


def test_start_up_errors_name_their_real_cause(tmp_path) -> None:
    import os
    import subprocess
    import sys

    def up(*args: str, **env: str) -> str:
        result = runner.invoke(app, ["up", "--no-dashboard", *args], env=env)
        assert result.exit_code == 2 and "Traceback" not in result.output
        return " ".join(result.output.split())

    # A store folder that cannot be made is the store's problem, not the port's.
    unmakeable = up("--store", "chdb:///proc/forbidden/store", "--port", "0")
    assert "cannot open the store chdb:///proc/forbidden/store" in unmakeable
    assert "--port" not in unmakeable and "owned by one process" not in unmakeable
    # A host that is not this machine's is the host's problem.
    host = up("--store", f"chdb://{tmp_path}/s1", "--port", "0", INFERPATH_HOST="999.1.1.1")
    assert "cannot listen on 999.1.1.1:0" in host and "--host" in host and "another inferpath server" not in host
    assert not (tmp_path / "s1").exists()  # refused before a store folder was made
    # A ClickHouse server that refuses: no word of chDB.
    refused = up("--store", "http://127.0.0.1:9/db", "--port", "0")
    assert "cannot open the store http://127.0.0.1:9/db" in refused and "chDB" not in refused
    assert "cannot reach ClickHouse at 127.0.0.1:9 (connection refused)" in " ".join(refused.split())
    assert "HTTPConnectionPool" not in refused
    # The server module (the demo's child) says the same in one line, without a traceback.
    env = {**os.environ, "INFERPATH_STORE": "chdb:///proc/forbidden/store"}
    done = subprocess.run(
        [sys.executable, "-m", "inferpath.server", "--port", "0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("cannot open the store chdb:///proc/forbidden/store")


def test_server_module_help_names_defaults_and_variables(capsys) -> None:
    from inferpath.server.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal's width
    for expected in (
        "INFERPATH_HOST or 127.0.0.1",
        "INFERPATH_PORT or 4318",
        "INFERPATH_STORE or embedded chDB",
        "INFERPATH_SCRAPE_TARGETS or none",
        "INFERPATH_TOKEN (a bearer token",
        "INFERPATH_MAX_BODY_BYTES (413 above it, default 16777216 bytes)",
        "inferpath/config.py",
    ):
        assert expected in text


def test_server_log_keeps_its_own_messages_and_not_the_scrapes(tmp_path, serve_app) -> None:
    # Two scrape targets polled about once a second each: httpx logs every GET at INFO.
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    engine = FastAPI()

    @engine.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> str:
        return "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"

    with serve_app(engine) as engine_url:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "inferpath.server",
                "--port",
                "0",
                "--store",
                f"chdb://{tmp_path / 'store'}",
                "--scrape",
                f"vllm={engine_url}/metrics",
                "--scrape",
                f"dcgm={engine_url}/metrics",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(8.0)
        finally:
            server.terminate()
            log = server.communicate(timeout=60)[1]
    assert "INFO inferpath.server.runtime: inferpath server listening on" in log, log
    assert "HTTP Request" not in log and " INFO httpx" not in log and " INFO httpcore" not in log, log


def test_demo_on_a_taken_port_exits_2_as_up_does(tmp_path) -> None:
    # A child process, so that a regression (the demo starting anyway) cannot hang the test.
    with port_taken() as port:
        done = subprocess.run(
            [sys.executable, "-m", "inferpath.cli", "demo", "--exit", "--port", str(port)]
            + ["--store", f"chdb://{tmp_path / 'store'}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert said.startswith(f"demo cannot start: the inferpath server port 127.0.0.1:{port} is already in use"), said
    assert "--port" in said


def test_demo_on_a_host_of_another_machine_exits_2_naming_it(tmp_path) -> None:
    import os

    done = subprocess.run(
        [sys.executable, "-m", "inferpath.cli", "demo", "--exit", "--port", "0"]
        + ["--store", f"chdb://{tmp_path / 'store'}"],
        env={**os.environ, "INFERPATH_HOST": "999.1.1.1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert said.startswith("demo cannot start: cannot listen on 999.1.1.1:0 for the inferpath server port"), said
    assert "INFERPATH_HOST" in said and not (tmp_path / "store").exists()


def test_a_reader_that_stops_reading_does_not_change_the_exit_code() -> None:
    # `inferpath diagnose | head -1`: head exits, the next write meets a closed pipe. The
    # command's stdout drops the rest instead of raising (click would exit 1: "degraded").
    import io
    import os

    from inferpath.cli import _ClosablePipe

    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = io.TextIOWrapper(os.fdopen(write_end, "wb"), encoding="utf-8")
    pipe = _ClosablePipe(stream)
    assert pipe.write("x" * 100_000) == 100_000  # more than a pipe holds: the write reaches it
    pipe.flush()
    pipe.write("after\n")
    pipe.flush()  # now into /dev/null
    assert os.readlink(f"/proc/self/fd/{stream.fileno()}") == os.devnull
    stream.close()


@pytest.mark.parametrize(
    ("args", "error", "env"),
    [
        (["whatif", "--from", "-30m", "--replicas", "two"], "Invalid value for '--replicas'", {}),
        (["diagnose", "--since", "1h", "--objective", "x"], "No such option: --objective", {}),
        (["import", "x.tar.gz"], "invalid configuration: INFERPATH_TTL_DAYS = 'abc'", {"INFERPATH_TTL_DAYS": "abc"}),
    ],
)
def test_with_json_a_bad_option_is_a_json_error_too(args: list[str], error: str, env: dict[str, str]) -> None:
    # Scripts parse stdout: click's usage text there (on stderr, exit 2) read as no answer.
    import os

    run = subprocess.run(
        [sys.executable, "-c", "from inferpath.cli import main; main()", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert json.loads(run.stdout)["error"].startswith(error), run.stdout


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (
            ["alerts", "test", "default", "--from", "2099-01-01T00:00:00Z"],
            "--from 2099-01-01T00:00:00+00:00 is in the future",
        ),
        (["diagnose", "--from", "2099-01-01T00:00:00Z"], "--from 2099-01-01T00:00:00+00:00 is in the future"),
        (
            ["whatif", "--from", "2099-01-01T00:00:00Z", "--replicas", "2"],
            "--from 2099-01-01T00:00:00+00:00 is in the future",
        ),
        (["whatif", "--from", "-1h", "--to", "-2h", "--replicas", "2"], "--to must be after --from"),
        (["alerts", "test", "default", "--from", "-1h", "--to", "-2h"], "--to must be after --from"),
        (["diagnose", "--since", "1h", "--from", "-2h"], "give --since or --from, not both"),
        (["alerts", "test", "default", "--since", "5x"], "--since: expected a duration"),
        (
            ["diagnose", "--from", "-1h", "--baseline-from", "-2h", "--baseline-to", "-3h"],
            "--baseline-to must be after --baseline-from",
        ),
    ],
)
def test_every_command_reads_its_window_alike_and_names_the_option(command: list[str], message: str) -> None:
    # One parser (timespec.command_window) for diagnose, whatif and alerts test: a window
    # in the future or reversed is refused before any server or store is asked.
    result = runner.invoke(app, [*command, "--server", "http://127.0.0.1:9"])
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output
    assert "Traceback" not in result.output


def test_a_server_that_refuses_the_token_is_answered_with_what_to_set(tmp_path) -> None:
    from typer.testing import CliRunner

    from inferpath.cli import app
    from inferpath.config import Settings
    from inferpath.server.runtime import serve_in_thread

    server = serve_in_thread(Settings(store_url=f"chdb://{tmp_path / 'store'}", token="s3cret"), port=0)
    try:
        for token, said in ((None, "refused no token (INFERPATH_TOKEN is not set)"), ("wrong", "refused the token")):
            for command in (["diagnose", "--since", "5m"], ["whatif", "--from", "-5m", "--replicas", "2"]):
                result = CliRunner().invoke(
                    app, [*command, "--server", server.url], env={"INFERPATH_TOKEN": token, "COLUMNS": "200"}
                )
                text = " ".join(result.output.split())
                assert result.exit_code == 2, text
                assert said in text and "set INFERPATH_TOKEN to the token it was started with" in text, text
    finally:
        server.stop()
