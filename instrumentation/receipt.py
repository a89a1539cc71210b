"""Opt-in: receipt time of a response's bytes, taken by the kernel or at the raw socket read.

Off by default. By default a streamed chunk is stamped when its bytes come out of httpx
(``time.perf_counter_ns`` at the read, before any parsing), which touches nothing in the
host and is within the accuracy targets on a quiet machine (TTFT p99 ≤ 3 ms at
concurrency 1, ≤ 10 ms at 64; ``bench/bench_accuracy.py``). ``instrument(...,
kernel_receive_timestamps=True)`` (or :func:`enable`) turns this module on, for whoever
needs tighter figures under load; it then changes the host as follows: the class of
anyio's protocol object of each streamed connection is swapped for a stamping subclass,
the class of the connection's socket for one reading with ``recvmsg``, ``SO_TIMESTAMPNS``
is set on those sockets, and one UDP socket stays open for the process's life so that the
kernel keeps receive timestamping on for the host. It also reads private attributes of
anyio (``_protocol``, ``_transport``) and asyncio (``_sock``). ``enable(False)`` (and
``uninstrument()``) stops installing it on new connections.

Why the default stamp can be late: a streamed chunk reaches the code that measures it only
after the event loop has run the task that waits on the connection, and that task's turn
comes after every other task woken in the same loop iteration: with 64 streams whose tokens arrive together, the last one's
turn comes 64 × (httpcore + h11 + httpx per-read work, 50-150 µs) later. Stamping there puts
that queueing into TTFT and ITL. The earliest point in user space is the transport's read
callback, which asyncio runs straight after ``epoll`` for every ready socket before any
task step: :func:`receipt_clock` wraps the ``data_received`` of the connection's protocol
(anyio's ``StreamProtocol``, which httpcore's asyncio backend reads through) to record the
monotonic time of each raw read.

While the loop works through a long iteration (many streams' chunks at once), sockets that
become readable are not read until it ends. So every stream also calls :func:`probe` around
each read it handles (Linux only): a non-blocking ``epoll_wait`` on the watched connections
that notes the first moment each was seen holding unread bytes; the next raw read of that
socket takes that moment as its stamp. Each socket is watched one-shot (``EPOLLONESHOT``,
level triggered), re-armed by the read that consumed what the probe saw, so a probe returns
only sockets newly waiting (about 0.6 µs when none is). The bytes that read consumes were
there at the probe, so the stamp is never before their arrival; it can precede the arrival
of more bytes read by the same ``recv`` (the rest of a frame split in two TCP segments
arriving later) by at most their gap.

How a stamp is used (see :meth:`ReceiptClock.stamp_ns`): when a piece of the body comes out
of httpx, the read that delivered (completed) it is the newest read the stream has taken
from the protocol; reads made after it, while the woken task had not yet run and paused the
transport, are still in the protocol's queue and are skipped. Its stamp, capped at now, lies
between the true receipt and the old stamp.

Kernel receive timestamps (Linux on x86-64 and arm64): a read that waits behind a stalled
loop (a garbage collection, a slow callback, another tenant on the core) is still late at the
raw read. So the connection's socket also gets ``SO_TIMESTAMPNS`` and its class is swapped for
a subclass whose ``recv``/``recv_into`` (what asyncio's selector transport calls) read with
``recvmsg`` and keep the ancillary timestamp: the moment the kernel received the last TCP
segment of that read. It is converted from ``CLOCK_REALTIME`` to the monotonic clock at the
read and becomes the read's stamp; it is never later than the read, and equals the true
receipt of every byte of a read that holds one segment (a read that drains several segments
queued during a stall takes the last one's time). A connection stamped by the kernel needs
no probe and is not watched. The returned bytes and raised errors are ``recv``'s own. Cost
per raw read (``bench/bench_receipt_read.py``): the raw-read stamp 0.4-0.7 µs, with the
kernel's 1.6-1.9 µs in all, against ~150 µs of httpx's own work per read.

When: a streamed call's request carries :func:`trace_connect` as httpcore's ``trace``
extension, which installs the clock as soon as the call opens its connection, so that even
the read holding the response headers (and perhaps the first token) is stamped. A kept-alive
connection keeps its clock; one opened by another request gets it when the first streamed
response on it arrives (:func:`receipt_clock`), and the reads before that are unstamped.

Not reached, and then the stamp is simply ``now`` (the previous behaviour): uvloop (it
caches the protocol's method), trio, sync clients (they read in the calling thread, so
their stamp is already at the read), custom transports, Unix sockets (no kernel stamp; the
raw read stays). Without kernel timestamps (other systems, or :data:`kernel_stamps` False)
the raw read and the probe remain. HTTP/2 multiplexes streams over one connection, so the
reads (and their stamps) are the connection's: a stall merges several streams' frames into
one read, all stamped at its last segment.

Clock: ``time.perf_counter_ns`` (monotonic), the clock of :mod:`.streaming`.
"""

