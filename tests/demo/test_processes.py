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
