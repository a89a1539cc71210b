"""Durable acknowledgement of OTLP exports: commit to the store before answering 200.

Each export's rows go into ONE insert per table carrying an ``insert_deduplication_token``
derived from the body, so a client retrying an export whose 200 was lost stores nothing
twice (``schema/005_insert_dedup.sql``). At most ``max_inflight_requests`` exports and
``max_inflight_bytes`` of bodies are in flight; beyond, 503 with ``Retry-After`` at once. An
insert failing for the store's reason opens a back-off (doubling up to
``max_retry_after_seconds``) during which exports get 503 without touching the store; the
first export after it probes. An insert refused for its data is a 400 and does not trip the
back-off. Span exports go through a :class:`SpanSink`: :class:`DirectSpanSink` commits each
export like this; :class:`~inferpath.server.span_log.LoggedSpanIngest` (embedded chDB)
acknowledges once the body is logged and inserts many exports as one block.

Clocks: back-off and insert latency use the monotonic clock (``time.monotonic``).
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from inferpath.storage.rows import SPAN_COLUMNS, SpanRow
from inferpath.storage.store import Store

__all__ = [
    "CommitResult",
    "DirectSpanSink",
    "DurableIngest",
    "Reservation",
    "SpanSink",
    "TableRows",
    "dedup_token",
    "INSERT_SECONDS_BUCKETS",
]

logger = logging.getLogger(__name__)

# Upper bounds (seconds) of the insert-latency histogram on /metrics.
INSERT_SECONDS_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
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
    return match is not None and int(match.group(1)) in _DATA_ERROR_CODES


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

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class DurableIngest:
    """Admission control and committed inserts for the OTLP receiver.

    ``store``: the open :class:`Store`. ``max_inflight_requests`` (≥ 1) and
    ``max_inflight_bytes`` (body bytes, ≥ 1) bound what is held in memory.
    ``retry_after_seconds`` / ``max_retry_after_seconds``: first and longest back-off after
    a store error. Raises ``ValueError`` at construction for bad limits.

    Counters (plain ints): ``commits_total`` (exports), ``rows_committed_total``,
    ``store_errors_total`` (failed inserts blamed on the store), ``data_errors_total``,
    ``overloaded_total`` / ``unavailable_total`` (exports refused with 503),
    ``insert_seconds_count`` / ``insert_seconds_sum`` / ``insert_seconds_buckets``
    (cumulative counts per :data:`INSERT_SECONDS_BUCKETS` bound); gauges
    ``inflight_requests``, ``inflight_bytes`` and their peaks ``peak_inflight_*``.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_inflight_requests: int = 64,
        max_inflight_bytes: int = 256 * 1024 * 1024,
        retry_after_seconds: float = 1.0,
        max_retry_after_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_inflight_requests < 1:
            raise ValueError(f"max_inflight_requests must be >= 1, got {max_inflight_requests}")
        if max_inflight_bytes < 1:
            raise ValueError(f"max_inflight_bytes must be >= 1, got {max_inflight_bytes}")
        if not 0 < retry_after_seconds <= max_retry_after_seconds:
            raise ValueError(
                "retry_after_seconds must be > 0 and <= max_retry_after_seconds, "
                f"got {retry_after_seconds} and {max_retry_after_seconds}"
            )
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

    # ------------------------------------------------------------------ admission
    @property
    def store_available(self) -> bool:
        """False while the back-off after a store error runs."""
        return self._clock() >= self._unavailable_until

    def _unavailable(self, now: float) -> CommitResult:
        self.unavailable_total += 1
        wait = max(1, math.ceil(self._unavailable_until - now))
        return CommitResult("unavailable", f"store unavailable ({self.last_store_error}); retry later", wait)

    def admit(self, body_bytes: int) -> Reservation | CommitResult:
        """Reserve room for one export of ``body_bytes``; a :class:`CommitResult` (503) when
        the store is backing off or the in-flight limits are reached. Release the returned
        admission (context manager) when the export is answered. Never raises."""
        with self._lock:
            now = self._clock()
            if now < self._unavailable_until:
                return self._unavailable(now)
            if self.inflight_requests + 1 > self.max_inflight_requests or (
                self.inflight_requests and self.inflight_bytes + body_bytes > self.max_inflight_bytes
            ):
                self.overloaded_total += 1
                return CommitResult(
                    "overloaded",
                    f"receiver busy ({self.inflight_requests} exports, "
                    f"{self.inflight_bytes} bytes in flight); retry later",
                    max(1, math.ceil(self.retry_after_seconds)),
                )
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

    def _release(self, body_bytes: int) -> None:
        with self._lock:
            self.inflight_requests -= 1
            self.inflight_bytes -= body_bytes

    # ------------------------------------------------------------------ commit
    def commit(self, inserts: Sequence[TableRows], token: str | None, exports: int = 1) -> CommitResult:
        """Insert each table's rows as ONE block with dedup token ``{token}:{table}``; return
        the result once they are in the store, counted as ``exports`` committed exports.
        Never raises.

        All tables are tried in order; the first failure stops and decides the answer (the
        client's retry re-sends everything, and the tables already committed skip it by token).
        """
        committed_rows = 0
        for part in inserts:
            if not part.rows:
                continue
            with self._lock:
                now = self._clock()
                if now < self._unavailable_until:
                    return self._unavailable(now)
            started = time.monotonic()
            part_token = None if token is None else f"{token}:{part.table}"
            try:
                self.store.insert(part.table, part.rows, part.columns, dedup_token=part_token, checked=part.checked)
            except Exception as exc:  # noqa: BLE001 - answered as 400/503, never raised
                return self._failed(part.table, exc)
            self._observe(time.monotonic() - started)
            committed_rows += len(part.rows)
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
            backoff = min(
                self.retry_after_seconds * 2 ** (self._consecutive_failures - 1), self.max_retry_after_seconds
            )
            self._unavailable_until = now + backoff
            self.last_store_error = f"{type(exc).__name__}: {text[:120]}"
            if self._consecutive_failures == 1:
                logger.warning("insert into %s failed; answering 503 for %.1f s: %s", table, backoff, text)
            return self._unavailable(now)