from __future__ import annotations

import atexit
import collections
import functools
import inspect
import os
import platform
import select
import socket
import struct
import sys
import time
from typing import Any

__all__ = ["ReceiptClock", "receipt_clock", "trace_connect", "probe", "enable", "enabled", "kernel_stamps"]

#: The opt-in (see the module docstring; :func:`enable` sets it). False (the default):
#: :func:`receipt_clock` returns None and every stamp is taken when the body piece comes
#: out of httpx.
enabled = False

#: False: connections installed from now on are stamped at the raw read (and the probe),
#: without the kernel's receive timestamp.
kernel_stamps = True

# SO_TIMESTAMPNS (SO_TIMESTAMPNS_OLD, 35 in asm-generic; Python's socket module lacks the
# name) and its control message, a native ``struct timespec``. Other architectures number the
# option differently, so only these two are trusted.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_HAS_KERNEL_STAMPS = sys.platform.startswith("linux") and platform.machine() in ("x86_64", "aarch64")
_TIMESPEC = struct.Struct("@ll")
_ANCILLARY_SIZE = socket.CMSG_SPACE(_TIMESPEC.size) if _HAS_KERNEL_STAMPS else 0
# Linux turns receive timestamping on for the host when the first socket asks for it (the
# switch itself deferred to a kernel work item) and off when the last such socket closes;
# flipping it patches kernel code on every CPU. One socket held open for the process's life
# keeps it on, so connections opening and closing never flip it, and a new connection's
# first packets are stamped already.
_holder: socket.socket | None = None
# fd -> the control messages (the kernel's receive timestamp) of the latest read that returned
# data, left by the socket's read and taken by the protocol's ``data_received``, which the
# transport calls right after it.
_kernel_ancdata: dict[int, list] = {}

_ATTRIBUTE = "_inferpath_receipt_clock"
# epoll is Linux's; elsewhere there is no probe and stamps stay at the raw read.
_HAS_EPOLL = hasattr(select, "epoll")
_WATCH_EVENTS = getattr(select, "EPOLLIN", 1) | getattr(select, "EPOLLONESHOT", 0)
# Reads remembered per connection (a body piece's read is at most a few reads back: more
# queue only while the loop is held up).
_KEPT_READS = 16
# httpcore stream -> anyio stream (-> TLS stream's transport) -> socket stream: a few hops.
_MAX_HOPS = 6


