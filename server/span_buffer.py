"""Committed spans held in memory per trace, so that request rows can be derived without
reading the spans back from the store.

The request assembler (:mod:`inferpath.server.assembler`) may derive a trace's row from
memory only when memory provably holds EVERY stored span of the trace. This module keeps
that proof, trace by trace, for a store that this process alone writes (embedded chDB):

- A trace is *held* from the first export of it that this process committed, and every
  later committed span of it is appended. A trace noted without its spans (after a
  restart, :meth:`RequestAssembler.recover`; a caller that wrote spans itself) is never
  held: it is read back.
- Spans written before this process started: every one of them started before
  :attr:`SpanBuffer.cutoff_unix_s` (one second past the newest span start in the store at
  start-up). A held trace with a span starting earlier is read back; one whose spans all
  start later is checked once, before its first assembly from memory, for a stored span
  starting before the cutoff (:data:`STORED_BEFORE_CUTOFF_SQL`, a primary-key lookup in
  ``otel_traces_trace_id_ts``; the server's start-up restores that table's rows for spans
  of the recovery window that an interrupted insert left without them).
- Spans this process wrote and then let go of: once assembled, a trace's spans stay held
  for ``late_window_seconds`` (a late span re-derives the row from all of them); after
  that, or when the bounds evict them first, the trace id goes into a Bloom filter of
  *forgotten* traces, and a trace that may be in it is read back; each later committed
  span of such a trace adds its id again, so an id is in the filter's current generation
  from its last committed span on. The filter has two generations; when the older one is
  dropped, its ids were last added before the previous rotation, so every span of theirs
  started before the newest span start seen at that rotation: the cutoff moves one second
  past that start (not past the newest start now), and a trace whose id was dropped is
  caught by the cutoff check instead. Current traffic stays after the cutoff, so the traces
  held at a rotation are still derived from memory (moving the cutoff to the newest start
  sent every unverified held trace, and every trace of the next second or so, to be read
  back: at 20k spans/s a burst of thousands of read-backs every ~8 minutes).

Bounds: ``max_spans`` held spans and ``max_traces`` held traces in all. Over a bound, the
oldest assembled traces are let go first, then the oldest pending ones (those are then
read back when they settle); both count in ``evicted_traces_total``. A pending trace let
go costs a read-back, far dearer than a derivation, so the assembler holds back the
span-log drainer while pending spans alone fill the bound (:meth:`has_room_for`, see
:meth:`RequestAssembler.note_spans`): a transient backlog then waits in the span log
instead of turning into read-backs.

Not thread-safe: the assembler calls it under its own lock. Span times are compared as
aware datetimes (wall clock of the emitter, as stored).
"""

from __future__ import annotations

import operator
import re
from collections import OrderedDict
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone

from inferpath.storage.rows import SpanRow

