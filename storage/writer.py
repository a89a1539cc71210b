"""Batched, bounded, never-raising inserts into one table.

Callers on the ingest path hand rows to :meth:`BatchWriter.submit`, which only appends to an
in-memory queue; a daemon thread inserts them in batches of up to ``max_batch_rows`` or
every ``flush_interval_seconds``. A full queue drops the new rows and counts them (the
OpenTelemetry SDK's BatchSpanProcessor habit): telemetry never blocks or breaks the
observed service. A failed insert is retried a bounded number of times, then its rows
are dropped and counted. A row the store cannot hold (``storage/values.py``: a naive
datetime, text that is not a number, …) is rejected alone, counted and logged with its
reason; the other rows of its batch are inserted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence

from inferpath.ratelimited_log import RateLimitedLog
from inferpath.storage.store import Store, validate_table_name
from inferpath.storage.values import Rejection

logger = logging.getLogger(__name__)


class BatchWriter:
    """Queue rows for ``table`` and insert them in batches from a daemon thread.

    Rows are tuples in ``column_names`` order. Counters (plain ints, read without locking):
    ``rows_inserted_total``, ``rows_dropped_total`` (queue full, closed, rejected, or insert
    failed ``max_insert_attempts`` times), ``rows_rejected_total`` (the dropped rows the store
    could not hold, each logged with its reason), ``insert_errors_total`` (failed insert
    calls, retries included), ``last_insert_seconds`` (wall time of the last successful
    insert, monotonic clock), and the property ``queue_rows``.
    Raises ``ValueError`` at construction for a bad table name or limits.
    """

    def __init__(
        self,
        store: Store,
        table: str,
        column_names: Sequence[str],
        *,
        max_batch_rows: int = 5000,
        flush_interval_seconds: float = 1.0,
        max_queue_rows: int = 200_000,
        max_insert_attempts: int = 3,
        retry_backoff_seconds: float = 0.5,
    ) -> None:
        validate_table_name(table)
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be >= 1, got {max_batch_rows}")
        if max_queue_rows < 1:
            raise ValueError(f"max_queue_rows must be >= 1, got {max_queue_rows}")
        if not flush_interval_seconds > 0:
            raise ValueError(f"flush_interval_seconds must be > 0, got {flush_interval_seconds}")
        if max_insert_attempts < 1:
            raise ValueError(f"max_insert_attempts must be >= 1, got {max_insert_attempts}")
        self.store = store
        self.table = table
        self.column_names = tuple(column_names)
        self.max_batch_rows = max_batch_rows
        self.flush_interval_seconds = flush_interval_seconds
        self.max_queue_rows = max_queue_rows
        self.max_insert_attempts = max_insert_attempts
        self.retry_backoff_seconds = retry_backoff_seconds

        self.rows_inserted_total = 0
        self.rows_dropped_total = 0
        self.rows_rejected_total = 0
        self.insert_errors_total = 0
        self.last_insert_seconds = 0.0

        self._queue: deque[list[tuple]] = deque()
        self._queue_rows = 0
        self._submitted_rows = 0  # rows ever accepted into the queue
        self._settled_rows = 0  # accepted rows inserted or dropped by the worker
        self._flush_waiters = 0
        self._insert_dropped_total = 0  # rows dropped by the worker after failed inserts
        self._closing = False
        self._cond = threading.Condition()
        self._log = RateLimitedLog(logger)
        self._rejected_log = RateLimitedLog(logger)
        self._thread = threading.Thread(target=self._run, name=f"inferpath-writer-{table}", daemon=True)
        self._thread.start()

    @property
    def queue_rows(self) -> int:
        """Rows accepted and not yet inserted or dropped by the worker."""
        return self._queue_rows

    def submit(self, rows: Sequence[tuple]) -> bool:
        """Queue ``rows``; True if accepted. Never raises.

        All-or-nothing: when the queue cannot take every row, or the writer is closed, none
        are queued, they are added to ``rows_dropped_total`` and False is returned.
        """
        try:
            batch = list(rows)
            if not batch:
                return True
            with self._cond:
                if self._closing or self._queue_rows + len(batch) > self.max_queue_rows:
                    self.rows_dropped_total += len(batch)
                    return False
                self._queue.append(batch)
                self._queue_rows += len(batch)
                self._submitted_rows += len(batch)
                if self._queue_rows >= self.max_batch_rows:
                    self._cond.notify_all()
            return True
        except Exception:  # noqa: BLE001 - the ingest path must never see an exception
            try:
                self.rows_dropped_total += len(rows)
            except Exception:  # noqa: BLE001
                pass
            return False

    def flush(self, timeout_seconds: float = 10.0) -> bool:
        """Block until every row submitted before this call is inserted.

        Returns True when they all were; False on timeout, or when some of them were
        dropped after failed inserts.
        """
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        with self._cond:
            target = self._submitted_rows
            insert_dropped_before = self._insert_dropped_total
            self._flush_waiters += 1
            self._cond.notify_all()
            try:
                while self._settled_rows < target:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._thread.is_alive():
                        return False
                    self._cond.wait(left)
            finally:
                self._flush_waiters -= 1
            # Queue-full drops in submit() concern rows outside ``target``; only the
            # worker's drops (failed inserts) can hit rows this flush waits for.
            return self._insert_dropped_total == insert_dropped_before

    def close(self, timeout_seconds: float = 10.0) -> None:
        """Insert what is queued (up to ``timeout_seconds``), stop the thread. Idempotent.

        Later :meth:`submit` calls return False and count their rows as dropped.
        """
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(max(0.0, timeout_seconds))

    # ------------------------------------------------------------------ worker
    def _take_batch(self) -> list[tuple]:
        """Pop up to ``max_batch_rows`` rows; caller holds the condition."""
        out: list[tuple] = []
        while self._queue and len(out) < self.max_batch_rows:
            chunk = self._queue[0]
            room = self.max_batch_rows - len(out)
            if len(chunk) <= room:
                out.extend(self._queue.popleft())
            else:
                out.extend(chunk[:room])
                self._queue[0] = chunk[room:]
        return out

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_interval_seconds
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    if (
                        self._queue_rows >= self.max_batch_rows
                        or self._closing
                        or (self._flush_waiters and self._queue)
                        or now >= next_flush
                    ):
                        break
                    self._cond.wait(next_flush - now)
                batch = self._take_batch()
                closing = self._closing
            if batch:
                self._insert_with_retries(batch, closing)
            with self._cond:
                self._queue_rows -= len(batch)
                self._settled_rows += len(batch)
                self._cond.notify_all()
                if self._closing and not self._queue:
                    return
                if self._queue_rows < self.max_batch_rows:
                    next_flush = time.monotonic() + self.flush_interval_seconds

    def _insert_with_retries(self, batch: list[tuple], closing: bool) -> None:
        for attempt in range(1, self.max_insert_attempts + 1):
            started = time.monotonic()
            rejected: list[Rejection] = []
            try:
                inserted = self.store.insert(self.table, batch, self.column_names, rejected=rejected)
            except Exception as exc:  # noqa: BLE001 - counted and logged, never raised
                self.insert_errors_total += 1
                self._log.warning(
                    "insert of %d rows into %s failed (attempt %d/%d): %s",
                    len(batch),
                    self.table,
                    attempt,
                    self.max_insert_attempts,
                    exc,
                )
                # A ValueError is a bad call, not a transient fault: retrying cannot help.
                if isinstance(exc, ValueError) or attempt == self.max_insert_attempts:
                    break
                if not closing:
                    time.sleep(min(self.retry_backoff_seconds * 2 ** (attempt - 1), 5.0))
                continue
            self.last_insert_seconds = time.monotonic() - started
            self.rows_inserted_total += inserted
            if rejected:
                self._count_rejected(rejected, len(batch))
            return
        with self._cond:
            self.rows_dropped_total += len(batch)
            self._insert_dropped_total += len(batch)

    def _count_rejected(self, rejected: list[Rejection], batch_rows: int) -> None:
        rows = len({r.row for r in rejected})
        with self._cond:
            self.rows_rejected_total += rows
            self.rows_dropped_total += rows
            self._insert_dropped_total += rows
        self._rejected_log.warning(
            "%d of %d rows for %s cannot be stored and were dropped (the others were inserted): %s",
            rows,
            batch_rows,
            self.table,
            "; ".join(map(str, rejected[:5])) + ("; …" if len(rejected) > 5 else ""),
        )
