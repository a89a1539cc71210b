"""Receipt read: the cost of stamping a raw read with the kernel's receive time.

Per read, what asyncio's selector transport does: ``recv`` on the socket, then the
protocol's ``data_received``. One loopback TCP connection per side; the peer writes a
120-byte SSE-sized chunk, the reader reads it (non-blocking, data already there) and hands
it to its protocol, ``--reads`` times per round. Sides, interleaved in every round:

* reference: a plain socket and anyio's ``StreamProtocol`` (httpx's read path, unstamped);
* raw read: the protocol's class swapped, as ``instrumentation/receipt.py`` installs it on a
  streamed response's connection without kernel stamps (``data_received`` reads the clock
  and records the read);
* kernel: the socket too, with ``SO_TIMESTAMPNS`` and its class swapped (``recvmsg`` with
  room for the timestamp; ``data_received`` parses it and moves it to the monotonic clock).

The peer's ``send`` is inside both loops alike. Best round of each side.

    python bench/bench_receipt_read.py [--reads N] [--rounds R]
No target of its own: the figure belongs to the streaming cost per token (issue 3).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from typing import Any

from anyio._backends._asyncio import StreamProtocol

from inferpath.instrumentation import receipt

CHUNK = b"data: " + b"x" * 112 + b"\n\n"


class _Transport(asyncio.Transport):
    """What ``StreamProtocol.connection_made`` needs of a transport."""

    def set_write_buffer_limits(self, high: Any = None, low: Any = None) -> None:
        pass


def _side(stamp: str) -> tuple[list[socket.socket], socket.socket, socket.socket, Any]:
    """(sockets to close, reader, writer, protocol)."""
    listener = socket.create_server(("127.0.0.1", 0))
    reader = socket.create_connection(listener.getsockname())
    writer, _ = listener.accept()
    writer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    protocol = StreamProtocol()
    protocol.connection_made(_Transport())
    if stamp != "reference":
        clock = receipt.ReceiptClock()
        clock.unread = protocol.read_queue
        setattr(protocol, receipt._ATTRIBUTE, clock)
        protocol.__class__ = receipt._stamping_class(StreamProtocol)
    if stamp == "kernel":
        receipt._enable_kernel_stamps(reader)
        reader.__class__ = receipt._KernelStampedSocket
        clock.fd = reader.fileno()
    return [listener, reader, writer], reader, writer, protocol


def _round(reader: socket.socket, writer: socket.socket, protocol: Any, reads: int) -> float:
    """Seconds per send + recv + data_received."""
    recv, send, data_received = reader.recv, writer.send, protocol.data_received
    queue = protocol.read_queue
    began = time.perf_counter()
    for _ in range(reads):
        send(CHUNK)
        data_received(recv(65536))
        queue.popleft()  # the stream takes the read
    return (time.perf_counter() - began) / reads


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    if not receipt._HAS_KERNEL_STAMPS:
        print("kernel receive timestamps are not used on this system")
        return {}
    sides = {name: _side(name) for name in ("reference", "raw read", "kernel")}
    time.sleep(0.05)  # the host's timestamping switch is turned on by a kernel work item
    best = {name: float("inf") for name in sides}
    try:
        for _ in range(args.rounds):
            for name, (_sockets, reader, writer, protocol) in sides.items():
                best[name] = min(best[name], _round(reader, writer, protocol, args.reads))
        stamped = sides["kernel"]
        clock = getattr(stamped[3], receipt._ATTRIBUTE)
        # Stamped by the kernel: at the send, before the protocol's own clock read.
        if clock.read_ns is None or not clock.reads:
            raise RuntimeError("the stamped reads were not recorded")
    finally:
        for sockets, *_rest in sides.values():
            for sock in sockets:
                sock.close()
    result = {f"{name.replace(' ', '_')}_us": seconds * 1e6 for name, seconds in best.items()}
    for name in ("raw read", "kernel"):
        result[f"{name.replace(' ', '_')}_added_us"] = (best[name] - best["reference"]) * 1e6
    print(
        f"send + recv + data_received: reference {result['reference_us']:.2f} us; stamped at the "
        f"raw read +{result['raw_read_added_us']:.2f} us; with the kernel stamp "
        f"+{result['kernel_added_us']:.2f} us per read (best of {args.rounds} rounds of {args.reads})"
    )
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
