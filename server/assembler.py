"""The request assembler: turns landed spans into ``inferpath_requests`` rows.

Spans of one request arrive from several processes, in any order, late or twice. The
receiver hands the assembler the spans it committed (:meth:`RequestAssembler.note_spans`);
once a trace has been quiet for ``settle_seconds`` the assembler derives the row from ALL
its spans with :func:`assemble_request` (a pure function, in :mod:`inferpath.server.derive`)
and writes it with ``updated_at = now``. A late span simply notes the trace again and the
row is re-derived; ``inferpath_requests`` is a ReplacingMergeTree on ``updated_at``, so the
newest row wins.

Where the spans come from: on embedded chDB (this process is the store's only writer) the
committed spans are held in memory (:class:`~inferpath.server.span_buffer.SpanBuffer`) and a
trace is assembled from memory whenever memory provably holds every stored span of it (the
proof is in that module's docstring); otherwise, and always against a ClickHouse server
(several stateless servers may receive spans of one trace), its spans are read back from
the store. Both paths feed the same spans to the same function, so they give the same row.

Times: settling uses the monotonic clock (``time.monotonic``); ``updated_at`` is wall clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone

from inferpath.ratelimited_log import RateLimitedLog
from inferpath.server.derive import DerivationCounts, assemble_request, seconds_to_ns, union_ns
from inferpath.server.span_buffer import STORE_NEWEST_START_SQL, STORED_BEFORE_CUTOFF_SQL, SpanBuffer, trace_id_ints
from inferpath.storage.periodic import PeriodicPasses
from inferpath.storage.rows import REQUEST_COLUMNS, SPAN_COLUMNS, SpanRow
from inferpath.storage.store import Store
from inferpath.storage.writer import BatchWriter

__all__ = ["RequestAssembler", "assemble_request", "seconds_to_ns", "union_ns", "read_trace_spans"]

logger = logging.getLogger(__name__)

REQUESTS_TABLE = "inferpath_requests"
# Traces read back per query; bounded so one IN-list query stays small.
_READ_BATCH_TRACES = 500
# Held traces checked for older stored spans per query: chDB's cost per query is ~7 ms
# whatever its size, so at 500 ids a check cost ~17 µs of CPU per trace, at 5000 ~6 µs.
_CHECK_BATCH_TRACES = 5000
# A failed pass is retried with a doubling delay (1, 2, 4, … s, at most 30 s), so that a
# store outage of a minute or two loses no request row.
_MAX_ATTEMPTS = 10
_MAX_RETRY_DELAY_SECONDS = 30.0
# After a crash, traces with spans this recent and no request row are assembled again.
RECOVERY_WINDOW_SECONDS = 3600
_RECOVERY_LIMIT = 100_000

_SPAN_SELECT = ", ".join(SPAN_COLUMNS)


def read_trace_spans(store: Store, trace_ids: Iterable[str]) -> dict[str, list[SpanRow]]:
    """All stored spans of ``trace_ids`` grouped by trace id (one query per 500 ids).

    Trace ids absent from storage are absent from the result. Driver errors propagate.
    """
    ids = list(dict.fromkeys(trace_ids))
    out: dict[str, list[SpanRow]] = {}
    for offset in range(0, len(ids), _READ_BATCH_TRACES):
        chunk = ids[offset : offset + _READ_BATCH_TRACES]
        rows = store.query(
            f"SELECT {_SPAN_SELECT} FROM otel_traces WHERE TraceId IN {{ids:Array(String)}}",
            {"ids": chunk},
        )
        for row in rows:
            span = SpanRow.from_db_row(row)
            out.setdefault(span.trace_id, []).append(span)
    return out


class RequestAssembler(PeriodicPasses):
    """Derives and writes one request row per settled trace.

    ``store``: an open :class:`Store`. ``settle_seconds``: quiet time after the last noted
    span before a trace is assembled. ``hold_spans``: derive rows from the spans handed to
    :meth:`note_spans` when provably complete (``None``: only on embedded chDB, where this
    process is the only writer; ``True`` against a server is refused with ``ValueError``).
    ``max_held_spans`` / ``max_held_traces`` / ``late_window_seconds``: the bounds of the
    held spans and how long an assembled trace's spans stay held for late spans
    (:class:`~inferpath.server.span_buffer.SpanBuffer`). ``max_room_wait_seconds``: how long
    :meth:`note_spans` may hold its caller back while pending spans fill those bounds
    (0: never). ``writer``: a :class:`BatchWriter` for
    ``inferpath_requests`` (created and owned here when ``None``). ``before_read``: called
    before spans are read back (the runtime passes the span writer's flush, so that spans
    accepted before a trace settled are in storage when it is read). ``interval_seconds``:
    period of the background thread.

    Counters: ``rows_written_total`` (rows handed to the writer), ``traces_without_row_total``
    (settled traces with no request role, e.g. engine start-up), ``errors_total`` (failed
    read-back passes; their traces are retried up to 10 times with a doubling delay),
    ``assembled_from_memory_total`` / ``assembled_from_store_total`` (traces by source),
    ``held_spans_evicted_traces_total`` (held traces let go early because of the bounds),
    ``room_waits_total`` / ``room_wait_seconds_total`` (callers of :meth:`note_spans` held
    back, and for how long in all, monotonic clock), ``derivation_counts``
    (:class:`~inferpath.server.sources.DerivationCounts`: TTFT conflicts between sources of
    one span, malformed chunk events and first-token times ignored; counted at every
    derivation of a trace, so a trace re-derived for a late span counts again).
    """

    thread_name = "inferpath-assembler"
    failure_message = "request assembly pass failed"

    def __init__(
        self,
        store: Store,
        *,
        settle_seconds: float = 2.0,
        writer: BatchWriter | None = None,
        before_read: Callable[[], object] | None = None,
        interval_seconds: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        hold_spans: bool | None = None,
        max_held_spans: int = 100_000,
        max_held_traces: int = 20_000,
        late_window_seconds: float = 30.0,
        max_room_wait_seconds: float = 1.0,
    ) -> None:
        if settle_seconds < 0:
            raise ValueError(f"settle_seconds must be >= 0, got {settle_seconds}")
        super().__init__(interval_seconds)
        if max_room_wait_seconds < 0:
            raise ValueError(f"max_room_wait_seconds must be >= 0, got {max_room_wait_seconds}")
        self.max_room_wait_seconds = float(max_room_wait_seconds)
        self.store = store
        self.settle_seconds = float(settle_seconds)
        self._owns_writer = writer is None
        self.writer = writer or BatchWriter(store, REQUESTS_TABLE, REQUEST_COLUMNS)
        self._before_read = before_read
        self._clock = clock
        self._pending: dict[str, float] = {}  # trace id -> monotonic time last noted
        self._attempts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # a pass let go of pending spans
        self._run_lock = threading.Lock()  # one assembly pass at a time (thread vs. flush)
        self.rows_written_total = 0
        self.traces_without_row_total = 0
        self.errors_total = 0
        self.assembled_from_memory_total = 0
        self.assembled_from_store_total = 0
        self.room_waits_total = 0
        self.room_wait_seconds_total = 0.0
        self.derivation_counts = DerivationCounts()
        self._ignored_timings_log = RateLimitedLog(logger, interval_seconds=10.0)
        single_writer = store.url.kind == "chdb"
        if hold_spans and not single_writer:
            raise ValueError("hold_spans needs embedded chDB: a ClickHouse server may have other writers")
        self._buffer: SpanBuffer | None = None
        if single_writer if hold_spans is None else hold_spans:
            try:
                newest = store.query(STORE_NEWEST_START_SQL)
                cutoff = int(newest[0][0] or 0) + 1 if newest else 1
            except Exception as exc:  # noqa: BLE001 - without a cutoff, read everything back
                logger.warning("could not read the newest stored span; request rows are read back: %s", exc)
            else:
                self._buffer = SpanBuffer(
                    cutoff,
                    max_spans=max_held_spans,
                    max_traces=max_held_traces,
                    late_window_seconds=late_window_seconds,
                )

    @property
    def pending_traces(self) -> int:
        """Trace ids noted and not yet assembled."""
        return len(self._pending)

    @property
    def holds_spans(self) -> bool:
        """True when rows may be derived from held spans (embedded chDB)."""
        return self._buffer is not None

    @property
    def held_spans(self) -> int:
        """Spans held in memory now (0 when spans are not held)."""
        return self._buffer.held_spans if self._buffer is not None else 0

    @property
    def held_spans_evicted_traces_total(self) -> int:
        """Held traces let go before their time because of the bounds."""
        return self._buffer.evicted_traces_total if self._buffer is not None else 0

    def note_spans(self, spans: Iterable[SpanRow], now: float | None = None) -> None:
        """Mark the traces of ``spans`` as changed at ``now`` (monotonic seconds; default the
        clock) and hold the spans. ``spans``: rows just COMMITTED to ``otel_traces`` by this
        process; every span it commits must come through here (or the trace through
        :meth:`note_trace_ids`). Never raises.

        Back-pressure: while the assembly thread runs and the spans would push pending
        (not yet assembled) spans past the held-span bounds, the caller (the span log's
        notifier thread, which then holds the drainer back, or a request thread without the
        span log) waits up to
        ``max_room_wait_seconds`` for a pass to assemble some, so that a transient backlog
        waits upstream instead of evicting pending traces into read-backs; then the spans
        are held anyway (the bounds evict as before). Waits are counted in
        ``room_waits_total`` / ``room_wait_seconds_total``."""
        try:
            by_trace: dict[str, list[SpanRow]] = {}
            count = 0
            for span in spans:
                count += 1
                group = by_trace.get(span.trace_id)
                if group is None:
                    by_trace[span.trace_id] = [span]
                else:
                    group.append(span)
            with self._lock:
                buffer = self._buffer
                if buffer is not None and not buffer.has_room_for(count, len(by_trace)):
                    self._wait_for_room(buffer, count, len(by_trace))
                stamp = self._clock() if now is None else now
                for trace_id, group in by_trace.items():
                    was_pending = trace_id in self._pending
                    self._pending[trace_id] = stamp
                    if buffer is not None:
                        buffer.add(trace_id, group, was_pending)
        except Exception:  # noqa: BLE001 - called on the ingest path
            logger.exception("could not note spans for assembly")

    def _wait_for_room(self, buffer: SpanBuffer, spans: int, traces: int) -> None:
        """Wait (holding ``_lock`` through ``_room``) until ``spans`` of ``traces`` fit the
        held-span bounds, at most ``max_room_wait_seconds``; only while the assembly thread
        runs (else nothing would make room)."""
        thread = self._thread
        if self.max_room_wait_seconds <= 0 or thread is None or thread is threading.current_thread():
            return
        began = time.monotonic()
        deadline = began + self.max_room_wait_seconds
        waited = False
        while (
            buffer.pending_spans
            and not buffer.has_room_for(spans, traces)
            and thread.is_alive()
            and not self._stop.is_set()
        ):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            waited = True
            self._room.wait(min(left, 0.1))
        if waited:
            self.room_waits_total += 1
            self.room_wait_seconds_total += time.monotonic() - began

    def note_trace_ids(self, trace_ids: Iterable[str], now: float | None = None) -> None:
        """Mark traces as changed at ``now`` (monotonic seconds; default the clock), with
        spans memory has not seen (written by someone else, or before a restart): these
        traces are read back from the store. Never raises."""
        try:
            stamp = self._clock() if now is None else now
            with self._lock:
                for trace_id in trace_ids:
                    self._pending[trace_id] = stamp
                    if self._buffer is not None:
                        self._buffer.drop(trace_id)
        except Exception:  # noqa: BLE001 - called on the ingest path
            logger.exception("could not note trace ids for assembly")

    def run_once(self, force: bool = False, now: float | None = None) -> int:
        """Assemble every trace quiet for ``settle_seconds`` (all noted traces if ``force``).

        Returns the number of request rows handed to the writer. Storage errors are logged
        and counted, and the traces retried on a later pass (at most 10 attempts).
        """
        with self._run_lock:
            stamp = self._clock() if now is None else now
            buffer = self._buffer
            memory: dict[str, list[SpanRow]] = {}
            unverified: list[str] = []
            with self._lock:
                due = [t for t, noted in self._pending.items() if force or stamp - noted >= self.settle_seconds]
                for trace_id in due:
                    del self._pending[trace_id]
                if buffer is not None:
                    buffer.expire(stamp)
                    if due:
                        memory, unverified = buffer.take(due)
                        self._room.notify_all()  # traces read back were let go
            if not due:
                return 0
            try:
                if unverified:
                    self._check_held(unverified, memory)
                from_store = [t for t in due if t not in memory]
                spans_by_trace: dict[str, list[SpanRow]] = {}
                if from_store:
                    if self._before_read is not None:
                        self._before_read()
                    spans_by_trace = read_trace_spans(self.store, from_store)
                spans_by_trace.update(memory)
            except Exception as exc:  # noqa: BLE001 - a background loop must survive the store
                self.errors_total += 1
                logger.warning("request assembly of %d traces failed: %s", len(due), exc)
                self._retry_later(due, stamp)
                return 0
            updated_at = datetime.now(timezone.utc)
            counts = self.derivation_counts
            ignored_before = counts.ignored_timings_total
            rows = []
            for trace_id in due:
                self._attempts.pop(trace_id, None)
                try:
                    row = assemble_request(spans_by_trace.get(trace_id, []), updated_at=updated_at, counts=counts)
                except Exception:  # noqa: BLE001 - one odd trace must not stop the others
                    self.errors_total += 1
                    logger.exception("could not assemble trace %s", trace_id)
                    continue
                if row is None:
                    self.traces_without_row_total += 1
                else:
                    rows.append(row.to_insert_row())
            if memory and buffer is not None:  # memory is only ever filled from the buffer
                with self._lock:
                    for trace_id in memory:
                        buffer.assembled(trace_id, trace_id in self._pending, stamp)
                    self._room.notify_all()
            ignored = counts.ignored_timings_total - ignored_before
            if ignored:
                self._ignored_timings_log.warning(
                    "ignored %d malformed chunk event(s) or first-token time(s) (before the span's start, after "
                    "its end, or unparsable); the span's other measures were kept",
                    ignored,
                )
            self.assembled_from_memory_total += len(memory)
            self.assembled_from_store_total += len(due) - len(memory)
            if rows and self.writer.submit(rows):
                self.rows_written_total += len(rows)
            return len(rows)

    def _check_held(self, trace_ids: list[str], memory: dict[str, list[SpanRow]]) -> None:
        """Held traces not yet checked: those with a stored span older than the cutoff (so
        maybe unseen) leave ``memory`` and are read back; the others are marked checked.
        Driver errors propagate (the pass is retried; the held spans stay)."""
        assert self._buffer is not None
        ids, malformed = trace_id_ints(trace_ids)
        stale: set[str] = set(malformed)
        cutoff = self._buffer.cutoff_unix_s
        for offset in range(0, len(ids), _CHECK_BATCH_TRACES):
            chunk = ids[offset : offset + _CHECK_BATCH_TRACES]
            stale.update(row[0] for row in self.store.query(STORED_BEFORE_CUTOFF_SQL, {"ids": chunk, "cutoff": cutoff}))
        with self._lock:
            for trace_id in stale:
                self._buffer.demote(trace_id)
                memory.pop(trace_id, None)
            self._buffer.verified(t for t in trace_ids if t not in stale)

    def _retry_later(self, trace_ids: list[str], stamp: float) -> None:
        with self._lock:
            for trace_id in trace_ids:
                attempts = self._attempts.get(trace_id, 0) + 1
                if attempts >= _MAX_ATTEMPTS:
                    self._attempts.pop(trace_id, None)
                    logger.warning("giving up assembling trace %s after %d attempts", trace_id, attempts)
                    continue
                self._attempts[trace_id] = attempts
                # "Noted in the future": due once the delay and the settle time have passed.
                delay = min(2.0 ** (attempts - 1), _MAX_RETRY_DELAY_SECONDS)
                self._pending.setdefault(trace_id, stamp + delay)

    def recover(self, window_seconds: float = RECOVERY_WINDOW_SECONDS) -> int:
        """Note every trace with a span starting in the last ``window_seconds`` that has no
        request row yet; returns how many. Called at start: traces noted before a crash
        (the pending set lives in memory) are assembled again. Never raises."""
        try:
            rows = self.store.query(
                "SELECT DISTINCT TraceId FROM otel_traces_trace_id_ts"
                " WHERE End >= now() - toIntervalSecond({window:UInt32})"
                " AND TraceId NOT IN (SELECT trace_id FROM inferpath_requests"
                "   WHERE updated_at >= now() - toIntervalSecond({window2:UInt32}))"
                " LIMIT {limit:UInt32}",
                {"window": int(window_seconds), "window2": 2 * int(window_seconds), "limit": _RECOVERY_LIMIT},
            )
        except Exception as exc:  # noqa: BLE001 - recovery is best effort, start-up must go on
            logger.warning("could not look for unassembled traces: %s", exc)
            return 0
        self.note_trace_ids(row[0] for row in rows)
        return len(rows)

    def flush(self, timeout_seconds: float = 10.0) -> bool:
        """Assemble every noted trace now and wait until the rows are inserted."""
        self.run_once(force=True)
        return self.writer.flush(timeout_seconds)

    # ------------------------------------------------------------------ thread
    def run_pass(self) -> None:
        self.run_once()

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Stop the thread, assemble what is still pending, close an owned writer."""
        super().stop(timeout_seconds)
        try:
            self.run_once(force=True)
        except Exception:  # noqa: BLE001
            logger.exception("final request assembly failed")
        if self._owns_writer:
            self.writer.close(timeout_seconds)
