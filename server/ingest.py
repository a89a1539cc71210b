"""Durable acknowledgement of OTLP exports: commit to the store before answering 200.

An export is answered 200 only after its rows are committed to ClickHouse (the insert
returned), so a crash after a 200 loses nothing. Each export's rows go into ONE insert per
table carrying an ``insert_deduplication_token`` derived from the body: a client that
retries an export whose insert committed but whose answer was lost (the server was killed
in between) stores nothing twice, because ClickHouse skips a block whose token it has seen
(``non_replicated_deduplication_window``, ``schema/005_insert_dedup.sql``; replicated tables
do it by default). Readers and the assembler also dedup by span id, which covers the one
case the token cannot: the same span sent again inside a *different* body.

Memory stays bounded without a queue: at most ``max_inflight_requests`` exports and
``max_inflight_bytes`` of bodies are being decoded or committed at once; beyond that the
receiver answers 503 with ``Retry-After`` at once. When an insert fails for a reason of
the store (connection refused, table missing, too many parts, …) the store is marked
unavailable for a back-off that doubles up to ``max_retry_after_seconds``; meanwhile
exports are refused with 503 without touching the store, and the first export after the
back-off probes it again, so the receiver recovers by itself. An insert refused because of
the data (a value ClickHouse cannot take) is a 400 naming the problem: retrying could not
help, and it must not make the store look unavailable to everyone else.

Group commit: embedded chDB pays ~20-30 ms per INSERT whatever its size (a part per table,
its skip indexes, the trace-id materialized view), so one insert per 1000-span export caps
ingest near 35k spans/s. Exports into ``group_tables`` (``otel_traces``) that arrive while
an insert runs are therefore committed together as ONE insert by whichever of their threads
leads next; each caller still returns only after its own rows are committed. Exactly-once
for retries then rests on :class:`~inferpath.server.commit_journal.CommitJournal` (a retry
of a committed export is answered 200 without an insert) instead of the group's ClickHouse
token. Groups need a folder for that journal, so they are formed on embedded chDB only (the
journal lives in its data folder); against a ClickHouse server every export is its own insert.
When a group's insert is refused for its data, its exports are retried one by one, so only
the bad export is answered 400.

Clocks: back-off and insert latency use the monotonic clock (``time.monotonic``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import re
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

from inferpath.server.commit_journal import CommitJournal, JournalMember
from inferpath.storage.store import Store

__all__ = ["CommitResult", "DurableIngest", "NativeRows", "Reservation", "TableRows", "dedup_token",
           "INSERT_SECONDS_BUCKETS"]

logger = logging.getLogger(__name__)

# Upper bounds (seconds) of the insert-latency histogram on /metrics.
INSERT_SECONDS_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Journal file in the chDB data folder (see CommitJournal).
JOURNAL_FILE_NAME = "inferpath_commit_journal.jsonl"
# ClickHouse error codes that mean "this data cannot be stored", not "the store is down":
# CANNOT_PARSE_TEXT, CANNOT_PARSE_NUMBER, CANNOT_PARSE_DATE, TYPE_MISMATCH, ARGUMENT_OUT_OF_BOUND,
# CANNOT_CONVERT_TYPE, CANNOT_PARSE_DATETIME, VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE, DECIMAL_OVERFLOW.
_DATA_ERROR_CODES = frozenset({6, 27, 38, 41, 53, 69, 70, 72, 321, 407})
_CODE = re.compile(r"Code:\s*(\d+)")


@dataclass(frozen=True)
class TableRows:
    """Rows for one table: ``table``, ``columns`` (insert column order), ``rows`` (tuples);
    ``checked``: built from checked values (see ``Store.insert``), no naive-datetime scan."""

    table: str
    columns: Sequence[str]
    rows: Sequence[tuple]
    checked: bool = False


@dataclass(frozen=True)
class NativeRows:
    """Rows for one table serialized already: ``data`` holds ``row_count`` rows as ClickHouse
    Native blocks for ``columns`` (:class:`~inferpath.storage.native.NativeBlockWriter`)."""

    table: str
    columns: Sequence[str]
    data: bytes
    row_count: int


@dataclass(frozen=True)
class CommitResult:
    """What became of one export.

    ``status``: ``committed`` (HTTP 200), ``overloaded`` or ``unavailable`` (503 with
    ``Retry-After: retry_after_seconds``), ``invalid`` (400). ``message`` says why.
    ``duplicate``: committed earlier (a client's retry), answered without a second insert.
    """

    status: Literal["committed", "overloaded", "unavailable", "invalid"]
    message: str = ""
    retry_after_seconds: int = 0
    duplicate: bool = False

    @property
    def ok(self) -> bool:
        """True when the rows are committed."""
        return self.status == "committed"


def dedup_token(signal: str, content_type: str | None, content_encoding: str | None, body: bytes) -> str:
    """A stable token for one export body: sha256 over signal, media type, encoding and bytes.

    OTLP exporters retry with the very same body, so a retry gets the same token.
    """
    digest = hashlib.sha256()
    for part in (signal, (content_type or "").lower(), (content_encoding or "").lower()):
        digest.update(part.encode())
        digest.update(b"\0")
    digest.update(body)
    return f"otlp-{signal}-{digest.hexdigest()}"


def _is_data_error(exc: BaseException) -> bool:
    # Errors raised while serializing rows on our side are about the data, never the store.
    if isinstance(exc, (ValueError, TypeError, OverflowError, struct.error, UnicodeError)):
        return True
    match = _CODE.search(str(exc))
    return bool(match) and int(match.group(1)) in _DATA_ERROR_CODES


class _Pending:
    """One export waiting to be committed in a group."""

    __slots__ = ("inserts", "token", "rows", "result")

    def __init__(self, inserts: Sequence[TableRows], token: str | None) -> None:
        self.inserts = inserts
        self.token = token
        self.rows = sum(len(part.rows) for part in inserts)
        self.result: CommitResult | None = None

    def journal_member(self) -> JournalMember:
        # One sample key per export: a group is one block, so one row tells whether it landed.
        for part in self.inserts:
            columns = list(part.columns)
            if part.rows and "TraceId" in columns and "SpanId" in columns:
                row = part.rows[0]
                return (self.token or "", str(row[columns.index("TraceId")]), str(row[columns.index("SpanId")]))
        return (self.token or "", "", "")


class Reservation:
    """Room held for one export (bytes in flight, backlog room); ``release`` gives it back,
    once, also as a context manager's exit."""

    def __init__(self, release: Callable[[int], None], body_bytes: int) -> None:
        self._release = release
        self._body_bytes = body_bytes
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._release(self._body_bytes)

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class DurableIngest:
    """Admission control and committed inserts for the OTLP receiver.

    ``store``: the open :class:`Store`. ``max_inflight_requests`` (≥ 1) and
    ``max_inflight_bytes`` (body bytes, ≥ 1) bound what is held in memory.
    ``retry_after_seconds`` / ``max_retry_after_seconds``: first and longest back-off after
    a store error. ``group_tables``: tables whose exports may share an insert (module
    docstring); ``max_group_rows`` (≥ 1) caps a group's rows; ``group_commit=False`` commits
    every export alone. Grouping needs the commit journal (``journal``), opened in the chDB
    data folder; without one (a ClickHouse server, an unwritable folder) it is off.
    Raises ``ValueError`` at construction for bad limits.

    Counters (plain ints): ``commits_total`` (exports), ``rows_committed_total``,
    ``groups_total`` / ``grouped_exports_total`` (grouped inserts and the exports in them),
    ``duplicate_exports_total`` (retries of committed exports answered without an insert),
    ``store_errors_total`` (failed inserts blamed on the store), ``data_errors_total``,
    ``overloaded_total`` / ``unavailable_total`` (exports refused with 503),
    ``insert_seconds_count`` / ``insert_seconds_sum`` / ``insert_seconds_buckets``
    (cumulative counts per :data:`INSERT_SECONDS_BUCKETS` bound); gauges
    ``inflight_requests``, ``inflight_bytes`` and their peaks ``peak_inflight_*``.
    """

    def __init__(self, store: Store, *, max_inflight_requests: int = 64,
                 max_inflight_bytes: int = 256 * 1024 * 1024, retry_after_seconds: float = 1.0,
                 max_retry_after_seconds: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 group_tables: Sequence[str] = ("otel_traces",), max_group_rows: int = 50_000,
                 group_commit: bool = True) -> None:
        if max_inflight_requests < 1:
            raise ValueError(f"max_inflight_requests must be >= 1, got {max_inflight_requests}")
        if max_inflight_bytes < 1:
            raise ValueError(f"max_inflight_bytes must be >= 1, got {max_inflight_bytes}")
        if max_group_rows < 1:
            raise ValueError(f"max_group_rows must be >= 1, got {max_group_rows}")
        if not 0 < retry_after_seconds <= max_retry_after_seconds:
            raise ValueError("retry_after_seconds must be > 0 and <= max_retry_after_seconds, "
                             f"got {retry_after_seconds} and {max_retry_after_seconds}")
        self.store = store
        self.max_inflight_requests = max_inflight_requests
        self.max_inflight_bytes = max_inflight_bytes
        self.retry_after_seconds = float(retry_after_seconds)
        self.max_retry_after_seconds = float(max_retry_after_seconds)
        self._clock = clock
        self._lock = threading.Lock()
        self._unavailable_until = float("-inf")
        self._consecutive_failures = 0
        self.last_store_error = ""
        self.inflight_requests = 0
        self.inflight_bytes = 0
        self.peak_inflight_requests = 0
        self.peak_inflight_bytes = 0
        self.commits_total = 0
        self.rows_committed_total = 0
        self.store_errors_total = 0
        self.data_errors_total = 0
        self.overloaded_total = 0
        self.unavailable_total = 0
        self.insert_seconds_count = 0
        self.insert_seconds_sum = 0.0
        self.insert_seconds_buckets = [0] * len(INSERT_SECONDS_BUCKETS)
        self.group_tables = frozenset(group_tables)
        self.max_group_rows = max_group_rows
        self.groups_total = 0  # grouped inserts made
        self.grouped_exports_total = 0  # exports committed through them
        self.duplicate_exports_total = 0  # retries of committed exports, answered without insert
        self._group_cond = threading.Condition()
        self._pending: list[_Pending] = []
        self._leader_busy = False
        self.journal: CommitJournal | None = None
        if group_commit and store.url.kind == "chdb" and store.url.path is not None:
            try:
                self.journal = CommitJournal(store.url.path / JOURNAL_FILE_NAME)
            except OSError as exc:  # e.g. a read-only folder: slower, never down
                logger.warning("commit journal unavailable (%s); committing exports one by one", exc)
            else:
                self.journal.recover(self._present_span_keys)

    def _present_span_keys(self, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        rows = self.store.query(
            "SELECT TraceId, SpanId FROM otel_traces WHERE SpanId IN {span_ids:Array(String)}",
            {"span_ids": sorted({span_id for _, span_id in keys})})
        return {(trace_id, span_id) for trace_id, span_id in rows}

    def close(self) -> None:
        """Close the commit journal (the store is the caller's); idempotent."""
        if self.journal is not None:
            self.journal.close()

    # ------------------------------------------------------------------ admission
    @property
    def store_available(self) -> bool:
        """False while the back-off after a store error runs."""
        return self._clock() >= self._unavailable_until

    def _unavailable(self, now: float) -> CommitResult:
        self.unavailable_total += 1
        wait = max(1, math.ceil(self._unavailable_until - now))
        return CommitResult("unavailable", f"store unavailable ({self.last_store_error}); retry later",
                            wait)

    def admit(self, body_bytes: int) -> Reservation | CommitResult:
        """Reserve room for one export of ``body_bytes``; a :class:`CommitResult` (503) when
        the store is backing off or the in-flight limits are reached. Release the returned
        admission (context manager) when the export is answered. Never raises."""
        with self._lock:
            now = self._clock()
            if now < self._unavailable_until:
                return self._unavailable(now)
            if (self.inflight_requests + 1 > self.max_inflight_requests
                    or (self.inflight_requests and self.inflight_bytes + body_bytes > self.max_inflight_bytes)):
                self.overloaded_total += 1
                return CommitResult("overloaded",
                                    f"receiver busy ({self.inflight_requests} exports, "
                                    f"{self.inflight_bytes} bytes in flight); retry later",
                                    max(1, math.ceil(self.retry_after_seconds)))
            self.inflight_requests += 1
            self.inflight_bytes += body_bytes
            self.peak_inflight_requests = max(self.peak_inflight_requests, self.inflight_requests)
            self.peak_inflight_bytes = max(self.peak_inflight_bytes, self.inflight_bytes)
        return Reservation(self._release, body_bytes)

    def refusal(self) -> CommitResult | None:
        """The 503 answer while the store backs off after an error (``unavailable``, with the
        seconds left as ``retry_after_seconds``); ``None`` when inserts may be tried."""
        with self._lock:
            now = self._clock()
            if now < self._unavailable_until:
                return self._unavailable(now)
        return None

    def insert_block(self, inserts: Sequence[TableRows | NativeRows], token: str | None,
                     exports: int = 1) -> CommitResult:
        """Insert each table's rows as ONE block with dedup token ``{token}:{table}``, counted
        as ``exports`` committed exports; never raises. The insert of the span log's drainer
        (:mod:`inferpath.server.log_ingest`): the same back-off, error classification and
        counters as a receiver's own commit, without grouping or the commit journal."""
        return self._commit_alone(inserts, token, exports)

    def _release(self, body_bytes: int) -> None:
        with self._lock:
            self.inflight_requests -= 1
            self.inflight_bytes -= body_bytes

    # ------------------------------------------------------------------ commit
    def commit(self, inserts: Sequence[TableRows], token: str | None) -> CommitResult:
        """Commit one export's rows; return the result once they are in the store. Never raises.

        Exports whose rows all go to ``group_tables`` are committed in a group with the
        exports that arrive meanwhile (module docstring); a retry of an export known
        committed returns ``committed`` at once. Other exports insert each table's rows as
        one block (token ``{token}:{table}``): all tables are tried in order, the first
        failure stops and decides the answer (the client's retry re-sends everything, and
        the tables already committed skip it by token).
        """
        if self.journal is None or not all(part.table in self.group_tables for part in inserts):
            return self._commit_alone(inserts, token)
        if token is not None and self.journal.is_committed(token):
            with self._lock:
                self.duplicate_exports_total += 1
            return CommitResult("committed", duplicate=True)
        with self._lock:
            now = self._clock()
            if now < self._unavailable_until:
                return self._unavailable(now)
        me = _Pending(inserts, token)
        with self._group_cond:
            self._pending.append(me)
            while me.result is None and self._leader_busy:
                self._group_cond.wait()
            if me.result is not None:
                return me.result
            # This thread leads one group: the exports pending now, itself first.
            self._leader_busy = True
            group = self._take_group(me)
        try:
            self._commit_group(group)
        except Exception as exc:  # noqa: BLE001 - every waiter must get an answer
            logger.exception("grouped commit failed unexpectedly")
            for member in group:
                if member.result is None:
                    member.result = CommitResult("unavailable", f"commit failed: {exc}", 1)
        finally:
            with self._group_cond:
                self._leader_busy = False  # the next thread to wake leads the next group
                self._group_cond.notify_all()
        assert me.result is not None
        return me.result

    def _take_group(self, leader: "_Pending") -> list["_Pending"]:
        """Pop the leader and as many pending exports as fit ``max_group_rows``; the caller
        holds ``_group_cond``."""
        self._pending.remove(leader)
        group, rows = [leader], leader.rows
        while self._pending and rows + self._pending[0].rows <= self.max_group_rows:
            member = self._pending.pop(0)
            group.append(member)
            rows += member.rows
        return group

    def _commit_group(self, group: list["_Pending"]) -> None:
        """Insert ``group`` as one insert per table and set every member's result."""
        assert self.journal is not None
        if self._clock() < self._unavailable_until:
            with self._lock:
                result = self._unavailable(self._clock())
            for member in group:
                member.result = result
            return
        # A retry that arrived while its first attempt was still queued or inserting: the
        # first attempt decides for both, its rows are inserted once.
        first_of: dict[str, _Pending] = {}
        duplicates: list[tuple[_Pending, _Pending | None]] = []
        unique: list[_Pending] = []
        for member in group:
            if member.token is not None and self.journal.is_committed(member.token):
                duplicates.append((member, None))
            elif member.token is not None and member.token in first_of:
                duplicates.append((member, first_of[member.token]))
            else:
                if member.token is not None:
                    first_of[member.token] = member
                unique.append(member)
        if duplicates:
            with self._lock:
                self.duplicate_exports_total += len(duplicates)
        try:
            if unique:
                self._insert_group(unique)
        finally:
            for member, first in duplicates:
                if first is None:
                    member.result = CommitResult("committed", duplicate=True)
                elif first.result is not None:  # the same answer, marked as a retry's when committed
                    member.result = dataclasses.replace(first.result, duplicate=first.result.ok)

    def _insert_group(self, group: list["_Pending"]) -> None:
        """Insert exports with distinct tokens as one insert per table; set their results."""
        assert self.journal is not None
        members = [member.journal_member() for member in group]
        try:
            group_id = self.journal.begin(members)
        except OSError as exc:
            logger.warning("commit journal unwritable (%s); committing exports one by one", exc)
            for member in group:
                member.result = self._commit_alone(member.inserts, member.token)
            return
        if len(group) == 1:
            inserts, token = group[0].inserts, group[0].token
        else:
            token = "group-" + hashlib.sha256("\0".join(m.token or "" for m in group).encode()).hexdigest()
            tables: dict[str, TableRows] = {}
            for member in group:
                for part in member.inserts:
                    previous = tables.get(part.table)
                    if previous is None:
                        tables[part.table] = TableRows(part.table, part.columns, list(part.rows), part.checked)
                    elif tuple(previous.columns) == tuple(part.columns) and previous.checked == part.checked:
                        previous.rows.extend(part.rows)  # type: ignore[attr-defined]
                    else:  # another column list, or checked against unchecked rows: its own insert
                        tables[f"{part.table}#{id(part)}"] = part
            inserts = list(tables.values())
        result = self._commit_alone(inserts, token, exports=len(group))
        if result.ok:
            self.journal.done(group_id, members)
            with self._lock:
                self.groups_total += 1
                self.grouped_exports_total += len(group)
            for member in group:
                member.result = result
        elif result.status == "invalid" and len(group) > 1:
            # One export's data spoils the group's insert: find it by committing one by one.
            for member in group:
                member.result = self._commit_alone(member.inserts, member.token)
                if member.result.ok:
                    self.journal.done(self.journal.begin([member.journal_member()]), [member.journal_member()])
        else:
            for member in group:
                member.result = result

    def _commit_alone(self, inserts: Sequence[TableRows | NativeRows], token: str | None,
                      exports: int = 1) -> CommitResult:
        """Insert each table's rows as one block with token ``{token}:{table}``."""
        committed_rows = 0
        for part in inserts:
            count = part.row_count if isinstance(part, NativeRows) else len(part.rows)
            if not count:
                continue
            with self._lock:
                now = self._clock()
                if now < self._unavailable_until:
                    return self._unavailable(now)
            started = time.monotonic()
            part_token = None if token is None else f"{token}:{part.table}"
            try:
                if isinstance(part, NativeRows):
                    self.store.insert_native(part.table, part.columns, part.data, dedup_token=part_token)
                else:
                    self.store.insert(part.table, part.rows, part.columns, dedup_token=part_token,
                                      checked=part.checked)
            except Exception as exc:  # noqa: BLE001 - answered as 400/503, never raised
                return self._failed(part.table, exc)
            self._observe(time.monotonic() - started)
            committed_rows += count
        with self._lock:
            self._consecutive_failures = 0
            self.commits_total += exports
            self.rows_committed_total += committed_rows
        return CommitResult("committed")

    def _observe(self, seconds: float) -> None:
        with self._lock:
            self.insert_seconds_count += 1
            self.insert_seconds_sum += seconds
            for index, bound in enumerate(INSERT_SECONDS_BUCKETS):
                if seconds <= bound:
                    self.insert_seconds_buckets[index] += 1

    def _failed(self, table: str, exc: Exception) -> CommitResult:
        text = " ".join(str(exc).split())[:300]
        if _is_data_error(exc):
            with self._lock:
                self.data_errors_total += 1
            return CommitResult("invalid", f"{table}: the store refused the rows: {type(exc).__name__}: {text}")
        with self._lock:
            self.store_errors_total += 1
            now = self._clock()
            if now < self._unavailable_until:
                # Inserts that were already running when the back-off opened: one outage
                # must not double the back-off once per export in flight.
                return self._unavailable(now)
            self._consecutive_failures += 1
            backoff = min(self.retry_after_seconds * 2 ** (self._consecutive_failures - 1),
                          self.max_retry_after_seconds)
            now = self._clock()
            self._unavailable_until = now + backoff
            self.last_store_error = f"{type(exc).__name__}: {text[:120]}"
            if self._consecutive_failures == 1:
                logger.warning("insert into %s failed; answering 503 for %.1f s: %s", table, backoff, text)
            return self._unavailable(now)
