"""An append-only write-ahead log of accepted OTLP trace export bodies, with drain progress.

The receiver answers 200 once an export's body is appended here; one inserter thread
(:mod:`inferpath.server.log_ingest`) drains the log into large inserts. This module is the
file format and its bookkeeping only — no decoding, no store.

Layout of the log folder::

    log_id                 random id of this log, part of every insert's dedup token
    00000000000000000000.log   segments, named by the global offset of their first byte
    00000000000067108864.log
    progress               "B start end trace_id span_id" before an insert, "D end" after,
                           "L end" while records before ``end`` are settled by lookup

Offsets are global byte positions over the concatenated segments, so a range of records
``[start, end)`` names the same rows forever (the insert's dedup token is built from it).

A record is a 45-byte header — magic ``b"IPL1"``, payload length (u32), CRC-32 of token,
flags and payload (u32), the export's 32-byte token digest, flags (u8: 1 = OTLP/JSON else
protobuf, 2 = gzip) — followed by the body exactly as received. At start-up every record
is read and checked (magic, length, CRC-32):

- damage that reaches the end of the newest segment with no valid record after it (the
  process died inside ``write``) is cut off: its export was never answered 200, so its
  client retries it;
- any other damaged record is left in place and skipped: the scan resynchronises on the
  next valid header (the magic followed by a length and CRC that check out), logs the
  segment, offset and bytes skipped at ERROR and counts them (``corrupt_records_total``,
  ``corrupt_bytes_total``); no region holding valid records after it is ever truncated,
  and offsets never move (a record's offset is its segment's name plus its position);
- progress past the end of the data (segments removed by hand) starts a new segment named
  by the progress offset, so new records never fall below the "inserted" mark;
- a missing progress file (with records present) is logged as a warning and sets
  :attr:`SpanLog.lookup_until` to the log's end (kept as an ``L`` line until drained past
  it): the drainer's owner settles each of those records by looking its spans up in the
  store instead of inserting every record again.

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


def _crc(token: bytes, flags: int, body: bytes | memoryview) -> int:
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


def _valid_record_end(data: bytes, position: int) -> int | None:
    """End of the record at ``position`` when its magic, length and CRC check out, else None."""
    if len(data) - position < HEADER_BYTES:
        return None
    magic, size, crc, token, flags = _HEADER.unpack_from(data, position)
    record_end = position + HEADER_BYTES + size
    if magic != MAGIC or record_end > len(data):
        return None
    if _crc(token, flags, memoryview(data)[position + HEADER_BYTES : record_end]) != crc:
        return None
    return record_end


def _next_valid_record(data: bytes, position: int) -> int | None:
    """Position of the first valid record at or after ``position`` (resynchronisation on the
    magic, confirmed by length and CRC), or None."""
    while (found := data.find(MAGIC, position)) >= 0:
        if _valid_record_end(data, found) is not None:
            return found
        position = found + 1
    return None


def _problem(data: bytes, position: int) -> str:
    """Why the record at ``position`` is not valid, for the log line."""
    if len(data) - position < HEADER_BYTES:
        return "header cut short"
    magic, size, _crc_value, _token, _flags = _HEADER.unpack_from(data, position)
    if magic != MAGIC:
        return "bad magic"
    if position + HEADER_BYTES + size > len(data):
        return "body cut short"
    return "checksum mismatch"


class SpanLog:
    """The log in ``folder`` (created if missing), opened for appending and draining.

    ``segment_bytes``: a segment is closed and a new one started once it holds at least this
    many bytes (≥ 1). ``retain_drained_bytes``: drained segments kept for their tokens
    (≥ 0). ``max_tokens``: tokens remembered for deduplication (≥ 1, oldest forgotten).
    After opening, :attr:`unfinished` lists the records past the committed offset (to be
    inserted again), :attr:`unfinished_insert` the insert that was running at a crash, if
    any, and :attr:`lookup_until` the offset before which unfinished records must be settled
    by a store lookup (0: none; set when the progress file was lost). ``torn_bytes_dropped``,
    ``corrupt_records_total`` and ``corrupt_bytes_total`` count what the scan cut or skipped
    (see the module docstring). Raises ``OSError`` when the folder or its files cannot be read or written,
    ``ValueError`` for bad limits. Thread-safe.
    """

    def __init__(
        self,
        folder: Path,
        *,
        segment_bytes: int = 64 * 1024 * 1024,
        retain_drained_bytes: int = 64 * 1024 * 1024,
        max_tokens: int = 100_000,
    ) -> None:
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
        self.corrupt_records_total = 0  # damaged regions skipped at open (each logged at ERROR)
        self.corrupt_bytes_total = 0
        # Records before this offset (and past the committed one) are settled one by one by
        # looking their spans up in the store: set when the progress file was lost.
        self.lookup_until = 0
        progress_found = (self.folder / _PROGRESS).exists()
        self.committed_offset, self.unfinished_insert, self.lookup_until = self._read_progress()
        self._segments: list[int] = sorted(
            int(p.stem) for p in self.folder.glob(f"*{_SEGMENT_SUFFIX}") if p.stem.isdigit()
        )
        self.unfinished: list[LogRecord] = []
        self.end_offset = self._scan()
        if not progress_found and self.unfinished:
            # Without progress every record looks un-inserted; inserting them all again would
            # store each drained span twice, so each is settled by a lookup (log_ingest.py).
            logger.warning(
                "span log %s: the progress file is missing; the %d records in the log will be"
                " settled by looking their spans up in the store",
                self.folder,
                len(self.unfinished),
            )
            self.lookup_until = self.end_offset
        new_segment = not self._segments or self._segment_path(self._segments[-1]).stat().st_size >= segment_bytes
        if self.committed_offset > self.end_offset:
            # Progress past the data (segments removed or cut by hand): offsets only ever grow,
            # so new records go into a new segment named by the progress offset; none of them
            # can then fall below the "already inserted" mark.
            logger.warning(
                "span log %s: progress %d is past the log's end %d; appending from %d in a new segment",
                self.folder,
                self.committed_offset,
                self.end_offset,
                self.committed_offset,
            )
            self.end_offset = self.committed_offset
            new_segment = True
        if self.unfinished_insert is not None and self.unfinished_insert.start < self.committed_offset:
            self.unfinished_insert = None  # a stale line: an insert never starts before the committed offset
        if new_segment and (not self._segments or self._segments[-1] != self.end_offset):
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

    def _read_progress(self) -> tuple[int, UnfinishedInsert | None, int]:
        """``(committed offset, unfinished insert or None, lookup_until)`` from the progress file."""
        committed, begun, lookup_until = 0, None, 0
        try:
            text = (self.folder / _PROGRESS).read_text(encoding="ascii", errors="replace")
        except FileNotFoundError:
            return 0, None, 0
        for line in text.splitlines():
            parts = line.split()
            try:
                if parts[0] == "L" and len(parts) == 2:
                    lookup_until = max(lookup_until, int(parts[1]))
                elif parts[0] == "D" and len(parts) == 2:
                    committed = max(committed, int(parts[1]))
                    begun = None if begun is not None and begun.end <= committed else begun
                elif parts[0] == "B" and len(parts) in (3, 5):
                    trace_id, span_id = (parts[3], parts[4]) if len(parts) == 5 else ("", "")
                    begun = UnfinishedInsert(int(parts[1]), int(parts[2]), trace_id, span_id)
            except (IndexError, ValueError):
                continue  # a torn last line: the state before it stands
        if begun is not None and begun.end <= committed:
            begun = None
        return committed, begun, lookup_until

    def _segment_path(self, start: int) -> Path:
        return self.folder / f"{start:020d}{_SEGMENT_SUFFIX}"

    def _scan(self) -> int:
        """Read every segment's records (tokens), load the records past the committed offset;
        skip damaged records in place, cut only a torn tail; return the log's end offset."""
        end = self._segments[0] if self._segments else self.committed_offset
        for index, start in enumerate(self._segments):
            path = self._segment_path(start)
            last = index == len(self._segments) - 1
            with open(path, "rb") as segment:
                data = segment.read()
            position = 0
            while position < len(data):
                record_end = _valid_record_end(data, position)
                if record_end is None:
                    following = _next_valid_record(data, position + 1)
                    if following is None and last:
                        # Damage that reaches the end of the newest segment: a write cut short by
                        # the crash (never answered 200). Nothing valid follows, so the cut loses
                        # no record.
                        dropped = len(data) - position
                        logger.warning(
                            "span log %s: cutting off a torn last record (%s, %d bytes at %d); its"
                            " export was never acknowledged",
                            path.name,
                            _problem(data, position),
                            dropped,
                            position,
                        )
                        self.torn_bytes_dropped += dropped
                        os.truncate(path, position)
                        break
                    # Damage in the middle: the bytes are left alone (no file region holding valid
                    # records after it is ever truncated) and skipped up to the next valid record.
                    skip_to = len(data) if following is None else following
                    self._note_corrupt(path, start, position, skip_to - position, _problem(data, position))
                    position = skip_to
                    continue
                magic, size, crc, token, flags = _HEADER.unpack_from(data, position)
                if start + record_end > self.committed_offset:
                    self.unfinished.append(
                        LogRecord(
                            start + position,
                            start + record_end,
                            token,
                            flags,
                            bytes(data[position + HEADER_BYTES : record_end]),
                        )
                    )
                self._remember(token)
                position = record_end
            end = start + position
            if not last and end != self._segments[index + 1]:
                # A segment shorter or longer than its successor's name says: offsets of the next
                # segment are its own (never renumbered), so continue there.
                end = self._segments[index + 1]
        return end

    def _note_corrupt(self, path: Path, segment_start: int, position: int, skipped: int, problem: str) -> None:
        inserted = segment_start + position + skipped <= self.committed_offset
        logger.error(
            "span log %s: damaged record (%s) at offset %d of the segment (global %d); skipped %d bytes"
            " to the next valid record%s",
            path.name,
            problem,
            position,
            segment_start + position,
            skipped,
            " (behind the drained mark: inserted, or lost and reported at an earlier start)"
            if inserted
            else "; an acknowledged export in them is lost",
        )
        self.corrupt_records_total += 1
        self.corrupt_bytes_total += skipped

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
        if self.lookup_until > self.committed_offset:  # kept until the looked-up range is drained
            lines += f"L {self.lookup_until}\n"
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
                for old in self._segments[: index + 1]:
                    try:
                        self._segment_path(old).unlink()
                    except FileNotFoundError:
                        pass
                del self._segments[: index + 1]
                return
