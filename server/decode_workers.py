"""OTLP trace decoding in worker processes, off the server's GIL.

The server is one Python process (embedded chDB locks its folder), and at tens of thousands
of spans per second its threads take turns on one GIL: decoding a protobuf export into span
rows was ~30 % of the time the GIL was held (bench/README.md, server_ingest), while a core
stayed idle. :class:`DecodeWorkers` sends each trace export's body to a child process
(``python -m inferpath.server.decode_workers``) that runs
:func:`~inferpath.server.otlp.decode_trace_request` and answers with the spans as plain
tuples; the server only rebuilds the :class:`~inferpath.storage.rows.SpanRow` objects
(~1.5 µs per span against ~6 µs to decode).

Wire format on the child's stdin/stdout: frames of an 8-byte little-endian length and a
pickle (protocol 5). The child first writes one empty frame once its imports are done
(ready). A request is two frames: ``(content_type, content_encoding, oldest_unix_ns, native_types)``
then the raw body (never copied into a pickle). A reply is one frame:
``("ok", rejected_spans, error_message, [span fields…], native_block, warned_spans)``, ``("415", message)``,
``("413", message)``, ``("400", message)`` or ``("error", message)``. ``native_types``: ``None``, or the type
names of ``otel_traces``' columns in :data:`~inferpath.storage.rows.SPAN_COLUMNS` order; then
the child also writes the spans as one ClickHouse Native block
(:class:`~inferpath.storage.native.NativeBlockWriter`), so that the server's drainer only
joins bytes (``native_block`` is ``None`` when it could not: the server writes it itself).
With a block, the span fields are those of each span's
:func:`~inferpath.server.derive.derivation_view` (what request derivation reads: the block
is what is stored), so the server unpickles and holds no more than that: no prompt or
other attribute derivation does not read (bench/README.md, server_ingest); without one,
all fields. Only the server unpickles what its own child wrote.

Failure handling (telemetry never breaks the service it observes): a child found dead is
replaced before an export reaches it; one that dies, hangs past ``timeout_seconds`` or
answers garbage mid-export is killed, and that export is decoded in the request thread
instead, so the client sees the same answer; so is an export that finds no idle worker
within ``checkout_wait_seconds``. Failures are counted (``failures_total``,
``fallbacks_total``). After ``max_spawn_failures`` failed starts in a row (no ready frame),
no start is tried for ``retry_seconds``. A child exits when its stdin closes: when the
server closes it, or when the server dies (even by ``kill -9``) and the kernel closes the
pipe.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import BinaryIO

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None  # type: ignore[assignment]

from inferpath.server.derive import derivation_resource_attributes, derivation_view_fields
from inferpath.server.memory import tune_gc_for_server
from inferpath.server.otlp import (
    BodyTooLargeError,
    DecodedSpans,
    OTLPDecodeError,
    UnsupportedMediaTypeError,
    decode_trace_request,
)
from inferpath.storage.native import NativeBlockWriter
from inferpath.storage.rows import SPAN_COLUMNS, SpanRow

__all__ = ["DecodeWorkers"]

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct("<Q")
_MAX_FRAME = 1 << 34  # 16 GiB: anything larger is a broken stream, not a reply


def _span_fields(span: SpanRow) -> tuple:
    """The arguments of :meth:`SpanRow.from_checked` for ``span`` (its start in ns last)."""
    return (span.timestamp, span.trace_id, span.span_id, span.parent_span_id, span.trace_state,
            span.span_name, span.span_kind, span.service_name, span.resource_attributes,
            span.scope_name, span.scope_version, span.span_attributes, span.duration_ns,
            span.status_code, span.status_message, span.events, span.links, span.start_ns)


def _view_fields(spans: list[SpanRow]) -> list[tuple]:
    """:func:`_span_fields` of each span's :func:`~inferpath.server.derive.derivation_view`,
    one view of a resource's attributes for all its spans (pickle then sends it once)."""
    fields = []
    source = view = None
    for span in spans:
        if span.resource_attributes is not source:  # spans of one resource come in a row, sharing its map
            source = span.resource_attributes
            view = derivation_resource_attributes(source)
        fields.append(derivation_view_fields(span, view))
    return fields


# --------------------------------------------------------------------------- child side
def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(stream: BinaryIO) -> bytes | None:
    header = _read_exact(stream, _LENGTH.size)
    if header is None:
        return None
    return _read_exact(stream, _LENGTH.unpack(header)[0])


_writers: dict[tuple[str, ...], NativeBlockWriter] = {}


