"""The request assembler: turns landed spans into ``inferpath_requests`` rows.

Spans of one request arrive from several processes, in any order, late or twice. The
receiver hands the assembler the spans of each insert block it committed
(:meth:`RequestAssembler.note_spans`); once a trace has been quiet for ``settle_seconds``
the assembler derives the row from ALL its stored spans with :func:`assemble_request` (a
pure function, :mod:`inferpath.server.derive`) and writes it with ``updated_at = now``. A
late span notes the trace again and the row is re-derived; ``inferpath_requests`` is a
ReplacingMergeTree on ``updated_at``, so the newest row wins.

Where the spans come from: the committed spans of a pending trace are held until it
settles. They are all of its stored spans when ``otel_traces_trace_id_ts`` (one row per
insert block and trace) holds as many rows for the trace as distinct blocks were handed
over here; then the row is derived from memory. Otherwise (spans stored before a restart
or by another server, a late span of a trace assembled already, a block committed again,
a trace noted by id, spans past ``max_held_spans``) its spans are read back, one query for
the pass. Reading every trace back cost ~20 µs of CPU per span in the driver, as much as
ingesting it (bench/README.md, server_ingest).

Times: settling uses the monotonic clock (``time.monotonic``); ``updated_at`` is wall clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from inferpath.ratelimited_log import RateLimitedLog
from inferpath.server.derive import DerivationCounts, assemble_request, seconds_to_ns, union_ns
from inferpath.storage.periodic import PeriodicPasses
from inferpath.storage.rows import REQUEST_COLUMNS, SPAN_COLUMNS, SpanRow
from inferpath.storage.store import Store
from inferpath.storage.writer import BatchWriter

__all__ = ["RequestAssembler", "assemble_request", "seconds_to_ns", "union_ns", "read_trace_spans"]

logger = logging.getLogger(__name__)

REQUESTS_TABLE = "inferpath_requests"
# Trace ids per query: a pass's settled traces go in one (chDB spends ~7 ms per query
# whatever its size); the bound keeps the IN list of a backlog small.
_BATCH_TRACES = 5000
# A failed pass is retried with a doubling delay (1, 2, 4, … s, at most 30 s), so that a
# store outage of a minute or two loses no request row.
_MAX_ATTEMPTS = 10
_MAX_RETRY_DELAY_SECONDS = 30.0
# After a crash, traces with spans this recent and no request row are assembled again.
RECOVERY_WINDOW_SECONDS = 3600
_RECOVERY_LIMIT = 100_000

_SPAN_SELECT = ", ".join(SPAN_COLUMNS)
# Per trace: its insert blocks (rows of the trace-id table, fed once per block and trace)
# and their span starts in whole seconds. A primary-key lookup.
_BLOCKS_SQL = (
    "SELECT TraceId, count(), toUInt32(min(Start)), toUInt32(max(End)) FROM otel_traces_trace_id_ts"
    " WHERE TraceId IN {ids:Array(String)} GROUP BY TraceId"
)


def read_trace_spans(
    store: Store, trace_ids: Iterable[str], start_unix_s: int | None = None, end_unix_s: int | None = None
) -> dict[str, list[SpanRow]]:
    """All stored spans of ``trace_ids`` grouped by trace id (one query per 5000 ids), only
    those starting within ``[start_unix_s, end_unix_s + 1)`` when bounds are given.

    Trace ids absent from storage are absent from the result. Driver errors propagate.
    """
    ids = list(dict.fromkeys(trace_ids))
    where, params = "TraceId IN {ids:Array(String)}", {}
    if start_unix_s is not None and end_unix_s is not None:
        where += (
            " AND Timestamp >= toDateTime64({start:UInt32}, 9, 'UTC')"
            " AND Timestamp < toDateTime64({end:UInt32} + 1, 9, 'UTC')"
        )
        params = {"start": start_unix_s, "end": end_unix_s}
    out: dict[str, list[SpanRow]] = {}
    for offset in range(0, len(ids), _BATCH_TRACES):
        rows = store.query(
            f"SELECT {_SPAN_SELECT} FROM otel_traces WHERE {where}",
            {**params, "ids": ids[offset : offset + _BATCH_TRACES]},
        )
        for row in rows:
            span = SpanRow.from_db_row(row)
            out.setdefault(span.trace_id, []).append(span)
    return out


@dataclass(slots=True, eq=False)
class _Pending:
    """A trace noted and not yet assembled: when (monotonic seconds), its committed spans
    (``None``: read back) and the keys of the insert blocks they came in."""

    noted_at: float
    spans: list[SpanRow] | None
    blocks: set[tuple[int, str]] = field(default_factory=set)


class RequestAssembler(PeriodicPasses):
    """Derives and writes one request row per settled trace.

    ``store``: an open :class:`Store`. ``settle_seconds``: quiet time after the last noted
    span before a trace is assembled. ``max_held_spans``: committed spans held for pending
    traces at most (traces past it are read back). ``writer``: a :class:`BatchWriter` for
    ``inferpath_requests`` (created and owned here when ``None``). ``interval_seconds``:
    period of the background thread. ``clock``: monotonic seconds (tests pass their own).

    Counters: ``rows_written_total`` (rows handed to the writer), ``traces_without_row_total``
    (settled traces with no request role, e.g. engine start-up), ``errors_total`` (failed
    passes; their traces are retried up to 10 times with a doubling delay),
    ``assembled_from_memory_total`` / ``assembled_from_store_total`` (traces by where their
    spans came from), ``held_spans`` (now), ``derivation_counts``
    (:class:`~inferpath.server.sources.DerivationCounts`: TTFT conflicts between sources of
    one span, malformed chunk events and first-token times ignored; counted at every
    derivation, so a trace re-derived for a late span counts again).
    """

    thread_name = "inferpath-assembler"
    failure_message = "request assembly pass failed"

    def __init__(
        self,
        store: Store,
        *,
        settle_seconds: float = 2.0,
        max_held_spans: int = 250_000,
        writer: BatchWriter | None = None,
        interval_seconds: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if settle_seconds < 0:
            raise ValueError(f"settle_seconds must be >= 0, got {settle_seconds}")
        super().__init__(interval_seconds)
        self.store = store
        self.settle_seconds = float(settle_seconds)
        self.max_held_spans = max_held_spans
        self._owns_writer = writer is None
        self.writer = writer or BatchWriter(store, REQUESTS_TABLE, REQUEST_COLUMNS)
        self._clock = clock
        self._pending: dict[str, _Pending] = {}
        self._attempts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()  # one assembly pass at a time (thread vs. flush)
        self.held_spans = 0
        self.rows_written_total = 0
        self.traces_without_row_total = 0
        self.errors_total = 0
        self.assembled_from_memory_total = 0
        self.assembled_from_store_total = 0
        self.derivation_counts = DerivationCounts()
        self._ignored_timings_log = RateLimitedLog(logger, interval_seconds=10.0)

    @property
    def pending_traces(self) -> int:
        """Trace ids noted and not yet assembled."""
        return len(self._pending)

    def note_spans(self, spans: Iterable[SpanRow], now: float | None = None) -> None:
        """Mark the traces of ``spans`` as changed at ``now`` (monotonic seconds; default the
        clock) and hold the spans. ``spans``: ONE insert block just committed to
        ``otel_traces`` (see the module docstring). Never raises."""
        try:
            by_trace: dict[str, list[SpanRow]] = {}
            for span in spans:
                by_trace.setdefault(span.trace_id, []).append(span)
            stamp = self._clock() if now is None else now
            with self._lock:
                for trace_id, group in by_trace.items():
                    pending = self._pending.get(trace_id)
                    if pending is None:
                        pending = self._pending[trace_id] = _Pending(stamp, [])
                    pending.noted_at = stamp
                    if pending.spans is None:
                        continue
                    if self.held_spans + len(group) > self.max_held_spans:
                        self._let_go(pending)
                        continue
                    # A block committed again (same spans, a client's retry) adds no row.
                    pending.blocks.add((len(group), group[0].span_id))
                    pending.spans.extend(group)
                    self.held_spans += len(group)
        except Exception:  # noqa: BLE001 - called on the ingest path
            logger.exception("could not note spans for assembly")

    def note_trace_ids(self, trace_ids: Iterable[str], now: float | None = None) -> None:
        """Mark traces as changed at ``now`` (monotonic seconds; default the clock), with
        spans not handed here (written before a restart or by someone else): they are read
        back. Never raises."""
        try:
            stamp = self._clock() if now is None else now
            with self._lock:
                for trace_id in trace_ids:
                    pending = self._pending.setdefault(trace_id, _Pending(stamp, None))
                    pending.noted_at = stamp
                    self._let_go(pending)
        except Exception:  # noqa: BLE001 - called on the ingest path
            logger.exception("could not note trace ids for assembly")

    def _let_go(self, pending: _Pending) -> None:
        """Drop a pending trace's held spans (it is read back); the caller holds the lock."""
        if pending.spans is not None:
            self.held_spans -= len(pending.spans)
            pending.spans = None

    def run_once(self, force: bool = False, now: float | None = None) -> int:
        """Assemble every trace quiet for ``settle_seconds`` (all noted traces if ``force``).

        Returns the number of request rows handed to the writer. Storage errors are logged
        and counted, and the traces retried on a later pass (at most 10 attempts).
        """
        with self._run_lock:
            stamp = self._clock() if now is None else now
            with self._lock:
                due = {t: p for t, p in self._pending.items() if force or stamp - p.noted_at >= self.settle_seconds}
                for trace_id, pending in due.items():
                    del self._pending[trace_id]
                    if pending.spans is not None:
                        self.held_spans -= len(pending.spans)
            if not due:
                return 0
            try:
                spans_by_trace = self._spans_of(due)
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
            ignored = counts.ignored_timings_total - ignored_before
            if ignored:
                self._ignored_timings_log.warning(
                    "ignored %d malformed chunk event(s) or first-token time(s) (before the span's start, after "
                    "its end, or unparsable); the span's other measures were kept",
                    ignored,
                )
            if rows and self.writer.submit(rows):
                self.rows_written_total += len(rows)
            return len(rows)

    def _spans_of(self, due: dict[str, _Pending]) -> dict[str, list[SpanRow]]:
        """The stored spans of each due trace: the held ones when the store has no other
        insert block of the trace, else read back within the traces' stored bounds. Driver
        errors propagate."""
        ids = list(due)
        blocks: dict[str, tuple] = {}
        for offset in range(0, len(ids), _BATCH_TRACES):
            chunk = ids[offset : offset + _BATCH_TRACES]
            blocks.update((row[0], row[1:]) for row in self.store.query(_BLOCKS_SQL, {"ids": chunk}))
        memory: dict[str, list[SpanRow]] = {}
        read_back: list[str] = []
        for trace_id, pending in due.items():
            stored = blocks.get(trace_id)
            if stored is None:  # nothing stored: no row
                continue
            if pending.spans and stored[0] == len(pending.blocks):
                memory[trace_id] = pending.spans
            else:
                read_back.append(trace_id)
        self.assembled_from_memory_total += len(memory)
        self.assembled_from_store_total += len(read_back)
        if read_back:
            start = min(blocks[t][1] for t in read_back)
            end = max(blocks[t][2] for t in read_back)
            memory.update(read_trace_spans(self.store, read_back, start, end))
        return memory

    def _retry_later(self, due: dict[str, _Pending], stamp: float) -> None:
        with self._lock:
            for trace_id, pending in due.items():
                attempts = self._attempts.get(trace_id, 0) + 1
                if attempts >= _MAX_ATTEMPTS:
                    self._attempts.pop(trace_id, None)
                    logger.warning("giving up assembling trace %s after %d attempts", trace_id, attempts)
                    continue
                self._attempts[trace_id] = attempts
                # "Noted in the future": due once the delay and the settle time have passed.
                pending.noted_at = stamp + min(2.0 ** (attempts - 1), _MAX_RETRY_DELAY_SECONDS)
                if self._pending.setdefault(trace_id, pending) is pending and pending.spans is not None:
                    self.held_spans += len(pending.spans)

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
