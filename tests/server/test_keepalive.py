"""Keep-alive responses are not held back by Nagle's algorithm.

The server binds its listening socket itself (so a port of 0 is known before uvicorn
starts). asyncio's loop turns on TCP_NODELAY for accepted connections only when the
listening socket's protocol is TCP; a socket made with protocol 0 left Nagle on, and every
response after the first on a kept-alive connection waited ~40 ms for the client's delayed
ACK. uvloop (used when installed) sets it on every accepted TCP connection.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread


def test_accepted_connections_have_tcp_nodelay_and_keepalive_requests_are_fast(store_url):
    with serve_in_thread(Settings(store_url=store_url), port=0) as running:
        with socket.create_connection(("127.0.0.1", running.port)) as client:
            client.sendall(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            assert client.recv(64).startswith(b"HTTP/1.1 200")
            # The server's end of this connection is what matters: its socket has Nagle off
            # (asyncio and uvloop transports both set TCP_NODELAY on accepted TCP sockets).
            connections = list(running._server.server_state.connections)  # type: ignore[attr-defined]
            assert len(connections) == 1
            accepted = connections[0].transport.get_extra_info("socket")
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        with httpx.Client(base_url=running.url, timeout=10) as http:
            http.get("/metrics").raise_for_status()  # first request: connection set up
            round_trips = []
            for _ in range(10):
                started = time.perf_counter()
                http.get("/metrics").raise_for_status()
                round_trips.append(time.perf_counter() - started)
    # With Nagle on, every keep-alive round trip waits >= 40 ms for the delayed ACK; without
    # it a few ms. A busy machine delays some round trips, not all ten: the fastest tells.
    assert min(round_trips) < 0.03, f"fastest of 10 keep-alive requests took {min(round_trips) * 1e3:.0f} ms"


def test_the_foreground_server_binds_the_same_way_and_logs_the_port_it_got(tmp_path) -> None:
    """``python -m inferpath.server --port 0``: the log names the real port, keep-alive
    requests are not held back, and a second server on that port exits 1 saying why."""
    import re
    import subprocess
    import sys

    command = [sys.executable, "-m", "inferpath.server", "--port", "0", "--store", f"chdb://{tmp_path / 'a'}"]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = server.stderr.readline()  # type: ignore[union-attr]
            if not line:
                break
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+) ", line)
            port = int(found.group(1)) if found else None
        assert port, "the server did not log the port it listens on"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            http.get("/metrics").raise_for_status()
            round_trips = []
            for _ in range(10):
                started = time.perf_counter()
                http.get("/metrics").raise_for_status()
                round_trips.append(time.perf_counter() - started)
        assert min(round_trips) < 0.03, f"fastest of 10 keep-alive requests took {min(round_trips) * 1e3:.0f} ms"
        second = subprocess.run(
            [sys.executable, "-m", "inferpath.server", "--port", str(port), "--store", f"chdb://{tmp_path / 'b'}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 1
        assert f"cannot listen on 127.0.0.1:{port}" in second.stderr and "Traceback" not in second.stderr
        assert not (tmp_path / "b").exists()  # refused before a store folder was made
    finally:
        server.terminate()
        server.wait(60)


@pytest.mark.parametrize("chunked", [False, True])
def test_an_export_cut_off_mid_body_is_logged_without_an_error_traceback(store_url, caplog, chunked):
    caplog.set_level("INFO")
    with serve_in_thread(Settings(store_url=store_url), port=0) as running:  # a server each: one line per 10 s
        host, port = running.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            length = b"Transfer-Encoding: chunked\r\n" if chunked else b"Content-Length: 1000\r\n"
            sock.sendall(
                b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                + length
                + b"\r\n"
                + (b"a\r\n0123456789\r\n" if chunked else b"0123456789")
            )
            time.sleep(0.3)  # the server is reading the body when the exporter gives up
        deadline = time.monotonic() + 10
        while not any("client disconnected" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            time.sleep(0.05)
        assert httpx.get(f"{running.url}/healthz", timeout=5).status_code == 200
    assert not [r for r in caplog.records if r.levelname == "ERROR"], [r.getMessage() for r in caplog.records]


def test_the_bound_socket_accepts_connections_before_the_server_serves() -> None:
    """The port is logged between binding and uvicorn's start: a client that connects in
    that window must wait in the backlog, not be refused."""
    from inferpath.server.runtime import _bind_socket

    sock = _bind_socket("127.0.0.1", 0)
    try:
        with socket.create_connection(sock.getsockname(), timeout=5):
            pass
    finally:
        sock.close()