def _native_block(spans: list[SpanRow], native_types: tuple[str, ...] | None) -> bytes | None:
    """``spans`` as a Native block in ``native_types``; ``None`` when not asked for or not
    writable (logged; the server then writes it, and answers for a failure)."""
    if native_types is None:
        return None
    try:
        writer = _writers.get(native_types)
        if writer is None:
            writer = _writers[native_types] = NativeBlockWriter(SPAN_COLUMNS, native_types)
        return writer.block([span.to_insert_row(timestamp_ns=True) for span in spans])
    except Exception:  # noqa: BLE001 - the server writes the block and answers for a failure
        logger.exception("could not write the decoded spans as a Native block")
        return None


def _reply(content_type: str | None, content_encoding: str | None, oldest_unix_ns: int,
           native_types: tuple[str, ...] | None, body: bytes) -> tuple:
    try:
        decoded = decode_trace_request(body, content_type=content_type, content_encoding=content_encoding,
                                       oldest_unix_ns=oldest_unix_ns)
    except UnsupportedMediaTypeError as exc:
        return ("415", str(exc))
    except BodyTooLargeError as exc:
        return ("413", str(exc))
    except OTLPDecodeError as exc:
        return ("400", str(exc))
    except Exception as exc:  # noqa: BLE001 - answered as a 400 by the server, as in-process
        logger.exception("unexpected error decoding an OTLP traces body")
        return ("error", str(exc))  # the text the server answers with when it decodes itself
    block = _native_block(decoded.spans, native_types)
    fields = [_span_fields(s) for s in decoded.spans] if block is None else _view_fields(decoded.spans)
    return ("ok", decoded.rejected_spans, decoded.error_message, fields, block, decoded.warned_spans)


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """The child's loop: say it is ready (one empty frame, once its imports are done), then
    decode requests from ``requests`` until it ends (the server closed the pipe or died),
    writing each reply to ``replies``."""
    replies.write(_LENGTH.pack(0))
    replies.flush()
    while True:
        meta = _read_frame(requests)
        body = _read_frame(requests) if meta is not None else None
        if body is None:
            return
        content_type, content_encoding, oldest_unix_ns, native_types = pickle.loads(meta)
        payload = pickle.dumps(_reply(content_type, content_encoding, oldest_unix_ns, native_types, body),
                               protocol=5)
        replies.write(_LENGTH.pack(len(payload)))
        replies.write(payload)
        replies.flush()


# --------------------------------------------------------------------------- server side
_PIPE_BYTES = 1 << 20


def _ready(fd: int, event: int, deadline: float) -> bool:
    """Wait until ``fd`` is ready for ``event`` (``POLLIN``/``POLLOUT``; a closed peer counts
    as ready: the read or write then says so) or ``deadline`` (monotonic) passes. ``poll``,
    not ``select``: a server holding many files has descriptors past select's 1024."""
    wait = deadline - time.monotonic()
    if wait <= 0:
        return False
    poller = select.poll()
    poller.register(fd, event)
    return bool(poller.poll(wait * 1000))


def _widen_pipe(fd: int) -> None:
    """Grow a pipe's buffer to 1 MiB (Linux; the unprivileged maximum by default): an export
    body or its reply then crosses in one or two system calls, and each call is a point
    where the request thread must win the GIL back (at 64 KiB, a 1000-span reply took ~5)."""
    setter = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl is not None else None
    if setter is None:
        return
    try:
        fcntl.fcntl(fd, setter, _PIPE_BYTES)
    except OSError:  # above /proc/sys/fs/pipe-max-size: keep the default
        pass
