"""Shared fixtures: where the recorded real-world data lives, a fresh embedded store."""

from __future__ import annotations

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


class ScenarioRuns:
    """The fault scenarios of :mod:`inferpath.demo.scenarios`, each run once per session and
    shared: a run takes ~30 s of real processes (server, engine, gateway), and the scenario
    suite, the browser tests and the alert test read the same runs."""

    def __init__(self, base: Path) -> None:
        self._base = base
        self._outcomes: dict = {}
        self._rerun: set[str] = set()

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
