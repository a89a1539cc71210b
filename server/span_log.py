"""Span exports acknowledged once logged, inserted by one drainer thread in large blocks.

Embedded chDB pays ~20-30 ms per INSERT whatever its size, so rows per insert decide the
ingest rate (bench/README.md, server_ingest). A 200 therefore means "in the span log":

1. :meth:`LoggedSpanIngest.accept` (request thread, export already decoded): the body is
   appended to the :class:`SpanLog`, its spans queued in memory, 200 follows. A retry of a
   logged export (same dedup token) gets 200 without a record.
2. The drainer takes the queued exports in log order, up to ``insert_rows`` rows or what
   arrived within ``linger_seconds`` of the oldest, records the range it is about to insert
   with a sample span per day (partition), inserts the rows as ONE block into ``otel_traces`` with the dedup
   token of the range (:func:`range_token`, from the exports' own tokens), notes the spans
   for assembly (``on_committed``) and deletes the range from the log.
3. At start-up the records not drained are decoded and queued again. An insert begun and not
   marked done is settled by looking its sample spans up (an insert writes one part per
   partition, each all or nothing): all found, the range is done; else exactly that range is
   inserted again under the same token, which skips the parts already stored.

The log is one SQLite database (``spans.sqlite`` in the log folder; Python's ``sqlite3``):
SQLite makes each append and each progress step atomic, so a crash inside a write leaves
the state before it. Journal mode WAL with ``synchronous=NORMAL``: a committed append is
written to the WAL without ``fsync`` and is in the kernel's page cache, which survives
``kill -9`` of the server (the failure this log is for); the drainer checkpoints the WAL
into the database after each insert, with an ``fsync``, so a power loss can lose the last
appends but cannot corrupt the log (ClickHouse does not ``fsync`` its own inserts by
default either: ``fsync_after_insert = 0``). The log is held by one process (SQLite's
exclusive locking mode): a second server on the same folder gets "database is locked". The
WAL file (``spans.sqlite-wal``) is part of the log: never delete it. Each record keeps the
body as received with its media type and encoding, and the body's CRC-32, checked when the
body is read back after a restart: a damaged record is logged at ERROR, counted and drained
without rows (its token stays in its range's). A database SQLite cannot
read (corrupt, not a database) is moved aside with its WAL (``.corrupt-<unix time>``) and a
new log started, logged at ERROR and counted; any other error (a lock held by another
process, a read-only folder) is raised. The tokens of the newest ``max_tokens`` records are
kept after they are drained, so a client retrying an export whose 200 was lost is
recognised after its rows were inserted, a restart included. Where the disk is full,
exports get 503 and the drainer retries its progress each second (logged at most every
10 s): nothing acknowledged is dropped, and ingest resumes once there is room.

Bounds: the backlog (body bytes logged, not inserted) stays under ``max_backlog_bytes`` and
its spans under ``max_backlog_seconds`` of the drainer's measured rate (at least 2000 spans),
so span end → visible stays near a second under saturation. Exports being decoded hold room
too (:meth:`LoggedSpanIngest.reserve`), so one that cannot fit gets its 503 before decoding.
An export that would pass a bound waits up to ``backlog_wait_seconds``, then gets 503 with
``Retry-After``. While the store backs off after an error
(:class:`~inferpath.server.ingest.DurableIngest`) exports get 503 instead of being logged:
the log is not an outage buffer. An insert refused for its data is retried export by export;
an export refused alone is dropped, logged and counted (``refused_spans_total``).

Clocks: ``linger_seconds`` and waits use the monotonic clock.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
import time
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from inferpath.ratelimited_log import RateLimitedLog
from inferpath.server.ingest import CommitResult, DurableIngest, Reservation, TableRows
from inferpath.server.otlp import decode_trace_request
from inferpath.storage.rows import SPAN_COLUMNS, SpanRow

__all__ = ["LogRecord", "LoggedSpanIngest", "SpanLog", "range_token", "token_digest"]

logger = logging.getLogger(__name__)

LOG_FILE_NAME = "spans.sqlite"
SPANS_TABLE = "otel_traces"
_NS_PER_DAY = 86_400 * 10**9
# The span bound of the backlog never goes below this many spans.
_MIN_BACKLOG_SPANS = 2000
# SQLite's answers for a file that is not (or no longer) a readable database.
_UNREADABLE = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS exports (
    id INTEGER PRIMARY KEY AUTOINCREMENT, token BLOB NOT NULL, content_type TEXT NOT NULL,
    content_encoding TEXT NOT NULL, crc INTEGER NOT NULL, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (id INTEGER PRIMARY KEY, token BLOB NOT NULL);
"""


