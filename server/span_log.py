"""An append-only write-ahead log of accepted OTLP trace export bodies, with drain progress.

The receiver answers 200 once an export's body is appended here; one inserter thread
(:mod:`inferpath.server.log_ingest`) drains the log into large inserts. This module is the
file format and its bookkeeping only — no decoding, no store.

Layout of the log folder::

    log_id                 random id of this log, part of every insert's dedup token
    00000000000000000000.log   segments, named by the global offset of their first byte
    00000000000067108864.log
    progress               "B start end trace_id span_id" before an insert, "D end" after

Offsets are global byte positions over the concatenated segments, so a range of records
``[start, end)`` names the same rows forever (the insert's dedup token is built from it).

A record is a 45-byte header — magic ``b"IPL1"``, payload length (u32), CRC-32 of token,
flags and payload (u32), the export's 32-byte token digest, flags (u8: 1 = OTLP/JSON else
protobuf, 2 = gzip) — followed by the body exactly as received. At :meth:`SpanLog.open`
every record past the committed offset is read and checked; a record cut short or failing
its CRC at the end of the last segment (the process died inside ``write``) is cut off: its
export was never answered 200, so its client retries it.

Durability: records and progress lines are written with ``os.write`` and not ``fsync``ed.
After ``write`` returns the bytes are in the kernel's page cache, which survives ``kill -9``
of the server (the failure this log is for); a power loss can lose the last seconds, as it
can for ClickHouse's own inserts, which do not ``fsync`` by default either
(``fsync_after_insert = 0``), so an ``fsync`` here would not make the store as a whole
durable against power loss, and it costs milliseconds per export.

Drained segments are deleted, except the newest ones up to ``retain_drained_bytes``: their
record tokens are read back at start-up so that a client retrying (after a restart) an
export whose 200 was lost is recognised even after its rows were inserted.
"""

from __future__ import annotations

import logging
import os
import secrets
import struct
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FLAG_GZIP", "FLAG_JSON", "HEADER_BYTES", "LogRecord", "SpanLog", "UnfinishedInsert"]

logger = logging.getLogger(__name__)

MAGIC = b"IPL1"
# magic, payload bytes, CRC-32 (token + flags + payload), token digest, flags
_HEADER = struct.Struct("<4sII32sB")
HEADER_BYTES = _HEADER.size
FLAG_JSON = 1
FLAG_GZIP = 2
_SEGMENT_SUFFIX = ".log"
_PROGRESS = "progress"
# Progress lines kept before the file is rewritten to its last state.
_PROGRESS_MAX_LINES = 4096


@dataclass(frozen=True)
class LogRecord:
    """One accepted export: global byte range ``[start, end)`` (header included), ``token``
    (32-byte digest of the export's dedup token), ``flags`` and the ``body`` as received."""

    start: int
    end: int
    token: bytes
    flags: int
    body: bytes

    @property
    def content_type(self) -> str:
        """The OTLP media type the body was sent with."""
        return "application/json" if self.flags & FLAG_JSON else "application/x-protobuf"

    @property
    def content_encoding(self) -> str | None:
        """``"gzip"`` or ``None``."""
        return "gzip" if self.flags & FLAG_GZIP else None


@dataclass(frozen=True)
class UnfinishedInsert:
    """An insert whose ``B`` line has no ``D`` line: the range ``[start, end)`` and one sample
    ``(trace_id, span_id)`` of its rows (empty strings when it had none)."""

    start: int
    end: int
    trace_id: str
    span_id: str


def _crc(token: bytes, flags: int, body: bytes) -> int:
    return zlib.crc32(body, zlib.crc32(bytes((flags,)), zlib.crc32(token))) & 0xFFFFFFFF


def encode_record(token: bytes, flags: int, body: bytes) -> bytes:
    """Header + body of one record. Raises ``ValueError`` for a token that is not 32 bytes,
    flags outside 0..255 or a body of 4 GiB or more."""
    if len(token) != 32:
        raise ValueError(f"token must be 32 bytes, got {len(token)}")
    if not 0 <= flags <= 255:
        raise ValueError(f"flags must be 0..255, got {flags}")
    if len(body) >= 2**32:
        raise ValueError(f"body must be < 4 GiB, got {len(body)} bytes")
    return _HEADER.pack(MAGIC, len(body), _crc(token, flags, body), token, flags) + body


