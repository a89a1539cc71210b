"""Shared fixtures: where the recorded real-world data lives, a fresh embedded store."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

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
