"""The demo's port picking: child processes get ports that outgoing connections cannot take."""

from __future__ import annotations

import socket

from inferpath.demo.processes import _ephemeral_low, free_port


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    low = _ephemeral_low()
    assert all(20000 <= port < low for port in ports)
    for port in ports[:20]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_never_handed_out(monkeypatch) -> None:
    import inferpath.demo.processes as processes

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        # Every candidate drawn is the taken port: it is skipped, and bind(0) answers instead.
        monkeypatch.setattr(processes.random, "randrange", lambda low, high: taken)
        port = free_port()
        assert port != taken
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_child_that_refused_to_start_is_named_with_its_own_last_sentence(tmp_path) -> None:
    """A second demo on the same store: the server child prints one sentence and exits 1; the
    demo's message quotes it instead of only pointing at the log."""
    import subprocess
    import sys

    from inferpath.demo.processes import ChildService

    log = tmp_path / "server.log"
    sentence = "the store chdb:///x is in use by another process; give this server another --store"
    log.write_text(f"Code: 76. DB::Exception: Cannot lock file\n{sentence}\n\n")
    refused = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    refused.wait(timeout=30)
    child = ChildService("server", "http://127.0.0.1:1", refused, str(log))
    assert child.exit_message() == f"server exited with code 1: {sentence}; see {log}"
    killed = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    killed.wait(timeout=30)
    assert ChildService("engine", "http://127.0.0.1:1", killed, str(log)).exit_message() == (
        f"engine exited with code -9; see {log}"
    )