class SpanLog:
    """The log in ``folder`` (created if missing), opened for appending and draining.

    ``segment_bytes``: a segment is closed and a new one started once it holds at least this
    many bytes (≥ 1). ``retain_drained_bytes``: drained segments kept for their tokens
    (≥ 0). ``max_tokens``: tokens remembered for deduplication (≥ 1, oldest forgotten).
    After opening, :attr:`unfinished` lists the records past the committed offset (to be
    inserted again) and :attr:`unfinished_insert` the insert that was running at a crash,
    if any. Raises ``OSError`` when the folder or its files cannot be read or written,
    ``ValueError`` for bad limits. Thread-safe.
    """

    def __init__(self, folder: Path, *, segment_bytes: int = 64 * 1024 * 1024,
                 retain_drained_bytes: int = 64 * 1024 * 1024, max_tokens: int = 100_000) -> None:
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be >= 1, got {segment_bytes}")
        if retain_drained_bytes < 0:
            raise ValueError(f"retain_drained_bytes must be >= 0, got {retain_drained_bytes}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.folder = Path(folder)
        self.segment_bytes = segment_bytes
        self.retain_drained_bytes = retain_drained_bytes
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self._tokens: OrderedDict[bytes, None] = OrderedDict()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.log_id = self._read_or_create_id()
        self.torn_bytes_dropped = 0  # bytes of a torn tail cut off at open
        self.committed_offset, self.unfinished_insert = self._read_progress()
        self._segments: list[int] = sorted(
            int(p.stem) for p in self.folder.glob(f"*{_SEGMENT_SUFFIX}") if p.stem.isdigit())
        self.unfinished: list[LogRecord] = []
        self.end_offset = self._scan()
        if self.committed_offset > self.end_offset:
            # Progress past the data (segments removed by hand): nothing left to drain.
            logger.warning("span log %s: progress %d is past the log's end %d", self.folder,
                           self.committed_offset, self.end_offset)
            self.end_offset = self.committed_offset
        if self.unfinished_insert is not None and self.unfinished_insert.start != self.committed_offset:
            self.unfinished_insert = None  # a stale line: an insert always starts at the committed offset
        if not self._segments or self._segment_path(self._segments[-1]).stat().st_size >= segment_bytes:
            self._segments.append(self.end_offset)
        self._fd = os.open(self._segment_path(self._segments[-1]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._segment_size = os.fstat(self._fd).st_size
        self._progress_fd = os.open(self.folder / _PROGRESS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._progress_lines = 0
        self._rewrite_progress()

    # ------------------------------------------------------------------ open
    def _read_or_create_id(self) -> str:
        path = self.folder / "log_id"
        try:
            text = path.read_text(encoding="ascii").strip()
            if text.isalnum():
                return text
        except FileNotFoundError:
            pass
        new_id = secrets.token_hex(8)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(new_id, encoding="ascii")
        os.replace(temporary, path)
        return new_id

    def _read_progress(self) -> tuple[int, UnfinishedInsert | None]:
        committed, begun = 0, None
        try:
            text = (self.folder / _PROGRESS).read_text(encoding="ascii", errors="replace")
        except FileNotFoundError:
            return 0, None
        for line in text.splitlines():
            parts = line.split()
            try:
                if parts[0] == "D" and len(parts) == 2:
                    committed = max(committed, int(parts[1]))
                    begun = None if begun is not None and begun.end <= committed else begun
                elif parts[0] == "B" and len(parts) in (3, 5):
                    trace_id, span_id = (parts[3], parts[4]) if len(parts) == 5 else ("", "")
                    begun = UnfinishedInsert(int(parts[1]), int(parts[2]), trace_id, span_id)
            except (IndexError, ValueError):
                continue  # a torn last line: the state before it stands
        if begun is not None and begun.end <= committed:
            begun = None
        return committed, begun

    def _segment_path(self, start: int) -> Path:
        return self.folder / f"{start:020d}{_SEGMENT_SUFFIX}"

    def _scan(self) -> int:
        """Read every segment's record headers (tokens), load the records past the committed
        offset, cut a torn tail off; return the log's end offset."""
        end = self._segments[0] if self._segments else self.committed_offset
        for index, start in enumerate(self._segments):
            path = self._segment_path(start)
            last = index == len(self._segments) - 1
            with open(path, "rb") as segment:
                data = segment.read()
            position = 0
            while position < len(data):
                problem = None
                if len(data) - position < HEADER_BYTES:
                    problem = "header cut short"
                else:
                    magic, size, crc, token, flags = _HEADER.unpack_from(data, position)
                    record_end = position + HEADER_BYTES + size
                    if magic != MAGIC:
                        problem = "bad magic"
                    elif record_end > len(data):
                        problem = "body cut short"
                    elif start + record_end > self.committed_offset:
                        body = data[position + HEADER_BYTES:record_end]
                        if _crc(token, flags, body) != crc:
                            problem = "checksum mismatch"
                        else:
                            self.unfinished.append(LogRecord(start + position, start + record_end, token, flags,
                                                             bytes(body)))
                if problem is not None:
                    dropped = len(data) - position
                    if last:
                        logger.warning("span log %s: cutting off a torn last record (%s, %d bytes); its export"
                                       " was never acknowledged", path.name, problem, dropped)
                    else:
                        logger.error("span log %s: %s at %d; %d bytes of this segment are unreadable",
                                     path.name, problem, position, dropped)
                    self.torn_bytes_dropped += dropped
                    os.truncate(path, position)
                    break
                self._remember(token)
                position = record_end
            end = start + position
            if not last and end != self._segments[index + 1]:
                # A damaged middle segment: continue at the next segment's own offset.
                end = self._segments[index + 1]
        return end

    # ------------------------------------------------------------------ use
    def knows(self, token: bytes) -> bool:
        """True when a record with ``token`` was appended (and is remembered)."""
        return token in self._tokens

    @property
    def backlog_bytes(self) -> int:
        """Bytes appended and not yet known inserted."""
        return self.end_offset - self.committed_offset

    def append(self, token: bytes, flags: int, body: bytes) -> tuple[int, int]:
        """Append one record; return its ``(start, end)`` global offsets once written to the
        page cache. Raises ``ValueError`` (see :func:`encode_record`) and ``OSError`` (disk
        full, …), in which case nothing is left of the record in the log."""
        record = encode_record(token, flags, body)
        with self._lock:
            if self._segment_size >= self.segment_bytes:
                self._rotate()
            start = self.end_offset
            view = memoryview(record)
            written = 0
            try:
                while written < len(record):
                    written += os.write(self._fd, view[written:])
            except OSError:
                if written:
                    os.ftruncate(self._fd, self._segment_size)
                raise
            self._segment_size += len(record)
            self.end_offset += len(record)
            self._remember(token)
            return start, self.end_offset

    def begin_insert(self, start: int, end: int, trace_id: str = "", span_id: str = "") -> None:
        """Record that the records ``[start, end)`` are about to be inserted, with one sample
        key of their rows. Raises ``OSError``."""
        sample = f" {trace_id} {span_id}" if trace_id and span_id else ""
        self._write_progress(f"B {start} {end}{sample}\n")

    def done_insert(self, end: int) -> None:
        """Record that every record before ``end`` is inserted; delete drained segments beyond
        the retention. Never raises (a lost line means the range is checked again at start-up)."""
        with self._lock:
            self.committed_offset = max(self.committed_offset, end)
            try:
                self._write_progress(f"D {end}\n")
            except OSError as exc:
                logger.warning("span log %s: could not write progress: %s", self.folder, exc)
            if self.unfinished_insert is not None and self.unfinished_insert.end <= self.committed_offset:
                self.unfinished_insert = None
            # Only here, between inserts: a rewrite must not drop the B line of one in flight.
            if self._progress_lines > _PROGRESS_MAX_LINES:
                self._rewrite_progress()
            self._delete_drained()

    def close(self) -> None:
        """Close the files; idempotent."""
        with self._lock:
            for name in ("_fd", "_progress_fd"):
                fd = getattr(self, name, -1)
                if fd >= 0:
                    os.close(fd)
                    setattr(self, name, -1)

    # ------------------------------------------------------------------ internals
    def _remember(self, token: bytes) -> None:
        self._tokens[token] = None
        if len(self._tokens) > self.max_tokens:
            self._tokens.popitem(last=False)

    def _rotate(self) -> None:
        os.close(self._fd)
        self._segments.append(self.end_offset)
        self._fd = os.open(self._segment_path(self.end_offset), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._segment_size = 0

    def _write_progress(self, line: str) -> None:
        os.write(self._progress_fd, line.encode("ascii"))
        self._progress_lines += 1

    def _rewrite_progress(self) -> None:
        """Replace the progress file by its state (atomic rename), keeping an unfinished line."""
        lines = f"D {self.committed_offset}\n"
        if self.unfinished_insert is not None:
            u = self.unfinished_insert
            lines += f"B {u.start} {u.end} {u.trace_id} {u.span_id}\n" if u.span_id else f"B {u.start} {u.end}\n"
        path = self.folder / _PROGRESS
        temporary = path.with_suffix(".tmp")
        try:
            temporary.write_text(lines, encoding="ascii")
            os.replace(temporary, path)
            os.close(self._progress_fd)
            self._progress_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._progress_lines = 0
        except OSError as exc:
            logger.warning("span log %s: could not rewrite progress: %s", self.folder, exc)

    def _delete_drained(self) -> None:
        # Segments wholly before the committed offset, newest first; keep up to the retention.
        kept = 0
        for index in range(len(self._segments) - 2, -1, -1):
            start, end = self._segments[index], self._segments[index + 1]
            if end > self.committed_offset:
                continue
            kept += end - start
            if kept > self.retain_drained_bytes:
                for old in self._segments[:index + 1]:
                    try:
                        self._segment_path(old).unlink()
                    except FileNotFoundError:
                        pass
                del self._segments[:index + 1]
                return