def token_digest(token: str) -> bytes:
    """The 32 bytes a log record keeps of an export's dedup token (sha256 of its text)."""
    return hashlib.sha256(token.encode()).digest()


def range_token(digests: Sequence[bytes]) -> str:
    """The insert dedup token of a drained range: ``wal-`` and the sha256 of its records'
    token digests in log order. Built from the exports themselves, not from record ids, so
    that it names the same rows even where ids were reused (a log restored without its WAL)."""
    return "wal-" + hashlib.sha256(b"".join(digests)).hexdigest()


@dataclass(frozen=True)
class LogRecord:
    """One accepted export not yet drained: its range ``[start, end)`` of record ids (one id
    per record), ``token`` (digest), and the ``body`` with the ``content_type`` and
    ``content_encoding`` it was received with (``None`` for none); ``body`` is ``None`` for a
    record that failed its CRC."""

    start: int
    end: int
    token: bytes
    content_type: str
    content_encoding: str | None
    body: bytes | None  # None: damaged (failed its CRC)


@dataclass(frozen=True)
class UnfinishedInsert:
    """An insert begun and not marked done: the range ``[start, end)`` and one sample
    ``(trace_id, span_id)`` of its rows per day they start on (the partitions of
    ``otel_traces``: an insert writes one part per partition, each all or nothing)."""

    start: int
    end: int
    samples: tuple[tuple[str, str], ...] = ()


def _unfinished_insert(text: str, committed: int) -> UnfinishedInsert | None:
    """The ``begun`` line (``start end [trace_id:span_id ...]``) past ``committed``, else None;
    a line that does not parse is logged and ignored (its range is inserted again)."""
    parts = text.split()
    try:
        samples = tuple((trace_id, span_id) for trace_id, span_id in (part.split(":") for part in parts[2:]))
        begun = UnfinishedInsert(int(parts[0]), int(parts[1]), samples)
    except (IndexError, ValueError, TypeError):
        if text:
            logger.warning("span log: ignoring an unreadable begun-insert line %r", text)
        return None
    return begun if begun.end > committed else None