class ReceiptClock:
    """The receipt time (``perf_counter_ns``) of the raw reads of one connection: the
    kernel's receipt, else the first moment :func:`probe` saw the bytes waiting
    (``ready_ns``), else the read's own time. ``read_ns`` is the latest read's (None until
    the first read after installation); ``reads`` keeps the last few reads as
    ``(received, stamp)``, ``received`` being the connection's byte count once that read was
    in (``received`` now); ``unread`` is the protocol's queue of read bytes the stream has
    not taken yet (anyio's ``read_queue``)."""

    __slots__ = ("read_ns", "ready_ns", "rearm", "fd", "reads", "received", "unread")

    def __init__(self) -> None:
        self.read_ns: int | None = None
        self.ready_ns: int | None = None
        self.rearm: Any = None  # re-enables the one-shot watch of the socket
        self.fd = -1  # the socket's descriptor when the kernel stamps its reads
        self.reads: collections.deque[tuple[int, int]] = collections.deque(maxlen=_KEPT_READS)
        self.received = 0
        self.unread: collections.deque | None = None

    def stamp_ns(self, now_ns: int, not_before_ns: int) -> int:
        """Receipt time of the body piece just returned at ``now_ns``: the stamp of the read
        that brought its last byte, if it was stamped at or after ``not_before_ns`` (the
        request's start), else ``now_ns``.

        The stream has taken every byte but those still queued in the protocol (reads the
        transport made before the woken task ran and paused it, or the rest of a read that
        anyio split): so its last byte is byte ``received - queued``, and its read is the
        oldest kept read whose count reaches it. Unknown (``now_ns``) when that read is no
        longer kept or was made before installation."""
        read_ns = self.read_ns
        unread = self.unread
        if unread:
            taken = self.received - sum(map(len, unread))
            reads = self.reads
            read_ns = None
            for received, stamp_ns in reversed(reads):
                if received < taken:
                    break
                read_ns = stamp_ns
            else:
                if len(reads) == reads.maxlen:  # older reads may have been dropped
                    read_ns = None
            if taken <= 0:
                read_ns = None
        if read_ns is None or read_ns < not_before_ns or read_ns > now_ns:
            return now_ns
        return read_ns


class _Watch:
    """This process's epoll set of watched connections (fd -> clock); rebuilt after fork."""

    __slots__ = ("pid", "epoll", "clocks")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.epoll = select.epoll()
        self.clocks: dict[int, ReceiptClock] = {}


_watch: _Watch | None = None


def probe() -> None:
    """Note the first moment each watched connection holds unread bytes (one non-blocking
    ``epoll_wait``; a few µs). Never raises."""
    watch = _watch
    if watch is None:
        return
    try:
        if watch.pid != os.getpid():
            return
        events = watch.epoll.poll(0)
        if not events:
            return
        now_ns = time.perf_counter_ns()
        clocks = watch.clocks
        for fd, _mask in events:
            clock = clocks.get(fd)
            if clock is not None and clock.ready_ns is None:
                clock.ready_ns = now_ns
    except Exception:
        pass


