"""`inferpath demo` while serving: a child process that dies ends the demo, naming it."""

from __future__ import annotations

import io
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from inferpath.demo.run import DemoOptions, run_demo

pytestmark = pytest.mark.e2e


def _children_running(module: str) -> list[int]:
    """Pids of this process's children whose command line runs ``python -m module``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # exited meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and module.encode() in argv:
            found.append(int(entry.name))
    return found


def test_a_child_that_dies_while_serving_ends_the_demo_naming_it(tmp_path: Path) -> None:
    output = io.StringIO()
    failure: list[BaseException] = []

    def demo() -> None:
        try:
            run_demo(
                DemoOptions(
                    requests=5,
                    speed=100.0,
                    exit_when_done=False,
                    store_url=f"chdb://{tmp_path / 'store'}",
                    port=0,
                    dashboard=False,
                    log_dir=tmp_path / "logs",
                ),
                Console(file=output, width=200),
            )
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failure.append(exc)

    thread = threading.Thread(target=demo, daemon=True)
    thread.start()
    deadline = time.monotonic() + 180.0
    while "serving (Ctrl-C to stop)" not in output.getvalue() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "serving (Ctrl-C to stop)" in output.getvalue(), output.getvalue()
    (engine,) = _children_running("inferpath.demo.engine")
    os.kill(engine, signal.SIGKILL)
    thread.join(60.0)
    assert not thread.is_alive()
    (error,) = failure
    assert isinstance(error, RuntimeError)
    assert "engine exited with code -9" in str(error) and "engine.log" in str(error)
    assert "while the demo was serving" in str(error)
    # The rest of the path was stopped with it.
    assert _children_running("inferpath.server") == [] and _children_running("inferpath.demo.gateway") == []
