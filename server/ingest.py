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
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

from inferpath.storage.store import Store

__all__ = ["CommitResult", "DurableIngest", "TableRows", "dedup_token", "INSERT_SECONDS_BUCKETS"]

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
    """Rows for one table: ``table``, ``columns`` (insert column order), ``rows`` (tuples)."""

    table: str
    columns: Sequence[str]
    rows: Sequence[tuple]


@dataclass(frozen=True)
class CommitResult:
    """What became of one export.

    ``status``: ``committed`` (HTTP 200), ``overloaded`` or ``unavailable`` (503 with
    ``Retry-After: retry_after_seconds``), ``invalid`` (400). ``message`` says why.
    """

    status: Literal["committed", "overloaded", "unavailable", "invalid"]
    message: str = ""
    retry_after_seconds: int = 0

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


class _Admission:
    def __init__(self, ingest: "DurableIngest", body_bytes: int) -> None:
        self._ingest = ingest
        self._body_bytes = body_bytes
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._ingest._release(self._body_bytes)

    def __enter__(self) -> "_Admission":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class DurableIngest:
    """Admission control and committed inserts for the OTLP receiver.

    ``store``: the open :class:`Store`. ``max_inflight_requests`` (≥ 1) and
    ``max_inflight_bytes`` (body bytes, ≥ 1) bound what is held in memory.
    ``retry_after_seconds`` / ``max_retry_after_seconds``: first and longest back-off after
    a store error. Raises ``ValueError`` at construction for bad limits.

    Counters (plain ints): ``commits_total``, ``rows_committed_total``,
    ``store_errors_total`` (failed inserts blamed on the store), ``data_errors_total``,
    ``overloaded_total`` / ``unavailable_total`` (exports refused with 503),
    ``insert_seconds_count`` / ``insert_seconds_sum`` / ``insert_seconds_buckets``
    (cumulative counts per :data:`INSERT_SECONDS_BUCKETS` bound); gauges
    ``inflight_requests``, ``inflight_bytes`` and their peaks ``peak_inflight_*``.
    """

    def __init__(self, store: Store, *, max_inflight_requests: int = 64,
                 max_inflight_bytes: int = 256 * 1024 * 1024, retry_after_seconds: float = 1.0,
                 max_retry_after_seconds: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        if max_inflight_requests < 1:
            raise ValueError(f"max_inflight_requests must be >= 1, got {max_inflight_requests}")
        if max_inflight_bytes < 1:
            raise ValueError(f"max_inflight_bytes must be >= 1, got {max_inflight_bytes}")
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

    def admit(self, body_bytes: int) -> _Admission | CommitResult:
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
        return _Admission(self, body_bytes)

    def _release(self, body_bytes: int) -> None:
        with self._lock:
            self.inflight_requests -= 1
            self.inflight_bytes -= body_bytes

    # ------------------------------------------------------------------ commit
    def commit(self, inserts: Sequence[TableRows], token: str | None) -> CommitResult:
        """Insert each table's rows as one block (token ``{token}:{table}``); return the result.

        All tables are tried in order; the first failure stops and decides the answer (the
        client's retry re-sends everything, and the tables already committed skip it by
        token). Never raises.
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
            try:
                self.store.insert(part.table, part.rows, part.columns,
                                  dedup_token=None if token is None else f"{token}:{part.table}")
            except Exception as exc:  # noqa: BLE001 - answered as 400/503, never raised
                return self._failed(part.table, exc)
            self._observe(time.monotonic() - started)
            committed_rows += len(part.rows)
        with self._lock:
            self._consecutive_failures = 0
            self.commits_total += 1
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