class SpanLog:
    """The log in ``folder`` (created if missing), opened for appending and draining.

    Records are numbered 1, 2, …; record ``n`` spans the range ``[n, n + 1)``. After opening,
    :attr:`unfinished` holds the records not drained (to be inserted again) and
    :attr:`unfinished_insert` the insert that was running at a crash, if any. ``max_tokens``
    (≥ 1): tokens kept of drained records. Counters: ``corrupt_records_total`` (bodies
    failing their CRC at open: kept without their body, drained without rows), ``unreadable_logs_total`` (a database moved aside at
    open). Raises ``OSError`` or ``sqlite3.Error`` when the folder or the database cannot be
    used (locked by another process, read-only, …), ``ValueError`` for a bad limit.
    Thread-safe.
    """

    def __init__(self, folder: Path, *, max_tokens: int = 100_000) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.folder = Path(folder)
        self.max_tokens = max_tokens
        self.corrupt_records_total = 0
        self.unreadable_logs_total = 0
        self._lock = threading.Lock()
        self._tokens: OrderedDict[bytes, None] = OrderedDict()
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / LOG_FILE_NAME
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            rows = self._prepare()
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorcode", None) not in _UNREADABLE:
                self._db.close()
                raise
            # Moved while still open: closing the connection first would delete the WAL.
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            for suffix in ("", "-wal", "-shm"):  # together: the WAL holds the newest records
                if path.with_name(path.name + suffix).exists():
                    path.with_name(path.name + suffix).rename(aside.with_name(aside.name + suffix))
            self._db.close()
            logger.error(
                "span log %s is unreadable (%s); moved to %s and a new log started: acknowledged exports"
                " not yet inserted are in it, for what SQLite can still read (the sqlite3 shell's .dump)",
                path,
                exc,
                aside.name,
            )
            self.unreadable_logs_total += 1
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            rows = self._prepare()
        for (token,) in self._db.execute("SELECT token FROM tokens ORDER BY id"):
            self._remember(token)
        self.unfinished: list[LogRecord] = []
        self.backlog_bytes = 0  # body bytes logged, not yet drained
        for record_id, token, content_type, content_encoding, crc, body in rows:
            if zlib.crc32(body) != crc:
                logger.error(
                    "span log %s: record %d is damaged (checksum mismatch); skipped: an acknowledged export is lost",
                    path,
                    record_id,
                )
                self.corrupt_records_total += 1
                body = None  # kept as an entry without spans: its token stays part of its range's
            record = LogRecord(record_id, record_id + 1, token, content_type, content_encoding or None, body)
            self.unfinished.append(record)
            self.backlog_bytes += len(body or b"")
        self.end_offset = (
            self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'exports'").fetchone() or (0,)
        )[0] + 1
        # Every record before this one is drained.
        self.committed_offset = self.unfinished[0].start if self.unfinished else self.end_offset
        begun = self._db.execute("SELECT value FROM meta WHERE key = 'begun'").fetchone()
        self.unfinished_insert = _unfinished_insert(begun[0] if begun else "", self.committed_offset)

    def _prepare(self) -> list:
        """WAL mode, the schema, and the records not drained (rows of ``exports``)."""
        self._db.execute("PRAGMA locking_mode=EXCLUSIVE")  # one process per log: held from the first write
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # in WAL mode: fsync at checkpoints only
        self._db.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints by the drainer, not the request threads
        self._db.executescript(_SCHEMA)
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('opened', ?)", (str(time.time()),))
        query = "SELECT id, token, content_type, content_encoding, crc, body FROM exports ORDER BY id"
        return self._db.execute(query).fetchall()

    def knows(self, token: bytes) -> bool:
        """True when a record with ``token`` was appended (and is remembered)."""
        return token in self._tokens

    def append(self, token: bytes, content_type: str | None, content_encoding: str | None, body: bytes) -> int:
        """Append one record; return its id once written to the page cache. Raises
        ``sqlite3.Error`` (disk full, …), in which case nothing is logged."""
        with self._lock:
            with self._db:  # committed here (a full disk fails at the commit: nothing changes then)
                self._db.execute("BEGIN")
                cursor = self._db.execute(
                    "INSERT INTO exports (token, content_type, content_encoding, crc, body) VALUES (?, ?, ?, ?, ?)",
                    (token, content_type or "", content_encoding or "", zlib.crc32(body), body),
                )
                self._db.execute("INSERT INTO tokens (token) VALUES (?)", (token,))
            record_id = int(cursor.lastrowid or 0)
            self.end_offset = record_id + 1
            self.backlog_bytes += len(body)
            self._remember(token)
            return record_id

    def begin_insert(self, start: int, end: int, samples: Sequence[tuple[str, str]] = ()) -> None:
        """Record that the records ``[start, end)`` are about to be inserted, with sample
        ``(trace_id, span_id)`` keys of their rows (:class:`UnfinishedInsert`). Raises
        ``sqlite3.Error``."""
        line = " ".join([str(start), str(end), *(f"{trace_id}:{span_id}" for trace_id, span_id in samples)])
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('begun', ?)", (line,))

    def done_insert(self, end: int) -> None:
        """Record that every record before ``end`` is inserted: delete them, forget the tokens
        beyond ``max_tokens``. Raises ``sqlite3.Error`` (nothing recorded then)."""
        with self._lock:
            span = (self.committed_offset, end)
            query = "SELECT coalesce(sum(length(body)), 0) FROM exports WHERE id >= ? AND id < ?"
            drained = self._db.execute(query, span).fetchone()[0]
            with self._db:  # one transaction
                self._db.execute("BEGIN")
                self._db.execute("DELETE FROM exports WHERE id >= ? AND id < ?", span)
                self._db.execute("DELETE FROM tokens WHERE id <= (SELECT max(id) FROM tokens) - ?", (self.max_tokens,))
                self._db.execute("DELETE FROM meta WHERE key = 'begun'")
            self.backlog_bytes -= drained
            self.committed_offset = max(self.committed_offset, end)
            if self.unfinished_insert is not None and self.unfinished_insert.end <= self.committed_offset:
                self.unfinished_insert = None
            try:  # the WAL into the database (with its fsync); a failure is retried at the next one
                self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error as exc:
                logger.debug("span log checkpoint failed: %s", exc)

    def close(self) -> None:
        """Close the database; idempotent."""
        with self._lock:
            self._db.close()

    def _remember(self, token: bytes) -> None:
        self._tokens[token] = None
        if len(self._tokens) > self.max_tokens:
            self._tokens.popitem(last=False)