class SpanSink(Protocol):
    """Where the receiver puts a decoded trace export; the one interface of the two ways a
    span export is kept (:class:`DirectSpanSink`, :class:`~inferpath.server.span_log.LoggedSpanIngest`).

    ``reserve(body_bytes)``: room for an export whose body was read, before it is decoded:
    a :class:`Reservation` to release once answered, or a :class:`CommitResult` (503).
    ``accept(spans, token, body, content_type, content_encoding)``: keep the export's valid
    ``spans`` durably, then answer ``committed`` (200); never raises. ``flush(timeout_seconds)``:
    True once everything accepted before the call is in the store. ``close(timeout_seconds)``.
    Counters: ``inserted_spans_total`` (spans this process inserted), ``refused_spans_total``
    (acknowledged and then refused by the store for their data: 0 by design),
    ``backlog_spans`` (acknowledged, not yet inserted).
    """

    inserted_spans_total: int
    refused_spans_total: int

    @property
    def backlog_spans(self) -> int: ...

    def reserve(self, body_bytes: int) -> Reservation | CommitResult: ...

    def accept(
        self, spans: Sequence[SpanRow], token: str, body: bytes, content_type: str | None, content_encoding: str | None
    ) -> CommitResult: ...

    def start(self) -> None: ...

    def flush(self, timeout_seconds: float = 30.0) -> bool: ...

    def close(self, timeout_seconds: float = 30.0) -> None: ...


class DirectSpanSink:
    """A :class:`SpanSink` that inserts each export into ``otel_traces`` before its 200: one
    insert with the export's dedup token (a retried export is stored once), through
    ``ingest`` (its back-off and counters). ``on_committed(spans)`` gets the spans of each
    committed export (the assembler's ``note_spans``). Used against a ClickHouse server,
    where several stateless receivers share no folder for a log, and for embedded chDB with
    ``span_log`` off."""

    def __init__(
        self, ingest: DurableIngest, on_committed: Callable[[list[SpanRow]], None] = lambda spans: None
    ) -> None:
        self.ingest = ingest
        self.on_committed = on_committed
        self.inserted_spans_total = 0
        self.refused_spans_total = 0  # a refused insert is answered 400/503, so nothing acknowledged is lost
        self.backlog_spans = 0

    def reserve(self, body_bytes: int) -> Reservation:
        """Nothing to reserve beyond the receiver's in-flight limits (:meth:`DurableIngest.admit`)."""
        return Reservation(lambda _: None, body_bytes)

    def accept(
        self, spans: Sequence[SpanRow], token: str, body: bytes, content_type: str | None, content_encoding: str | None
    ) -> CommitResult:
        """Insert ``spans`` (token ``token``); ``body`` and its media type are not kept."""
        rows = [span.to_insert_row(timestamp_ns=True) for span in spans]
        result = self.ingest.commit([TableRows("otel_traces", SPAN_COLUMNS, rows, checked=True)], token)
        if result.ok and spans:
            self.inserted_spans_total += len(rows)
            # Only committed spans: the assembler may derive rows from them without a read-back.
            self.on_committed(list(spans))
        return result

    def start(self) -> None:
        """Nothing runs in the background."""

    def flush(self, timeout_seconds: float = 30.0) -> bool:
        """True: every accepted export was inserted before its answer."""
        return True

    def close(self, timeout_seconds: float = 30.0) -> None:
        """Nothing to close (the store is the runtime's)."""
