"""Receipt read: the cost of the kernel-stamped socket read over a plain ``recv``.

One loopback TCP connection; the peer writes a 120-byte SSE-sized chunk, the reader reads
it (non-blocking, data already there), ``--reads`` times per round. Sides, interleaved in
every round: ``recv`` on the plain socket (the reference: what asyncio's transport does),
and ``recv`` on the same kind of socket with ``SO_TIMESTAMPNS`` and its class swapped by
``instrumentation/receipt.py`` (``recvmsg`` with room for the timestamp, the control message
parsed, the stamp converted to the monotonic clock and kept for ``data_received``). The
peer's ``send`` is inside both loops alike. Best round of each side.

    python bench/bench_receipt_read.py [--reads N] [--rounds R]
No target of its own: the figure belongs to the streaming cost per token (issue 3).
"""

from __future__ import annotations

import argparse
import socket
import sys
import time

from inferpath.instrumentation import receipt

CHUNK = b"data: " + b"x" * 112 + b"\n\n"


def _pair(stamped: bool) -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    reader = socket.create_connection(listener.getsockname())
    writer, _ = listener.accept()
    writer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if stamped:
        receipt._enable_kernel_stamps(reader)
        reader.__class__ = receipt._KernelStampedSocket
    return listener, reader, writer


def _round(reader: socket.socket, writer: socket.socket, reads: int) -> float:
    """Seconds per send + recv pair."""
    recv, send = reader.recv, writer.send
    began = time.perf_counter()
    for _ in range(reads):
        send(CHUNK)
        recv(65536)
    return (time.perf_counter() - began) / reads


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    if not receipt._HAS_KERNEL_STAMPS:
        print("kernel receive timestamps are not used on this system")
        return {}
    sides = {"recv": _pair(False), "kernel-stamped recv": _pair(True)}
    time.sleep(0.05)  # the host's timestamping switch is turned on by a kernel work item
    best = {name: float("inf") for name in sides}
    try:
        for _ in range(args.rounds):
            for name, (_listener, reader, writer) in sides.items():
                best[name] = min(best[name], _round(reader, writer, args.reads))
        stamped_fd = sides["kernel-stamped recv"][1].fileno()
        if stamped_fd not in receipt._kernel_ns:
            raise RuntimeError("the stamped socket's reads carried no kernel timestamp")
    finally:
        for trio in sides.values():
            for sock in trio:
                sock.close()
    added_us = (best["kernel-stamped recv"] - best["recv"]) * 1e6
    result = {"recv_us": best["recv"] * 1e6, "stamped_us": best["kernel-stamped recv"] * 1e6,
              "added_us_per_read": added_us}
    print(f"send+recv {result['recv_us']:.2f} us, with the kernel stamp {result['stamped_us']:.2f} us: "
          f"+{added_us:.2f} us per read (best of {args.rounds} rounds of {args.reads})")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