@dataclass
class _Queued:
    """One logged export waiting for the drainer: log range ``[start, end)``, token digest
    and its spans."""

    start: int
    end: int
    token: bytes
    spans: list[SpanRow]
    enqueued: float  # monotonic seconds


class LoggedSpanIngest:
    """Durable queue of span exports in front of ``otel_traces`` (see the module docstring);
    a :class:`~inferpath.server.ingest.SpanSink`.

    ``ingest``: the receiver's :class:`DurableIngest` (back-off state, insert, counters).
    ``log``: an open :class:`SpanLog`; its unfinished records are decoded and queued here.
    ``on_committed(spans)``: called by the drainer with the spans of each committed insert
    (the assembler's ``note_spans``). ``oldest_unix_ns()``: spans starting before it are
    rejected when a record is decoded again at start-up, as the receiver rejects them (the
    table's TTL). ``insert_rows`` (≥ 1): rows per insert at most (a
    larger export is inserted alone). ``linger_seconds`` (0..60): how long the oldest queued
    export may wait for company (larger blocks make larger parts, which chDB merges less).
    ``max_backlog_bytes``, ``max_backlog_seconds``, ``backlog_wait_seconds`` (0..60): the
    bounds of the module docstring. Raises ``ValueError`` for bad limits. The drainer runs
    after :meth:`start`. Counters: ``appended_total`` (exports logged),
    ``duplicate_exports_total``, ``backlog_full_total`` (503s), ``log_errors_total``
    (appends that failed, 503), ``inserts_total``, ``inserted_spans_total``,
    ``refused_spans_total``, ``recovered_spans_total`` (queued again at start-up).
    """

    def __init__(
        self,
        ingest: DurableIngest,
        log: SpanLog,
        *,
        on_committed: Callable[[list[SpanRow]], None] = lambda spans: None,
        oldest_unix_ns: Callable[[], int] = lambda: 0,
        insert_rows: int = 60_000,
        linger_seconds: float = 0.5,
        max_backlog_bytes: int = 16 * 1024 * 1024,
        max_backlog_seconds: float = 1.0,
        backlog_wait_seconds: float = 1.0,
    ) -> None:
        if insert_rows < 1:
            raise ValueError(f"insert_rows must be >= 1, got {insert_rows}")
        if not 0 <= linger_seconds <= 60:
            raise ValueError(f"linger_seconds must be in 0..60, got {linger_seconds}")
        if max_backlog_bytes < 1:
            raise ValueError(f"max_backlog_bytes must be >= 1, got {max_backlog_bytes}")
        if not 0 < max_backlog_seconds <= 3600:
            raise ValueError(f"max_backlog_seconds must be in (0, 3600], got {max_backlog_seconds}")
        if not 0 <= backlog_wait_seconds <= 60:
            raise ValueError(f"backlog_wait_seconds must be in 0..60, got {backlog_wait_seconds}")
        self.ingest = ingest
        self.log = log
        self.on_committed = on_committed
        self.oldest_unix_ns = oldest_unix_ns
        self.insert_rows = insert_rows
        self.linger_seconds = linger_seconds
        self.max_backlog_bytes = max_backlog_bytes
        self.backlog_wait_seconds = backlog_wait_seconds
        self.max_backlog_seconds = max_backlog_seconds
        # Spans per second of the drainer's recent inserts (batch taken → committed), EWMA;
        # 0 until the first insert.
        self.drain_spans_per_second = 0.0
        self._cond = threading.Condition()
        self._queue: deque[_Queued] = deque()
        self._queued_spans = 0
        self._stopping = False
        self._flush_waiters = 0
        self._room_waiters = 0
        self._reserved_bytes = 0  # bodies of exports read, being decoded: see reserve()
        self._thread: threading.Thread | None = None
        # Drain exactly this range first (an insert a crash left unfinished), then per export
        # up to ``_single_until`` (a group the store refused for its data).
        self._forced_end: int | None = None
        self._single_until = -1
        self.appended_total = 0
        self.duplicate_exports_total = 0
        self.backlog_full_total = 0
        self.log_errors_total = 0
        self.inserts_total = 0
        self.inserted_spans_total = 0
        self.refused_spans_total = 0
        self.recovered_spans_total = 0
        # A full disk fails every export and every drain: one line per 10 s of each.
        self._append_trouble = RateLimitedLog(logger, interval_seconds=10.0)
        self._drain_trouble = RateLimitedLog(logger, interval_seconds=10.0)
        self._recover()

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        """Queue the log's records not drained again; settle the insert a crash interrupted
        (see the module docstring)."""
        for record in self.log.unfinished:
            queued = self._decode(record)
            self._queue.append(queued)
            self._queued_spans += len(queued.spans)
            self.recovered_spans_total += len(queued.spans)
        self.log.unfinished = []  # decoded: drop the bodies
        unfinished = self.log.unfinished_insert
        if unfinished is not None:
            # Landed only where every partition's sample is stored; else the same range under
            # the same token (parts already stored are skipped by the token).
            if unfinished.samples and all(self._present(*sample) for sample in unfinished.samples):
                logger.info(
                    "span log: the insert of [%d, %d) interrupted by a crash had landed",
                    unfinished.start,
                    unfinished.end,
                )
                try:
                    self.log.done_insert(unfinished.end)
                    while self._queue and self._queue[0].end <= unfinished.end:
                        dropped = self._queue.popleft()
                        self._queued_spans -= len(dropped.spans)
                        self.recovered_spans_total -= len(dropped.spans)
                except sqlite3.Error as exc:  # redone under its token instead: dropped as stored
                    logger.warning("span log progress unwritable (%s); inserting the range again", exc)
                    self._forced_end = unfinished.end
            else:
                logger.info(
                    "span log: the insert of [%d, %d) interrupted by a crash had not landed; inserting"
                    " exactly that range again",
                    unfinished.start,
                    unfinished.end,
                )
                self._forced_end = unfinished.end
        if self._queue:
            logger.info(
                "span log: re-queued %d records (%d spans) not inserted before the last stop",
                len(self._queue),
                self._queued_spans,
            )

    def _decode(self, record: LogRecord) -> _Queued:
        """A log record decoded again, against the TTL as the receiver applies it, into a queue
        entry (no spans when damaged or when it cannot be decoded: logged at ERROR and counted
        with the damaged records)."""
        decoded = None
        try:
            if record.body is not None:
                decoded = decode_trace_request(
                    record.body,
                    content_type=record.content_type,
                    content_encoding=record.content_encoding,
                    oldest_unix_ns=self.oldest_unix_ns(),
                )
        except Exception as exc:  # noqa: BLE001 - accepted once, unreadable now: count, go on
            logger.error("span log record %d could not be decoded again (%s); skipped", record.start, exc)
            self.log.corrupt_records_total += 1
        spans = decoded.spans if decoded is not None else []
        return _Queued(record.start, record.end, record.token, spans, time.monotonic())

    def _present(self, trace_id: str, span_id: str) -> bool:
        try:
            rows = self.ingest.store.query(
                "SELECT count() FROM otel_traces WHERE TraceId = {t:String} AND SpanId = {s:String}",
                {"t": trace_id, "s": span_id},
            )
        except Exception as exc:  # noqa: BLE001 - unknown: insert again, the token dedups
            logger.warning("span log: could not look up a sample span (%s); inserting the range again", exc)
            return False
        return bool(rows and rows[0][0])

    # ------------------------------------------------------------------ receiver side
    @property
    def backlog_bytes(self) -> int:
        """Bytes logged and not yet inserted."""
        return self.log.backlog_bytes

    @property
    def backlog_spans(self) -> int:
        """Spans queued for the drainer."""
        return self._queued_spans

    def accept(
        self, spans: Sequence[SpanRow], token: str, body: bytes, content_type: str | None, content_encoding: str | None
    ) -> CommitResult:
        """Log one decoded export and queue its rows; ``committed`` once the record is written.

        ``spans``: the export's valid spans; ``token``: its dedup token
        (:func:`~inferpath.server.ingest.dedup_token`); ``body``, ``content_type``,
        ``content_encoding``: as received (the log keeps the body, decoded again only after
        a restart). Answers ``unavailable`` (503) while the store backs off or when the log
        cannot be written, ``overloaded`` (503) when the backlog would still pass
        ``max_backlog_bytes`` after ``backlog_wait_seconds``, ``invalid`` (400) for a media
        type the log cannot record (not expected: the body was decoded). Never raises.
        """
        digest = token_digest(token)
        if self.log.knows(digest):
            self.duplicate_exports_total += 1
            return CommitResult("committed", duplicate=True)
        refusal = self.ingest.refusal()
        if refusal is not None:
            return refusal
        if not spans:
            return CommitResult("committed")  # nothing to store
        spans = list(spans)
        with self._cond:
            if self.log.knows(digest):  # the same export, accepted meanwhile by another thread
                self.duplicate_exports_total += 1
                return CommitResult("committed", duplicate=True)
            # Flow control first: a client holds one export in flight, so making it wait a
            # moment for room slows it down without a Retry-After pause that idles the drainer.
            deadline = time.monotonic() + self.backlog_wait_seconds
            while (
                self._backlog_full(len(body), len(spans))
                and not self._stopping
                and (left := deadline - time.monotonic()) > 0
            ):
                self._room_waiters += 1  # the drainer stops lingering: the backlog is full
                self._cond.notify_all()
                try:
                    self._cond.wait(left)
                finally:
                    self._room_waiters -= 1
            if self.log.knows(digest):
                self.duplicate_exports_total += 1
                return CommitResult("committed", duplicate=True)
            if self._backlog_full(len(body), len(spans)):
                self.backlog_full_total += 1
                return CommitResult(
                    "overloaded",
                    f"ingest backlog full ({self.log.backlog_bytes} bytes,"
                    f" {self._queued_spans} spans not yet inserted; max_backlog_bytes="
                    f"{self.max_backlog_bytes}, max_backlog_seconds={self.max_backlog_seconds}"
                    f" at {self.drain_spans_per_second:.0f} spans/s); retry later",
                    max(1, round(self.ingest.retry_after_seconds)),
                )
            try:
                record_id = self.log.append(digest, content_type, content_encoding, body)
            except Exception as exc:  # noqa: BLE001 - disk full, …: the client retries
                self.log_errors_total += 1
                self._append_trouble.warning("span log append failed (answered 503): %s", exc)
                return CommitResult("unavailable", f"span log unwritable ({type(exc).__name__}); retry later", 1)
            self._queue.append(_Queued(record_id, record_id + 1, digest, spans, time.monotonic()))
            self._queued_spans += len(spans)
            self.appended_total += 1
            if len(self._queue) == 1 or self._queued_spans >= self.insert_rows:
                self._cond.notify_all()
        return CommitResult("committed")

    def reserve(self, body_bytes: int) -> Reservation | CommitResult:
        """Room in the backlog for one export of ``body_bytes`` whose body was read and is
        about to be decoded; release it (context manager) once the export is answered.

        Refused at once (``overloaded``, 503 with ``Retry-After``) when the backlog and the
        exports already reserved would pass ``max_backlog_bytes`` with it, so an export that
        cannot fit is not decoded first. An export gets room when nothing is logged or
        reserved, whatever its size. Counted in ``backlog_full_total``. Never raises."""
        with self._cond:
            backlog, reserved = self.log.backlog_bytes, self._reserved_bytes
            if (backlog or reserved) and backlog + reserved + body_bytes > self.max_backlog_bytes:
                self.backlog_full_total += 1
                return CommitResult(
                    "overloaded",
                    f"ingest backlog full ({backlog} bytes logged, {reserved} bytes"
                    f" being decoded, {body_bytes} more; max_backlog_bytes={self.max_backlog_bytes});"
                    " retry later",
                    max(1, round(self.ingest.retry_after_seconds)),
                )
            self._reserved_bytes += body_bytes
        return Reservation(self._unreserve, body_bytes)

    def _unreserve(self, body_bytes: int) -> None:
        with self._cond:
            self._reserved_bytes -= body_bytes

    @property
    def reserved_bytes(self) -> int:
        """Body bytes of the exports holding a :meth:`reserve` now."""
        return self._reserved_bytes

    def _backlog_full(self, body_bytes: int, spans: int) -> bool:
        """True when one more export would pass a bound; an empty backlog takes any export.
        The caller holds ``_cond``."""
        if not self.log.backlog_bytes:
            return False
        if self.log.backlog_bytes + body_bytes > self.max_backlog_bytes:
            return True
        rate = self.drain_spans_per_second
        # What the drainer gets through in max_backlog_seconds (a floor keeps inserts large
        # enough to be efficient when the measured rate is low).
        return bool(rate) and self._queued_spans + spans > max(_MIN_BACKLOG_SPANS, rate * self.max_backlog_seconds)

    # ------------------------------------------------------------------ drainer
    def start(self) -> None:
        """Start the drainer thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="inferpath-span-log", daemon=True)
            self._thread.start()

    def _take_batch(self) -> list[_Queued] | None:
        """Wait for the next batch (held in the queue until committed); None when stopping."""
        with self._cond:
            while True:
                if self._stopping:  # close() flushed first; an undrained rest stays in the log
                    return None
                if not self._queue:
                    self._cond.wait(0.5)
                    continue
                waited = time.monotonic() - self._queue[0].enqueued
                if (
                    self._queued_spans < self.insert_rows
                    and waited < self.linger_seconds
                    and not self._flush_waiters
                    and not self._room_waiters
                    and not self._stopping
                    and self._forced_end is None
                ):
                    self._cond.wait(self.linger_seconds - waited)
                    continue
                batch: list[_Queued] = []
                rows = 0
                for queued in self._queue:
                    if self._forced_end is not None:
                        if queued.end > self._forced_end:
                            break
                    elif batch and (rows + len(queued.spans) > self.insert_rows or queued.start < self._single_until):
                        break
                    batch.append(queued)
                    rows += len(queued.spans)
                return batch

    def _run(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            try:
                self._drain(batch)
            except Exception:  # noqa: BLE001 - the drainer must outlive any one batch
                logger.exception("span log drain failed; retrying")
                self._pause(1.0)

    def _pause(self, seconds: float) -> None:
        with self._cond:
            if not self._stopping:
                self._cond.wait(seconds)

    def _drain(self, batch: list[_Queued]) -> None:
        refusal = self.ingest.refusal()
        if refusal is not None:  # the store backs off: wait for the probe time
            self._pause(0.05)
            return
        taken = time.monotonic()
        start, end = batch[0].start, batch[-1].end
        rows = sum(len(queued.spans) for queued in batch)
        samples: dict[int, tuple[str, str]] = {}  # one per UTC day, the partitions of otel_traces
        for queued in batch:
            for span in queued.spans:
                samples.setdefault(span.start_ns // _NS_PER_DAY, (span.trace_id, span.span_id))
        result = CommitResult("committed")
        if rows:
            try:
                self.log.begin_insert(start, end, list(samples.values()))
            except sqlite3.Error as exc:
                self._drain_trouble.warning("span log progress unwritable (%s); retrying", exc)
                self._pause(1.0)
                return
            block = [span.to_insert_row(timestamp_ns=True) for queued in batch for span in queued.spans]
            result = self.ingest.commit(
                [TableRows(SPANS_TABLE, SPAN_COLUMNS, block, checked=True)],
                range_token([queued.token for queued in batch]),
                exports=len(batch),
            )
            del block
        if result.status == "unavailable":
            # Back-off opened; the next round waits for it and retries exactly this range under
            # the same token (a part of it may have landed before the error).
            self._forced_end = end
            return
        if result.status == "invalid":
            if len(batch) > 1:
                logger.warning(
                    "the store refused a block of %d exports for its data; inserting them one by one", len(batch)
                )
                self._single_until = end
                self._forced_end = None
                return
            logger.error("the store refused a logged export's %d spans (dropped): %s", rows, result.message)
            self.refused_spans_total += rows
        spans = [span for queued in batch for span in queued.spans]
        if result.ok and spans:
            try:  # before D: a flush that sees the range done finds its traces noted
                self.on_committed(spans)
            except Exception:  # noqa: BLE001 - on_committed must not raise; the drainer goes on
                logger.exception("handing committed spans to the assembler failed")
        while True:  # the rows are in: a range inserted again would be stored twice
            try:
                self.log.done_insert(end)
                break
            except sqlite3.Error as exc:
                self._drain_trouble.warning("span log progress unwritable (%s); retrying", exc)
                if self._stopping:
                    return  # the begun line settles the range at the next start
                self._pause(1.0)
        with self._cond:
            for _ in batch:
                self._queue.popleft()
            self._queued_spans -= len(spans)
            if self._forced_end is not None and end >= self._forced_end:
                self._forced_end = None
            self._cond.notify_all()
        if result.ok and spans:
            sample_rate = len(spans) / max(time.monotonic() - taken, 1e-3)
            self.drain_spans_per_second = (
                sample_rate
                if not self.drain_spans_per_second
                else 0.7 * self.drain_spans_per_second + 0.3 * sample_rate
            )
            self.inserts_total += 1
            self.inserted_spans_total += len(spans)

    # ------------------------------------------------------------------ flush / close
    def flush(self, timeout_seconds: float = 30.0) -> bool:
        """Wait until everything logged before the call is inserted (or dropped as refused)
        and its spans were handed to ``on_committed``; False on timeout (e.g. the store is
        down: the backlog stays in the log)."""
        target = self.log.end_offset
        deadline = time.monotonic() + timeout_seconds
        with self._cond:
            self._flush_waiters += 1
            self._cond.notify_all()
            try:
                while self.log.committed_offset < target:
                    left = deadline - time.monotonic()
                    if left <= 0 or (self._thread is None or not self._thread.is_alive()):
                        return False
                    self._cond.wait(min(left, 0.1))
                return True
            finally:
                self._flush_waiters -= 1

    def close(self, timeout_seconds: float = 30.0) -> None:
        """Drain what can be drained within ``timeout_seconds``, stop the thread, close the
        log (an undrained rest stays in it for the next start). Idempotent."""
        if self._thread is not None and self._thread.is_alive():
            self.flush(timeout_seconds)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_seconds)
        self.log.close()