def _watch_socket(stream: Any, clock: ReceiptClock) -> None:
    global _watch
    if not _HAS_EPOLL:
        return
    transport = getattr(stream, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return
    fd = sock.fileno()
    if fd < 0:
        return
    watch = _watch
    if watch is None or watch.pid != os.getpid():
        watch = _watch = _Watch()
    # A closed socket leaves the epoll set by itself; its fd number may come back for a new
    # connection, whose clock then replaces the old one here.
    try:
        watch.epoll.register(fd, _WATCH_EVENTS)
    except FileExistsError:
        watch.epoll.modify(fd, _WATCH_EVENTS)
    clock.rearm = functools.partial(watch.epoll.modify, fd, _WATCH_EVENTS)
    watch.clocks[fd] = clock


def _kernel_time(ancdata: list, now_ns: int, _unpack: Any = _TIMESPEC.unpack_from, _time_ns: Any = time.time_ns) -> int:
    """The receive timestamp among a read's control messages, moved from ``CLOCK_REALTIME``
    to the monotonic clock by the offset between the two now; ``now_ns`` if there is none."""
    try:
        level, kind, data = ancdata[0]  # the only control message asked for
        if kind == _SO_TIMESTAMPNS and level == socket.SOL_SOCKET:
            seconds, nanoseconds = _unpack(data)
            return seconds * 1_000_000_000 + nanoseconds - _time_ns() + now_ns
    except Exception:
        pass
    return now_ns


class _KernelStampedSocket(socket.socket):
    """The connection's own socket (its class swapped; same layout, no new state) reading
    with ``recvmsg`` so that the kernel's receive timestamp of each read is kept. Data,
    return values and errors are those of ``recv``/``recv_into``."""

    __slots__ = ()

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if bufsize < 0:  # the plain call's own error
            return super().recv(bufsize, flags)
        data, ancdata, _flags, _address = self.recvmsg(bufsize, _ANCILLARY_SIZE, flags)
        if ancdata and data:
            _kernel_ancdata[self.fileno()] = ancdata
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        try:
            view = memoryview(buffer)
        except TypeError:
            return super().recv_into(buffer, nbytes, flags)
        with view:
            if view.readonly or view.format != "B" or view.ndim != 1 or nbytes < 0 or nbytes > view.nbytes:
                # Anything but a writable byte buffer that fits: the plain call (and its
                # errors), unstamped.
                return super().recv_into(buffer, nbytes, flags)
            target = view[:nbytes] if nbytes else view
            try:
                count, ancdata, _flags, _address = self.recvmsg_into([target], _ANCILLARY_SIZE, flags)
            finally:
                target.release()
        if ancdata and count:
            _kernel_ancdata[self.fileno()] = ancdata
        return count


def _enable_kernel_stamps(sock: socket.socket) -> None:
    """``SO_TIMESTAMPNS`` on ``sock``, and on the process's holder socket first (above).
    Raises OSError when the system refuses it."""
    global _holder
    if _holder is None:
        holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            holder.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        except OSError:
            holder.close()
            raise
        _holder = holder
        atexit.register(holder.close)
    sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)