class _Worker:
    """One child process and its pipes; used by one request thread at a time."""

    #: The child's command line (a class attribute, so that a test can start another).
    command: tuple[str, ...] = (sys.executable, "-m", "inferpath.server.decode_workers")

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            list(self.command),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True, bufsize=0)
        self.pid = self.process.pid
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin_fd, self._stdout_fd = self.process.stdin.fileno(), self.process.stdout.fileno()
        os.set_blocking(self._stdin_fd, False)
        for fd in (self._stdin_fd, self._stdout_fd):
            _widen_pipe(fd)
        self.ready = False  # True once it said so: a worker that never did failed to start

    def call(self, meta: tuple, body: bytes, timeout_seconds: float) -> bytes:
        """Send one request, wait for its reply (the pickle, not yet loaded: the worker is
        free for the next export meanwhile); the first call waits for the child's ready
        frame first. Raises ``OSError`` (pipe closed: the child died), ``TimeoutError`` or
        ``EOFError`` (broken stream)."""
        deadline = time.monotonic() + timeout_seconds
        if not self.ready:  # the empty frame the child writes once its imports are done
            if self._read(_LENGTH.size, deadline) != _LENGTH.pack(0):
                raise EOFError("the decode worker did not start")
            self.ready = True
        head = pickle.dumps(meta, protocol=5)
        self._write(_LENGTH.pack(len(head)) + head + _LENGTH.pack(len(body)), deadline)
        self._write(body, deadline)
        size = _LENGTH.unpack(self._read(_LENGTH.size, deadline))[0]
        if size > _MAX_FRAME:
            raise EOFError(f"reply frame of {size} bytes")
        return self._read(size, deadline)

    def _write(self, data: bytes, deadline: float) -> None:
        # Raw writes on a non-blocking pipe, each after select() says there is room: a child
        # that stopped reading cannot hold the request thread past the deadline.
        fd = self._stdin_fd
        view = memoryview(data)
        while view:
            if not _ready(fd, select.POLLOUT, deadline):
                raise TimeoutError("the decode worker does not take its input")
            try:
                view = view[os.write(fd, view[:1 << 20]):]
            except BlockingIOError:
                continue

    def _read(self, size: int, deadline: float) -> bytes:
        chunks, left = [], size
        fd = self._stdout_fd
        while left:
            if not _ready(fd, select.POLLIN, deadline):
                raise TimeoutError("no reply from the decode worker")
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise EOFError("the decode worker closed its output")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self, timeout_seconds: float) -> None:
        """Close the child's stdin (it exits at EOF); kill it if it has not after the timeout."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout_seconds)
        except subprocess.TimeoutExpired:
            self.kill()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def kill(self) -> None:
        try:
            self.process.kill()
            self.process.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass


class DecodeWorkers:
    """``processes`` (≥ 1) child processes that decode OTLP trace exports (module docstring).

    :meth:`decode_trace_request` has the signature and results of
    :func:`inferpath.server.otlp.decode_trace_request`, which it falls back to in the
    calling thread when no worker can serve: none is idle within ``checkout_wait_seconds``
    (all busy or hung), or none can be started. ``timeout_seconds``: the longest one export
    may take in a worker before it is killed and the export decoded in-process. Workers
    found dead, or missing, are started again when an export needs one; after
    ``max_spawn_failures`` failed starts in a row (a child that exits or hangs before its
    ready frame; a failed ``exec``) no start is tried for ``retry_seconds``. Counters:
    ``decoded_total`` (exports decoded by a worker), ``failures_total`` (workers killed or
    found dead), ``fallbacks_total`` (exports decoded in-process). Raises ``ValueError``
    for ``processes`` < 1 or a timeout ≤ 0.

    ``native_types``: ``None`` (the default), or the type names of ``otel_traces``' columns
    in :data:`~inferpath.storage.rows.SPAN_COLUMNS` order; then the spans a worker decodes
    also come back as a Native block (``DecodedSpans.native_block``). An export decoded
    in-process comes back without one.
    """

    def __init__(self, processes: int = 1, *, timeout_seconds: float = 60.0, checkout_wait_seconds: float = 1.0,
                 max_spawn_failures: int = 5, retry_seconds: float = 60.0) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        if not timeout_seconds > 0 or not checkout_wait_seconds > 0:
            raise ValueError(f"timeouts must be > 0, got {timeout_seconds} and {checkout_wait_seconds}")
        self.processes = processes
        self.timeout_seconds = float(timeout_seconds)
        self.checkout_wait_seconds = float(checkout_wait_seconds)
        self.max_spawn_failures = max_spawn_failures
        self.retry_seconds = float(retry_seconds)
        self.native_types: tuple[str, ...] | None = None
        self.decoded_total = 0
        self.failures_total = 0
        self.fallbacks_total = 0
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._busy = 0
        self._spawn_failures = 0
        self._spawn_paused_until = 0.0
        self._closed = False
        for _ in range(processes):
            worker = self._spawn()
            if worker is not None:
                self._idle.append(worker)

    @property
    def alive(self) -> int:
        """Worker processes running now (idle or decoding)."""
        with self._cond:
            return self._busy + sum(1 for w in self._idle if w.alive())

    @property
    def pids(self) -> list[int]:
        """Process ids of the idle workers (for tests and diagnostics)."""
        with self._cond:
            return [w.pid for w in self._idle]

    def _spawn(self) -> _Worker | None:
        """A new worker, or ``None`` (starts are paused, or this one failed to exec)."""
        if time.monotonic() < self._spawn_paused_until:
            return None
        try:
            return _Worker()
        except OSError as exc:
            logger.warning("could not start a decode worker (%s)", exc)
            self._start_failed()
            return None

    def _start_failed(self) -> None:
        with self._cond:
            self._spawn_failures += 1
            if self._spawn_failures < self.max_spawn_failures:
                return
            self._spawn_failures = 0
            self._spawn_paused_until = time.monotonic() + self.retry_seconds
        logger.warning("%d decode workers failed to start in a row; decoding in the server, next try in %.0f s",
                       self.max_spawn_failures, self.retry_seconds)

    def _checkout(self) -> _Worker | None:
        """An idle live worker (started now if one is missing); ``None`` after
        ``checkout_wait_seconds`` without one, when closed, or when none can start."""
        deadline = time.monotonic() + self.checkout_wait_seconds
        with self._cond:
            while not self._closed:
                while self._idle:
                    worker = self._idle.pop()
                    self._busy += 1
                    if worker.alive():
                        return worker
                    self.failures_total += 1  # died while idle: replaced below
                    self._busy -= 1
                if self._busy < self.processes:  # a worker is missing: start one for this export
                    self._busy += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            else:
                return None
        worker = self._spawn()
        if worker is None:
            with self._cond:
                self._busy -= 1
                self._cond.notify()
        return worker

    def _checkin(self, worker: _Worker | None) -> None:
        with self._cond:
            self._busy -= 1
            if worker is not None:
                if self._closed:
                    worker.close(1.0)
                else:
                    self._idle.append(worker)
            self._cond.notify()

    def decode_trace_request(self, body: bytes, *, content_type: str | None, content_encoding: str | None,
                             oldest_unix_ns: int = 0) -> DecodedSpans:
        """Decode one ``/v1/traces`` body in a worker; see
        :func:`inferpath.server.otlp.decode_trace_request` for arguments, results and the
        errors raised (``UnsupportedMediaTypeError``, ``BodyTooLargeError``,
        ``OTLPDecodeError``). Any other failure of the body's decoding raises
        ``RuntimeError`` naming it; a failure of the worker itself is never raised (the
        export is decoded here instead)."""
        decoded = self._ask_worker(body, (content_type, content_encoding, oldest_unix_ns, self.native_types))
        if decoded is None:
            with self._cond:
                self.fallbacks_total += 1
            return decode_trace_request(body, content_type=content_type, content_encoding=content_encoding,
                                        oldest_unix_ns=oldest_unix_ns)
        if isinstance(decoded, DecodedSpans):
            return decoded
        kind, message = decoded
        if kind == "415":
            raise UnsupportedMediaTypeError(message)
        if kind == "413":
            raise BodyTooLargeError(message)
        if kind == "400":
            raise OTLPDecodeError(message)
        raise RuntimeError(message)

    def _ask_worker(self, body: bytes, meta: tuple) -> DecodedSpans | tuple[str, str] | None:
        """The worker's answer: the decoded spans or ``(kind, message)`` of an error; ``None``
        when no worker could answer (the caller decodes in-process)."""
        worker = self._checkout()
        if worker is None:
            return None
        reply = None
        try:
            reply = worker.call(meta, body, self.timeout_seconds)
        except (OSError, EOFError, TimeoutError, ValueError, struct.error) as exc:
            logger.warning("decode worker %d failed (%s: %s); decoding this export in the server, another"
                           " worker starts when one is needed", worker.pid, type(exc).__name__, exc)
            worker.kill()
            with self._cond:
                self.failures_total += 1
            if not worker.ready:  # it never said it was ready: a failed start
                self._start_failed()
            worker = None
        finally:
            self._checkin(worker)
        if reply is None:
            return None
        with self._cond:
            self._spawn_failures = 0
        try:  # after the check-in: the worker takes the next export meanwhile
            answer = pickle.loads(reply)
            if answer[0] == "ok":
                from_checked = SpanRow.from_checked
                block = answer[4]
                answer = DecodedSpans([from_checked(*fields) for fields in answer[3]], answer[1], answer[2],
                                      block if isinstance(block, bytes) else None, int(answer[5]))
            else:
                answer = (str(answer[0]), str(answer[1]))
        except Exception as exc:  # noqa: BLE001 - garbled (or from other code, after an upgrade in place)
            logger.warning("decode worker reply unreadable (%s: %s); decoding this export in-process",
                           type(exc).__name__, exc)
            return None
        with self._cond:
            self.decoded_total += 1
        return answer

    def close(self, timeout_seconds: float = 5.0) -> None:
        """Stop the idle workers now and busy ones when their export is done. Idempotent."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for worker in idle:
            worker.close(timeout_seconds)


def _main() -> int:
    # Ctrl-C reaches the whole process group: the server shuts down and closes the pipe,
    # which is what ends this loop; the child must not die of the signal first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s decode worker: %(message)s")
    tune_gc_for_server()  # the server's collector settings: a worker allocates as its ingest does
    serve(sys.stdin.buffer, sys.stdout.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
