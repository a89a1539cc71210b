"""Shared fixtures: where the recorded real-world data lives, a fresh embedded store."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder of recorded third-party inputs (``../shared/data`` beside the repository)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"recorded data folder {SHARED_DATA} is not present")
    return SHARED_DATA


@pytest.fixture()
def store_url(tmp_path: Path) -> str:
    """An embedded chDB store in a fresh temporary folder."""
    return f"chdb://{tmp_path / 'store'}"


@contextmanager
def serve(app, *, startup_timeout_seconds: float = 10.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free 127.0.0.1 port in a thread; yields its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_seconds
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def serve_app():
    """The :func:`serve` context manager, as a fixture so tests need not import conftest."""
    return serve


_XDIST_WORKER_BOOTSTRAP = b"exec(eval(sys.stdin.readline()))"
"""What execnet (pytest-xdist's transport) runs as a worker's command line."""


@contextmanager
def _store_held_by_another_process(folder: Path) -> Iterator[None]:
    """An embedded store at ``folder`` that another process has open, until the block ends."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from inferpath.storage.store import Store; "
            f"store = Store.open({'chdb://' + str(folder)!r}); print('open', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)


@pytest.fixture
def store_held_by_another_process():
    """``with store_held_by_another_process(folder):`` another process holds the store there."""
    return _store_held_by_another_process


def _yield_cpu_of_other_workers() -> int:
    """Under pytest-xdist, lower the other workers to the lowest CPU priority (nice 19, which
    any process may do to its own user's processes) and return how many were lowered.

    The scenario runs measure latency through real processes and compare two phases of the
    same traffic; a test on the other worker burning a core through one phase reads as a
    fault of its own (a healthy run was once named network_hop, TTFT p99 220 -> 432 ms).
    At nice 19 that worker only gets the CPU the scenario's processes leave idle. Its
    tests are untimed or bounded generously, so they only run slower, not differently."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return 0
    me, parent, lowered = os.getpid(), os.getppid(), 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue  # gone, or not ours to read
        if ppid == parent and _XDIST_WORKER_BOOTSTRAP in command:
            try:
                os.setpriority(os.PRIO_PROCESS, int(entry.name), 19)
                lowered += 1
            except OSError:
                pass
    return lowered


class ScenarioRuns:
    """The fault scenarios of :mod:`inferpath.demo.scenarios`, each run once per session and
    shared: a run takes ~30 s of real processes (server, engine, gateway), and the scenario
    suite, the browser tests and the alert test read the same runs."""

    def __init__(self, base: Path) -> None:
        self._base = base
        self._outcomes: dict = {}
        self._rerun: set[str] = set()
        _yield_cpu_of_other_workers()

    def run(self, name: str, options):
        """Run ``name`` with ``options`` (a test's own: alert rules, a tail) and keep the outcome
        as the session's run of ``name`` if there is none yet."""
        from inferpath.demo.scenarios import run_scenario

        outcome = run_scenario(name, options, log=lambda _line: None)
        self._outcomes.setdefault(name, outcome)
        return outcome

    def outcome(self, name: str):
        """The session's run of ``name`` (the suite's default options), run now if none ran.

        A run that misdiagnosed is run again once, not more: on a shared 2-core machine a
        burst of outside CPU load during one phase looks like a fault of its own; a fault the
        diagnosis really misses fails twice."""
        from inferpath.demo.scenarios import ScenarioOptions, run_scenario

        outcome = self._outcomes.get(name)
        if outcome is None:
            outcome = run_scenario(name, ScenarioOptions(log_dir=self._base / name / "run1"), log=lambda _line: None)
        if not outcome.correct and name not in self._rerun:
            self._rerun.add(name)
            first = outcome.diagnosed_cause
            outcome = run_scenario(name, ScenarioOptions(log_dir=self._base / name / "run2"), log=lambda _line: None)
            print(f"{name}: first run diagnosed {first!r}; rerun diagnosed {outcome.diagnosed_cause!r}")
        self._outcomes[name] = outcome
        return outcome


@pytest.fixture(scope="session")
def scenario_runs(tmp_path_factory: pytest.TempPathFactory) -> ScenarioRuns:
    """The session's :class:`ScenarioRuns` (one run of each scenario, shared)."""
    return ScenarioRuns(tmp_path_factory.mktemp("scenarios"))


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under pytest-xdist (``--dist loadgroup``), every test that reads the shared scenario
    runs goes to one worker, so each scenario runs once per session, as in one process. (The
    mark is read when xdist renames the items, after collection; the confusion table fails if
    the runs were split.)"""
    if "scenario_runs" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.xdist_group("scenarios"))
