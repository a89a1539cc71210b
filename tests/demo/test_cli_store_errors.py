"""What the commands say about a store or server they cannot use: one sentence naming what was
wrong and what to do, never a password, a Python class name or a raw chDB error, and nothing
created or written on the way."""

from __future__ import annotations

import http.server
import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferpath.cli import app

runner = CliRunner()
NO_SERVER = {"INFERPATH_SERVER_URL": "http://127.0.0.1:9"}
CLASS_NAMES = ("ValueError", "ProgrammingError", "OperationalError", "RuntimeError", "Error:")


def said(result) -> str:
    """The command's output as one line (rich wraps long lines at the console's width)."""
    return " ".join(result.output.split())


def recording(folder: Path) -> Path:
    """A recording of one trace body and one vLLM scrape."""
    (folder / "otlp").mkdir(parents=True)
    (folder / "otlp" / "body.json").write_text('{"resourceSpans": []}')
    (folder / "metrics_1700000000000000000.prom").write_text("vllm:num_requests_running 1\n")
    return folder


READ_ONLY = {
    "diagnose": ["diagnose", "--since", "1h"],
    "whatif": ["whatif", "--from", "-30m", "--replicas", "2"],
    "alerts test": ["alerts", "test", "default", "--since", "10m"],
}


@pytest.mark.parametrize("command", READ_ONLY.values(), ids=READ_ONLY.keys())
def test_a_read_only_command_does_not_create_a_store_at_a_mistyped_path(tmp_path: Path, command) -> None:
    missing = tmp_path / "nonexistent" / "dir" / "store"
    result = runner.invoke(app, [*command, "--store", f"chdb://{missing}"], env=NO_SERVER)
    assert result.exit_code == 2, result.output
    expected = f"no store at {missing} (the folder does not exist): check the path (inferpath up and inferpath"
    assert expected in said(result)
    assert "insufficient data" not in result.output
    assert not (tmp_path / "nonexistent").exists()
    # A folder of the user's own, empty or not, is not turned into a store by a read.
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "readme.txt").write_text("hi")
    result = runner.invoke(app, [*command, "--store", f"chdb://{notes}"], env=NO_SERVER)
    assert result.exit_code == 2, result.output
    assert f"no store at {notes} (the folder holds no store)" in said(result)
    assert sorted(p.name for p in notes.iterdir()) == ["readme.txt"]


@pytest.mark.parametrize(
    "store",
    ["https://user:s3cret@127.0.0.1:1/db", "https://user:s3cret@127.0.0.1:99999/db"],
    ids=["refused", "malformed"],
)
@pytest.mark.parametrize("command", [["diagnose", "--since", "1h"], ["up", "--no-dashboard", "--port", "0"]])
def test_a_store_password_is_never_printed(command, store: str) -> None:
    result = runner.invoke(app, [*command, "--store", store], env=NO_SERVER)
    assert result.exit_code == 2, result.output
    assert "s3cret" not in result.output
    assert "user:***@127.0.0.1:" in said(result)


@pytest.mark.parametrize("server", ["http://u:s3cret@127.0.0.1:1", "ftp://u:s3cret@127.0.0.1:1"])
def test_a_server_password_is_never_printed(server: str) -> None:
    result = runner.invoke(app, ["diagnose", "--since", "1h", "--server", server], env=NO_SERVER)
    assert result.exit_code == 2, result.output
    assert "s3cret" not in result.output and "u:***@127.0.0.1:1" in said(result)


def test_the_store_driver_adds_no_warning_of_its_own(caplog) -> None:
    driver = logging.getLogger("clickhouse_connect")
    level = driver.level
    result = runner.invoke(app, ["diagnose", "--since", "1h", "--store", "http://127.0.0.1:1/db"], env=NO_SERVER)
    assert result.exit_code == 2 and "cannot reach ClickHouse at 127.0.0.1:1" in said(result)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("clickhouse_connect")] == []
    assert driver.level == level  # set back when the command ends


def test_a_store_another_process_holds_is_named_in_one_plain_sentence(
    tmp_path: Path, store_held_by_another_process
) -> None:
    folder = tmp_path / "store"
    store = f"chdb://{folder}"
    with store_held_by_another_process(folder):
        read = runner.invoke(app, ["diagnose", "--since", "1h", "--store", store], env=NO_SERVER)
        imported = runner.invoke(app, ["import", str(recording(tmp_path / "rec")), "--store", store])
        up = runner.invoke(app, ["up", "--no-dashboard", "--port", "0", "--store", store])
    in_use = f"the store at {folder} is in use by another process (an inferpath up?): "
    assert read.exit_code == 2 and said(read) == in_use + "read it through that server with --server URL"
    assert imported.exit_code == 2 and said(imported) == in_use + "import it through that server with --server URL"
    assert up.exit_code == 2 and said(up) == in_use + "stop that process, or give this server another --store"


