"""Start and stop the demo's child processes (model server, gateway) on loopback."""

from __future__ import annotations

import errno
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from inferpath.children import die_with_parent
from inferpath.demo.engine.scheduler import EngineConfig

# Ports handed out by free_port in this process: never twice.
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768, its default, elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago, for a child process to listen on.

    Taken below the kernel's ephemeral range when that leaves room: a port from ``bind(0)``
    is an ephemeral one, which any outgoing connection of the machine may take before the
    child binds it (a demo or scenario run then failed with "address already in use").
    A port is never handed out twice by one process. Raises ``RuntimeError`` when no port
    can be found.
    """
    low, high = 20000, _ephemeral_low()
    with _handed_out_lock:
        candidates = [random.randrange(low, high) for _ in range(50)] if high - low >= 1000 else []
        for port in candidates + [0] * 20:
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                port = int(sock.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise RuntimeError(f"no free TCP port found on {host}")


class ListenAddressError(RuntimeError):
    """An address the demo must listen on is taken or not this machine's: the user's to
    choose another (exit 2)."""


def ensure_port_free(port: int, host: str = "127.0.0.1", *, what: str = "port", option: str = "--port") -> None:
    """Raise :class:`ListenAddressError` naming ``what`` (and ``option``, which chooses
    another) if ``host:port`` is already taken, or naming ``INFERPATH_HOST`` if ``host`` is
    not an address of this machine (port 0 checks the host alone).

    A demo that silently talked to someone else's server on its port would report that
    server's data as its own.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ListenAddressError(
                    f"{what} {host}:{port} is already in use ({exc.strerror}); "
                    f"is `inferpath up` or another demo running? Choose another with {option}"
                ) from None
            raise ListenAddressError(
                f"cannot listen on {host}:{port} for {what}: {exc.strerror or exc} (the host must be a name "
                "or address of this machine: see INFERPATH_HOST)"
            ) from None


@dataclass
class ChildService:
    """A child process serving HTTP on ``url``; ``stop()`` ends it gracefully (SIGTERM, then SIGKILL)."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: str | None = None
    _stopped: bool = field(default=False, repr=False)

    def wait_ready(self, path: str, timeout_seconds: float = 60.0) -> None:
        """Poll ``GET {url}{path}`` until 200. Raises ``RuntimeError`` if the process exits or time runs out."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(self.exit_message())
            try:
                if httpx.get(f"{self.url}{path}", timeout=1.0).status_code == 200:
                    time.sleep(0.2)  # a child that lost a race for its port exits right after binding fails
                    if self.process.poll() is not None:
                        raise RuntimeError(self.exit_message())
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready at {self.url}{path} after {timeout_seconds:.0f} s")

    def exit_message(self) -> str | None:
        """``"NAME exited with code N: LAST LOG LINE; see LOG"`` once the process has exited (a
        negative code is the signal that ended it; the last line is the sentence a child that
        refused to start printed, e.g. a store in use), else ``None``."""
        code = self.process.poll()
        if code is None:
            return None
        said = ""
        if self.log_path is not None and code > 0:  # not for a signal: its log ends mid-work
            try:
                lines = [line.strip() for line in Path(self.log_path).read_text(errors="replace").splitlines()]
            except OSError:
                lines = []
            last = next((line for line in reversed(lines) if line), "")
            said = f": {last[:300]}" if last else ""
        return f"{self.name} exited with code {code}{said}" + (f"; see {self.log_path}" if self.log_path else "")

    def stop(self, timeout_seconds: float = 10.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_seconds)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_module(
    name: str,
    module: str,
    args: list[str],
    *,
    port: int,
    host: str = "127.0.0.1",
    log_path: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> ChildService:
    """Run ``python -m module args`` as a child process serving on ``host:port``."""
    env = dict(os.environ)
    # Export spans every 0.5 s: the demo's table should not wait on the SDK's 5 s default.
    env.setdefault("OTEL_BSP_SCHEDULE_DELAY", "500")
    env.update(extra_env or {})
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    # Stops when this process dies, even by kill -9 (inferpath/children.py).
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )
    return ChildService(name, f"http://{host}:{port}", process, log_path)


def start_server(
    store_url: str, port: int, engine_url: str, log_dir: Path, *, extra_env: dict[str, str] | None = None
) -> ChildService:
    """The inferpath server in its own process (``python -m inferpath.serve``: with the alert
    evaluator, rules from ``INFERPATH_ALERT_RULES`` in ``extra_env``), owning ``store_url``
    and scraping the demo engine's vLLM-compatible ``/metrics`` and dcgm-exporter-compatible
    ``/gpu/metrics``."""
    return start_module(
        "server",
        "inferpath.serve",
        [
            "--port",
            str(port),
            "--store",
            store_url,
            "--scrape",
            f"vllm={engine_url}/metrics",
            "--scrape",
            f"dcgm={engine_url}/gpu/metrics",
        ],
        port=port,
        log_path=str(log_dir / "server.log"),
        # The demo engine's step budget (its --max-num-batched-tokens default), for the what-if.
        extra_env={
            "INFERPATH_ENGINE_MAX_NUM_BATCHED_TOKENS": str(EngineConfig.max_num_batched_tokens),
            **(extra_env or {}),
        },
    )
