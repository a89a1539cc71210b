"""`inferpath demo --scenario NAME` runs on the ports it is given and, like the plain demo,
serves the dashboard on the incident it just made until it is stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from inferpath.dashboard.launch import wait_until_ready
from inferpath.demo.processes import free_port

pytestmark = pytest.mark.e2e


def test_scenario_honours_both_ports_and_serves_the_dashboard(tmp_path: Path) -> None:
    port, dashboard_port = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inferpath.cli",
            "demo",
            "--scenario",
            "healthy",
            "--port",
            str(port),
            "--dashboard-port",
            str(dashboard_port),
            "--store",
            f"chdb://{tmp_path / 'store'}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(demo.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        deadline = time.monotonic() + 240.0
        while not any("dashboard:" in line for line in lines):
            assert demo.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.5)
        output = "".join(lines)
        assert f"http://127.0.0.1:{port}" in output and "diagnosis:" in output
        assert f"dashboard: http://127.0.0.1:{dashboard_port}" in output
        wait_until_ready(f"http://127.0.0.1:{dashboard_port}", timeout_seconds=60.0)
        # The server still runs on the given port and holds the scenario's requests.
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
        now = datetime.now(timezone.utc)
        window = {"start": (now - timedelta(minutes=10)).isoformat(), "end": now.isoformat()}
        count = httpx.get(f"http://127.0.0.1:{port}/api/v1/requests/count", params=window, timeout=30)
        assert count.json()["count"] >= 100, count.text
        demo.send_signal(signal.SIGTERM)  # as Ctrl-C: stop serving, then exit with the verdict's code
        assert demo.wait(60.0) in (0, 1)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(30.0)
    reader.join(10.0)
    output = "".join(lines)
    assert "stopping" in output
    # The command printed to judge the incident again gives the verdict the demo gave (the
    # fault window against the scenario's baseline).
    said = " ".join(output.split("diagnosis: ", 1)[1].split(" — expected", 1)[0].split())  # as wrapped
    command = output.split("diagnose this incident again: inferpath ", 1)[1].splitlines()[0].split()
    again = subprocess.run(
        [sys.executable, "-m", "inferpath.cli", *command, "--json"], capture_output=True, text=True, timeout=120
    )
    assert again.returncode in (0, 1), again.stdout + again.stderr
    assert json.loads(again.stdout[again.stdout.index("{") :])["summary"] == said