def test_other_store_errors_carry_no_server_hint_and_no_class_names(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a store")
    rec = recording(tmp_path / "rec")
    for command in (
        ["diagnose", "--since", "1h", "--store", "bogus://x"],
        ["diagnose", "--since", "1h", "--store", f"chdb://{a_file}"],
        ["import", str(rec), "--store", f"chdb://{a_file}"],
        ["import", str(rec), "--store", "http://127.0.0.1:1/db"],
    ):
        result = runner.invoke(app, command, env=NO_SERVER)
        assert result.exit_code == 2, (command, result.output)
        assert "--server" not in result.output and "owns it" not in result.output, (command, result.output)
        assert not any(name in result.output for name in CLASS_NAMES), (command, result.output)
        assert len(result.output.strip().splitlines()) == 1, (command, result.output)
    not_a_folder = runner.invoke(app, ["diagnose", "--since", "1h", "--store", f"chdb://{a_file}"], env=NO_SERVER)
    assert said(not_a_folder).startswith(f"no store at {a_file} (it is a file, not a folder): check the path")
    imported = runner.invoke(app, ["import", str(rec), "--store", f"chdb://{a_file}"], env=NO_SERVER)
    assert said(imported) == f"{a_file} is a file, not a folder: give a new or empty folder for the store"
    # The demo says the same before it starts anything (it said 'server exited with code 1; see LOG').
    demo = runner.invoke(app, ["demo", "--exit", "--port", "0", "--store", f"chdb://{a_file}"], env=NO_SERVER)
    assert demo.exit_code == 2 and said(demo) == said(imported), demo.output


@pytest.mark.parametrize("command", [["diagnose", "--since", "1h"], ["up", "--no-dashboard", "--port", "0"]])
def test_a_store_path_without_a_scheme_gets_the_url_it_meant(tmp_path: Path, command) -> None:
    result = runner.invoke(app, [*command, "--store", str(tmp_path / "demo-store")], env=NO_SERVER)
    assert result.exit_code == 2
    assert f"did you mean chdb://{tmp_path / 'demo-store'}?" in said(result)
    assert "--server" not in result.output
    assert not (tmp_path / "demo-store").exists()


def test_import_checks_its_source_before_writing_anything(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    result = runner.invoke(
        app, ["import", str(recording(tmp_path / "rec")), "--store", f"chdb://{folder}", "--source", "nope"]
    )
    assert result.exit_code == 2
    assert said(result) == "--source must be one of vllm, sglang, tgi, triton, trtllm, dcgm; got 'nope'"
    assert not folder.exists()


def test_up_refuses_an_objectives_file_that_holds_none_before_starting(tmp_path: Path) -> None:
    # Each diagnosis would answer 500 naming the file: said once, before the store is made.
    empty = tmp_path / "objectives.yaml"
    empty.write_text("# interactive: {ttft_p99_seconds: 1.0}\n")
    done = subprocess.run(
        [sys.executable, "-m", "inferpath.cli", "up", "--store", f"chdb://{tmp_path / 'store'}", "--port", "0"],
        env={**os.environ, "INFERPATH_OBJECTIVES_FILE": str(empty), "INFERPATH_HOST": "127.0.0.1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert said.startswith("invalid objectives (INFERPATH_OBJECTIVES_FILE): objectives file"), said
    assert "holds no objectives" in said and not (tmp_path / "store").exists()


def test_up_refuses_a_dashboard_port_that_is_taken(tmp_path: Path) -> None:
    # A child process, so that a regression (the server starting anyway) cannot hang the test.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "inferpath.cli", "up", "--store", f"chdb://{tmp_path / 'store'}", "--port", "0"]
            + ["--dashboard-port", str(port)],
            env={**os.environ, "INFERPATH_HOST": "127.0.0.1"},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stdout + done.stderr
    assert " ".join(done.stderr.split()) == (
        f"cannot listen on 127.0.0.1:{port} for the dashboard: Address already in use "
        "(is another dashboard running? choose another with --dashboard-port)"
    )
    assert not (tmp_path / "store").exists()  # nothing started


def test_up_with_both_ports_taken_names_both(tmp_path: Path) -> None:
    with socket.socket() as dash, socket.socket() as server:
        for taken in (dash, server):
            taken.bind(("127.0.0.1", 0))
            taken.listen()
        dash_port, server_port = dash.getsockname()[1], server.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "inferpath.cli", "up", "--store", f"chdb://{tmp_path / 'store'}"]
            + ["--port", str(server_port), "--dashboard-port", str(dash_port)],
            env={**os.environ, "INFERPATH_HOST": "127.0.0.1"},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stdout + done.stderr
    said_ = " ".join(done.stderr.split())
    assert f"cannot listen on 127.0.0.1:{dash_port} for the dashboard: Address already in use" in said_, said_
    assert f"the server's port {server_port} is in use too (choose another with --port)" in said_, said_
    assert not (tmp_path / "store").exists()


def test_server_must_be_an_http_url_and_not_given_with_store(tmp_path: Path) -> None:
    foo = runner.invoke(app, ["diagnose", "--since", "1h", "--server", "foo"])
    assert foo.exit_code == 2
    assert said(foo) == "--server: expected an http(s) URL such as http://127.0.0.1:4318, got 'foo'"
    from_env = runner.invoke(app, ["diagnose", "--since", "1h"], env={"INFERPATH_SERVER_URL": "foo"})
    assert from_env.exit_code == 2 and said(from_env).startswith("INFERPATH_SERVER_URL: expected an http(s) URL")
    both = runner.invoke(
        app, ["diagnose", "--since", "1h", "--server", "http://127.0.0.1:9", "--store", f"chdb://{tmp_path / 's'}"]
    )
    assert both.exit_code == 2 and said(both).startswith("give --server or --store, not both")
    assert not (tmp_path / "s").exists()


def test_unix_times_in_nanoseconds_name_the_first_option_and_the_unit() -> None:
    result = runner.invoke(app, ["diagnose", "--from", "1796306790826543231", "--to", "1796306869888134145"])
    assert result.exit_code == 2
    assert said(result) == (
        "--from: '1796306790826543231' is out of range: Unix times are seconds, "
        "and this looks like nanoseconds (1796306790.826543231 s)"
    )


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:pw@127.0.0.1:1/db", "https://user:***@127.0.0.1:1/db"),
        ("http://me:p%40ss:w@[::1]:8123/db?cluster=c", "http://me:***@[::1]:8123/db?cluster=c"),
        ("http://me@host/db", "http://me@host/db"),
        ("http://host:8123/db", "http://host:8123/db"),
        ("chdb:///var/lib/inferpath", "chdb:///var/lib/inferpath"),
        ("/tmp/x/demo-store", "/tmp/x/demo-store"),
    ],
)
def test_a_printed_store_url_hides_only_the_password(url: str, shown: str) -> None:
    from inferpath.server_access import shown_store_url

    assert shown_store_url(url) == shown


class _JSONNotFound(http.server.BaseHTTPRequestHandler):
    """Another JSON API (a model gateway, FastAPI's defaults): 404 / 405 for every route."""

    def _answer(self) -> None:
        body = b'{"detail":"Not Found"}' if self.command == "GET" else b'{"detail":"Method Not Allowed"}'
        self.send_response(404 if self.command == "GET" else 405)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize("handler", [http.server.SimpleHTTPRequestHandler, _JSONNotFound], ids=["html", "json"])
@pytest.mark.parametrize("command", list(READ_ONLY.values()), ids=list(READ_ONLY))
def test_a_server_url_of_another_program_is_named_not_a_traceback(command, handler) -> None:
    """The dashboard's port (HTML) or another JSON API given as --server: a real HTTP server
    that is not the read API."""
    import threading

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as other:
        threading.Thread(target=other.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{other.server_address[1]}"
            result = runner.invoke(app, [*command, "--server", url], env=NO_SERVER)
        finally:
            other.shutdown()
    assert result.exit_code == 2, result.output
    assert f"{url} is not an inferpath server" in said(result)
    assert "give --server the address" in said(result)
    assert "Traceback" not in result.output and "JSONDecodeError" not in result.output


@pytest.mark.parametrize("command", ["diagnose", "import"])
def test_a_store_url_of_another_program_says_it_is_not_clickhouse(tmp_path: Path, command) -> None:
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler) as other:
        threading.Thread(target=other.serve_forever, daemon=True).start()
        store = f"http://127.0.0.1:{other.server_address[1]}/db"
        args = (
            ["diagnose", "--since", "1h", "--store", store]
            if command == "diagnose"
            else ["import", str(recording(tmp_path / "rec")), "--store", store]
        )
        try:
            result = runner.invoke(app, args, env=NO_SERVER)
        finally:
            other.shutdown()
    assert result.exit_code == 2, result.output
    assert f"127.0.0.1:{other.server_address[1]} answered HTTP 501 and is not ClickHouse" in said(result), said(result)
    assert "<!DOCTYPE" not in result.output and "<html" not in result.output.lower()