__all__ = ["SpanBuffer", "TraceIdFilter", "STORED_BEFORE_CUTOFF_SQL", "STORE_NEWEST_START_SQL", "trace_id_ints"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_TIMESTAMP = operator.attrgetter("timestamp")
_HEX32 = re.compile(r"[0-9a-f]{32}\Z").match

# Trace ids of ``{ids}`` with a stored span starting before ``{cutoff}`` (Unix seconds).
# ``Start`` is the floor to whole seconds of the earliest span start of one insert block,
# so a span starting before the cutoff second gives ``Start < cutoff``, and held spans
# (all starting at or after the cutoff second) never do. ``{ids}`` are the trace ids as
# 128-bit integers (:func:`trace_id_ints`): the driver binds a string parameter by escaping
# it character by character in Python, ~3.4 µs per 32-digit id against ~0.9 µs for an
# integer, on the assembler's thread; ``hex`` of an integer drops leading zero bytes and
# ``leftPad`` restores the 32 digits of the stored ``TraceId``.
STORED_BEFORE_CUTOFF_SQL = (
    "SELECT DISTINCT TraceId FROM otel_traces_trace_id_ts"
    " WHERE TraceId IN (SELECT leftPad(lower(hex(arrayJoin({ids:Array(UInt128)}))), 32, '0'))"
    " AND Start < toDateTime({cutoff:UInt32})"
)
# Newest span start already stored (whole seconds, floored; 0 for an empty store). Read from
# ``otel_traces`` itself, not from the trace-id table, which an interrupted insert can leave
# without a trace's row until start-up repairs it; ``Timestamp`` is the partition key's
# column, so ClickHouse answers from the parts' min-max indexes.
STORE_NEWEST_START_SQL = "SELECT toUnixTimestamp(max(Timestamp)) FROM otel_traces"


def trace_id_ints(trace_ids: Iterable[str]) -> tuple[list[int], list[str]]:
    """``(ints, malformed)``: each 32-digit hex trace id of ``trace_ids`` as an unsigned
    128-bit int (the ``{ids}`` of :data:`STORED_BEFORE_CUTOFF_SQL`), and the ids that are
    not 32 lowercase hex digits (no span of this process has one; the caller reads such a
    trace back)."""
    ints: list[int] = []
    malformed: list[str] = []
    for trace_id in trace_ids:
        if _HEX32(trace_id):  # int() alone would also take "0x…", "_", signs and spaces
            ints.append(int(trace_id, 16))
        else:
            malformed.append(trace_id)
    return ints, malformed


class TraceIdFilter:
    """A two-generation Bloom filter of trace ids (no false negatives within two generations).

    ``capacity``: ids per generation (default 1,000,000); ``bits``: bits per generation
    (default 2**24, 2 MiB; with 4 hashes about 0.2% false positives at capacity). Adding
    the ``capacity``-th id of a generation rotates: the older generation is dropped and
    :meth:`add` returns True, so the caller can account for the ids that were dropped.
    Hashes come from Python's ``hash`` of the id (per-process keyed SipHash).
    """

    _HASHES = 4

    def __init__(self, capacity: int = 1_000_000, bits: int = 1 << 24) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if bits < 64 or bits & (bits - 1):
            raise ValueError(f"bits must be a power of two >= 64, got {bits}")
        self.capacity = capacity
        self._mask = bits - 1
        self._current = bytearray(bits // 8)
        self._previous = bytearray(bits // 8)
        self._count = 0

    def _positions(self, trace_id: str) -> list[int]:
        h = hash(trace_id) & 0xFFFF_FFFF_FFFF_FFFF
        low, high = h & 0xFFFF_FFFF, (h >> 32) | 1  # double hashing: low + i * high
        return [(low + i * high) & self._mask for i in range(self._HASHES)]

    def add(self, trace_id: str) -> bool:
        """Remember ``trace_id``; True when this add dropped the older generation."""
        rotated = False
        if self._count >= self.capacity:
            self._previous, self._current = self._current, bytearray(len(self._current))
            self._count = 0
            rotated = True
        bits = self._current
        for pos in self._positions(trace_id):
            bits[pos >> 3] |= 1 << (pos & 7)
        self._count += 1
        return rotated

    def __contains__(self, trace_id: str) -> bool:
        positions = self._positions(trace_id)
        for bits in (self._current, self._previous):
            if all(bits[pos >> 3] & (1 << (pos & 7)) for pos in positions):
                return True
        return False


class _Held:
    """The spans of one held trace: ``verified`` once checked for older stored spans."""

    __slots__ = ("spans", "earliest", "verified", "released_at")

    def __init__(self, spans: list[SpanRow], earliest: datetime) -> None:
        self.spans = spans
        self.earliest = earliest
        self.verified = False
        self.released_at = 0.0  # monotonic seconds the trace was assembled (held for late spans)


class SpanBuffer:
    """Per-trace spans committed by this process; see the module docstring for the proof.

    ``cutoff_unix_s``: spans stored before this buffer existed all started before this Unix
    second (:data:`STORE_NEWEST_START_SQL` + 1 at start-up). ``max_spans`` / ``max_traces``:
    bounds on what is held (pending and assembled together). ``late_window_seconds``: how
    long an assembled trace's spans stay held for late spans (monotonic clock).
    ``trace_filter``: the filter of forgotten trace ids (a fresh :class:`TraceIdFilter`
    when ``None``). Raises ``ValueError`` for a bound < 1 or a negative window.

    Counters: ``evicted_traces_total`` (traces let go before their time because of the bounds),
    ``held_spans``, ``pending_spans`` (of them, spans of traces not yet assembled) and
    ``held_traces`` (now).
    """

    def __init__(
        self,
        cutoff_unix_s: int,
        *,
        max_spans: int = 100_000,
        max_traces: int = 20_000,
        late_window_seconds: float = 30.0,
        trace_filter: TraceIdFilter | None = None,
    ) -> None:
        if max_spans < 1 or max_traces < 1:
            raise ValueError(f"max_spans and max_traces must be >= 1, got {max_spans}, {max_traces}")
        if late_window_seconds < 0:
            raise ValueError(f"late_window_seconds must be >= 0, got {late_window_seconds}")
        self.max_spans = max_spans
        self.max_traces = max_traces
        self.late_window_seconds = float(late_window_seconds)
        self._forgotten = trace_filter if trace_filter is not None else TraceIdFilter()
        self._pending: OrderedDict[str, _Held] = OrderedDict()  # not yet assembled, oldest first
        self._recent: OrderedDict[str, _Held] = OrderedDict()  # assembled, oldest release first
        self._latest_start = _EPOCH  # newest span start ever noted
        self._latest_start_at_rotation = _EPOCH  # _latest_start when the filter last rotated
        self.held_spans = 0
        self.pending_spans = 0
        self.evicted_traces_total = 0
        self.set_cutoff(cutoff_unix_s)

    def set_cutoff(self, cutoff_unix_s: int) -> None:
        """Move the cutoff to ``cutoff_unix_s`` (never backwards)."""
        current = getattr(self, "cutoff_unix_s", 0)
        self.cutoff_unix_s = max(current, int(cutoff_unix_s))
        self._cutoff = _EPOCH + timedelta(seconds=self.cutoff_unix_s)

    @property
    def held_traces(self) -> int:
        """Traces held now, pending and assembled."""
        return len(self._pending) + len(self._recent)

    def has_room_for(self, spans: int, traces: int) -> bool:
        """True when ``spans`` more spans of ``traces`` more traces fit the bounds without
        letting go of a pending trace (assembled ones may still be let go)."""
        return self.pending_spans + spans <= self.max_spans and len(self._pending) + traces <= self.max_traces

    # ------------------------------------------------------------------ noting
    def add(self, trace_id: str, spans: list[SpanRow], was_pending: bool) -> None:
        """Hold ``spans`` (committed, all of ``trace_id``) if memory has every span of the trace.

        ``was_pending``: the assembler had the trace noted already. A pending trace that is
        not held is being read back and stays so; a trace let go of earlier stays read back.
        """
        # Every committed span counts here, held or not: see _forget.
        starts = list(map(_TIMESTAMP, spans))
        latest = max(starts)
        if latest > self._latest_start:
            self._latest_start = latest
        held = self._pending.get(trace_id)
        if held is None:
            if was_pending:  # pending and not held: let go of, being read back
                self._forget(trace_id)
                return
            held = self._recent.pop(trace_id, None)
            if held is not None:  # a late span: re-derive from everything held
                self._pending[trace_id] = held
                self.pending_spans += len(held.spans)
            elif trace_id in self._forgotten:
                self._forget(trace_id)  # renewed: the filter keeps an id past its last span
                return
            else:
                held = _Held([], spans[0].timestamp)
                self._pending[trace_id] = held
        earliest = min(starts)
        if earliest < held.earliest:
            held.earliest = earliest
        held.spans.extend(spans)
        self.held_spans += len(spans)
        self.pending_spans += len(spans)
        if self.held_spans > self.max_spans or self.held_traces > self.max_traces:
            self._shrink()

    def drop(self, trace_id: str) -> None:
        """The trace has spans memory did not see (noted without spans): read it back from now on."""
        self._let_go(trace_id)

    # ------------------------------------------------------------------ assembly
    def take(self, trace_ids: Iterable[str]) -> tuple[dict[str, list[SpanRow]], list[str]]:
        """For a pass over ``trace_ids`` (settled): ``(memory, unverified)``.

        ``memory``: a snapshot of the held spans of each trace assembled from memory;
        ``unverified``: those of them not yet checked for older stored spans (the caller
        runs :data:`STORED_BEFORE_CUTOFF_SQL` and calls :meth:`demote` for each hit, or
        :meth:`verified`). Every other trace id is let go (read back; its later spans too).
        """
        memory: dict[str, list[SpanRow]] = {}
        unverified: list[str] = []
        for trace_id in trace_ids:
            held = self._pending.get(trace_id)
            if held is None:
                self._let_go(trace_id)
            elif not held.verified and held.earliest < self._cutoff:
                self._let_go(trace_id)
            else:
                memory[trace_id] = list(held.spans)
                if not held.verified:
                    unverified.append(trace_id)
        return memory, unverified

    def verified(self, trace_ids: Iterable[str]) -> None:
        """Mark traces as checked: no stored span older than the cutoff."""
        for trace_id in trace_ids:
            held = self._pending.get(trace_id)
            if held is not None:
                held.verified = True

    def demote(self, trace_id: str) -> None:
        """The store holds spans of the trace that memory lacks: read it back."""
        self._let_go(trace_id)

    def assembled(self, trace_id: str, still_pending: bool, now: float) -> None:
        """The trace's row was derived from memory at ``now`` (monotonic seconds). Unless
        more spans came meanwhile (``still_pending``), hold its spans for late ones."""
        if still_pending:
            return
        held = self._pending.pop(trace_id, None)
        if held is not None:
            self.pending_spans -= len(held.spans)
            held.released_at = now
            self._recent[trace_id] = held

    def expire(self, now: float) -> None:
        """Let go of assembled traces whose late window ended by ``now`` (monotonic seconds)."""
        while self._recent:
            trace_id, held = next(iter(self._recent.items()))
            if now - held.released_at < self.late_window_seconds:
                break
            self._let_go(trace_id)

    # ------------------------------------------------------------------ internals
    def _shrink(self) -> None:
        while (self.held_spans > self.max_spans or self.held_traces > self.max_traces) and self.held_traces:
            source = self._recent if self._recent else self._pending
            trace_id = next(iter(source))
            self._let_go(trace_id)
            self.evicted_traces_total += 1

    def _let_go(self, trace_id: str) -> None:
        held = self._pending.pop(trace_id, None)
        if held is not None:
            self.pending_spans -= len(held.spans)
        else:
            held = self._recent.pop(trace_id, None)
        if held is not None:
            self.held_spans -= len(held.spans)
        self._forget(trace_id)

    def _forget(self, trace_id: str) -> None:
        if self._forgotten.add(trace_id):
            # Ids of the dropped generation are no longer recognised. Each was last added
            # before the previous rotation, after its last committed span (see add), so all
            # its stored spans started before the newest start seen then: the cutoff check
            # catches them.
            self.set_cutoff(int((self._latest_start_at_rotation - _EPOCH).total_seconds()) + 1)
            self._latest_start_at_rotation = self._latest_start
