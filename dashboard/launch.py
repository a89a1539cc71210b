"""Start the dashboard as a ``streamlit run`` child process and wait until it serves.

Used by ``inferpath demo``/``inferpath up`` and by the browser tests. The dashboard runs in
its own process because Streamlit owns its event loop and script runner; it reaches the
inferpath server only over HTTP, via ``INFERPATH_SERVER_URL`` (and ``INFERPATH_TOKEN``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from inferpath.children import die_with_parent
from inferpath.config import ENV_SERVER_URL, ENV_TOKEN

APP_PATH = Path(__file__).resolve().with_name("app.py")
HEALTH_PATH = "/_stcore/health"


def dashboard_command(*, port: int, host: str) -> list[str]:
    """The ``python -m streamlit run`` command line for the dashboard on ``host:port``."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP_PATH),
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",
        # Watching source files costs CPU and reruns the app on edits; a deployed
        # dashboard has no use for it.
        "--server.fileWatcherType",
        "none",
    ]


def launch_dashboard(
    server_url: str,
    *,
    port: int = 8501,
    host: str = "127.0.0.1",
    token: str | None = None,
    log_path: Path | None = None,
) -> subprocess.Popen:
    """Start the dashboard reading from ``server_url``; return the child process.

    ``port``/``host``: where Streamlit listens (loopback by default). ``token`` is handed to
    the app through ``INFERPATH_TOKEN``, never on the command line (other users can read
    command lines). Output goes to ``log_path`` when given, else is discarded. Raises
    ``ValueError`` for a ``server_url`` that is not http(s). The caller owns the process:
    terminate it (and ``wait``) when done.
    """
    if not server_url.startswith(("http://", "https://")):
        raise ValueError(f"server_url must start with http:// or https://, got {server_url!r}")
    env = dict(os.environ)
    env[ENV_SERVER_URL] = server_url
    if token:
        env[ENV_TOKEN] = token
    else:
        env.pop(ENV_TOKEN, None)
    # Streamlit writes first-run prompts and telemetry config under $HOME; headless mode
    # and the flags above keep it from prompting or phoning home.
    output = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            dashboard_command(port=port, host=host),
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
    finally:
        if not isinstance(output, int):
            output.close()  # the child holds its own descriptor


def wait_until_ready(url: str, *, timeout_seconds: float = 60.0, process: subprocess.Popen | None = None) -> None:
    """Poll ``{url}/_stcore/health`` until Streamlit answers ``ok``.

    ``url``: the dashboard's base URL, e.g. ``http://127.0.0.1:8501``. Raises
    ``RuntimeError`` if ``process`` exits first (with its exit code) and ``TimeoutError``
    after ``timeout_seconds``.
    """
    deadline = time.monotonic() + timeout_seconds
    health_url = url.rstrip("/") + HEALTH_PATH
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"dashboard process exited with code {process.returncode} before serving {url}")
        try:
            response = httpx.get(health_url, timeout=2.0)
            if response.status_code == 200 and response.text.strip() == "ok":
                return
            last_error = f"HTTP {response.status_code}: {response.text[:100]!r}"
        except httpx.HTTPError as error:
            last_error = f"{type(error).__name__}: {error}"
        time.sleep(0.25)
    raise TimeoutError(f"dashboard at {url} not ready after {timeout_seconds} s ({last_error})")