def _kernel_stamp_socket(stream: Any, clock: ReceiptClock) -> bool:
    """Have the kernel stamp the reads of the TCP socket under ``stream`` (see the module
    docstring); True when it will."""
    if not (kernel_stamps and _HAS_KERNEL_STAMPS):
        return False
    transport = getattr(stream, "_transport", None)
    sock: Any = getattr(transport, "_sock", None)  # asyncio's selector transports keep it here
    if type(sock) not in (socket.socket, _KernelStampedSocket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    fd = sock.fileno()
    if fd < 0:
        return False
    try:
        _enable_kernel_stamps(sock)
    except OSError:
        return False
    sock.__class__ = _KernelStampedSocket
    _kernel_ancdata.pop(fd, None)  # left by an earlier socket with this number
    clock.fd = fd
    return True


def _stream_of(network_stream: Any) -> Any:
    """The anyio socket stream (the object holding ``_protocol``) under a network stream."""
    stream = network_stream
    for _ in range(_MAX_HOPS):
        if stream is None:
            return None
        protocol = getattr(stream, "_protocol", None)
        if protocol is not None and callable(getattr(protocol, "data_received", None)):
            return stream
        inner = getattr(stream, "_stream", None)
        stream = inner if inner is not None else getattr(stream, "transport_stream", None)
    return None


_stamping_classes: dict[type, type] = {}


def _stamping_class(cls: type) -> type:
    """A subclass of the protocol class ``cls`` whose ``data_received`` stamps the read.

    The protocol's class is swapped rather than its method replaced on the instance: a
    closure stored on the instance and holding its bound method is a reference cycle, which
    would leave every connection (socket, transport, buffers) to the cyclic GC instead of
    freeing it when it closes.
    """
    stamping = _stamping_classes.get(cls)
    if stamping is not None:
        return stamping
    base_data_received = cls.data_received  # type: ignore[attr-defined]  # a protocol class

    def data_received(self: Any, data: Any, _base: Any = base_data_received, _now: Any = time.perf_counter_ns) -> None:
        clock = self.__dict__.get(_ATTRIBUTE)
        if clock is not None:
            read_ns = _now()
            ready_ns = clock.ready_ns
            if clock.fd >= 0:  # the kernel's receipt of what the socket read just returned
                ancdata = _kernel_ancdata.pop(clock.fd, None)
                kernel_ns = _kernel_time(ancdata, read_ns) if ancdata else read_ns
                clock.read_ns = kernel_ns if kernel_ns <= read_ns else read_ns
            elif ready_ns is None:
                clock.read_ns = read_ns
            else:  # a probe saw these bytes waiting (and disarmed the watch)
                clock.ready_ns = None
                clock.read_ns = ready_ns if ready_ns <= read_ns else read_ns
                try:
                    clock.rearm()
                except Exception:
                    pass
            clock.received += len(data)
            clock.reads.append((clock.received, clock.read_ns))
        _base(self, data)

    stamping = type(cls.__name__, (cls,), {"data_received": data_received, "__module__": cls.__module__})
    _stamping_classes[cls] = stamping
    return stamping


def enable(on: bool = True) -> None:
    """Turn kernel receive timestamps (and the raw-read stamp where the kernel has none) on
    or off for connections reached from now on. Connections already stamped keep their
    stamping classes until they close."""
    global enabled
    enabled = bool(on)


def receipt_clock(response: Any) -> ReceiptClock | None:
    """The :class:`ReceiptClock` of the connection behind an ``httpx.Response`` (read
    through httpcore's ``network_stream`` extension), installing it on first use.

    Installation is once per connection (a keep-alive connection keeps its clock; the
    request's :func:`trace_connect` hook installs it when the connection is opened, so that
    the response's first read is stamped too). Returns None, never raises, when the
    connection cannot be reached (see the module docstring) or :data:`enabled` is False.
    """
    if not enabled:
        return None
    try:
        extensions = getattr(response, "extensions", None) or {}
        return _install(extensions.get("network_stream"))
    except Exception:
        return None


def _install(network_stream: Any) -> ReceiptClock | None:
    stream = _stream_of(network_stream)
    if stream is None:
        return None
    protocol = stream._protocol
    clock = getattr(protocol, _ATTRIBUTE, None)
    if isinstance(clock, ReceiptClock):
        return clock
    clock = ReceiptClock()
    unread = getattr(protocol, "read_queue", None)
    if isinstance(unread, collections.deque):
        clock.unread = unread
    setattr(protocol, _ATTRIBUTE, clock)
    # The transport looks the method up on every read (asyncio's selector transports do;
    # uvloop caches it, and then read_ns stays None and the stamp falls back).
    protocol.__class__ = _stamping_class(type(protocol))
    try:
        if not _kernel_stamp_socket(stream, clock):
            _watch_socket(stream, clock)
    except Exception:  # no kernel stamps or no watch: stamps stay at the raw read
        pass
    return clock


_CONNECTED = "connection.connect_tcp.complete"


def trace_connect(previous: Any = None) -> Any:
    """An httpcore ``trace`` request extension (async) that installs the receipt clock on a
    connection as soon as the request opens it, before anything is read from it; without
    it, a response whose headers and first token come in one read taken while the loop is
    held up would have that read unstamped. ``previous`` (the request's own ``trace``
    extension, if any) is called for every event as before; a hook of this function's is
    returned as it is (a request sent again keeps one). Never raises of its own."""
    if getattr(previous, _ATTRIBUTE, False):
        return previous

    async def trace(name: str, info: dict[str, Any]) -> None:
        if name == _CONNECTED and enabled:
            try:
                _install(info.get("return_value"))
            except Exception:
                pass
        if previous is not None:
            result = previous(name, info)
            if inspect.isawaitable(result):
                await result

    setattr(trace, _ATTRIBUTE, True)
    return trace
