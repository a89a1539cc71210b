"""Hands the free memory the server's allocators hold back to the operating system, on a timer.

Why: the embedded store (chDB) allocates through its own jemalloc, which keeps pages it has
freed ("dirty" pages) for ``dirty_decay_ms`` = 5 s before returning them. Under steady ingest,
insert blocks and background merges free 100-300 MB at a time, so without help the server's
resident set swings by that much from one second to the next and climbs as merges grow with
the data (in the 10-minute soak of ``bench/server_soak.py``, jemalloc's resident bytes were
1.3-3.4x its active bytes; 1.1-2.5x with a pass every second). A pass of :class:`MemoryReleaser` runs ``SYSTEM JEMALLOC PURGE``
(ClickHouse's statement for jemalloc's ``arena.<i>.purge``) and glibc's ``malloc_trim(0)``
(the Python side's free heap pages), so the resident set tracks live memory: what an SRE's
dashboard and a cgroup memory limit see.

Every :data:`COLLECT_INTERVAL_SECONDS` a pass first runs a collection of Python's youngest
generation (``gc.collect(0)``). With the server's thresholds (``tune_gc_for_server``: young
collections every 100 000 net allocations of tracked objects) and an ingest path that
allocates few tracked objects, young collections had stopped for minutes, and garbage in
reference cycles waited that long: clickhouse-connect's ``InsertContext`` keeps a bound
method of itself, so the rows of every insert stayed alive, and the resident set grew
~1 MB/s in the 20k spans/s soak (one collection there gave 67 MB of Python objects and
42 MB of glibc heap back). ``Store.insert`` now breaks that cycle, and a test holds inserts
to leaving no cyclic garbage; the timed young collection stays as the net for any other
cycle (an exception's traceback, a library's), bounding how long its memory waits, at the
cost of one scan of the tracked objects born since the last (held spans among them). Only
the youngest generation: collecting the middle one as well, every 10 s, promoted enough
survivors to set off full collections and cost ~10 µs of CPU per span at ~42k spans/s
(bench/README.md, server_ingest). Once a minute, not every 10 s: CPython lowers the young
count on the deallocation of any tracked object, so at a steady load (held spans born as
old ones are let go) the count stays near zero while the young list gathers every span
held since the last collection; a timed young collection scanned them all, 146-450 ms on
the interpreter lock every 10 s at ~28k spans/s. Held spans live seconds, so a collection a
minute scans at most what the held-span bounds hold, six times less often; cyclic garbage
waits up to a minute. Under the ingest benchmark, after the insert fix, timed collections
found no cyclic garbage at all (bench/README.md, server_soak).

Before its threads start, a server process caps glibc's malloc arenas
(:func:`limit_c_heap_arenas`, :data:`SERVER_MALLOC_ARENAS`): glibc gives each new thread
an arena of its own, up to eight per core, and the server's ~20 Python threads (HTTP,
drainer, assembler, writers, refreshers) each left free chunks in theirs. In the 20k
spans/s soak the arenas' heap grew 67 → 115 MB in 10 minutes with 37-42 MB in use; with
two arenas it stayed at 47-55 MB. Python allocates under the interpreter lock, and chDB
through its own jemalloc, so threads rarely contend for an arena.

A ClickHouse server's memory is that server's own: for ``http(s)://`` stores, and for a chDB
built without jemalloc (``system.build_options``), only glibc is trimmed. A pass costs ~1 ms when there is little to return (one chDB statement); pages
returned are faulted in again when reused, which is the trade the interval sets
(``memory_release_interval_seconds``; 0 turns the releaser off).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferpath.storage.periodic import PeriodicPasses

__all__ = [
    "AllocatorStats",
    "COLLECT_INTERVAL_SECONDS",
    "MemoryReleaser",
    "SERVER_GC_THRESHOLDS",
    "SERVER_MALLOC_ARENAS",
    "allocator_stats",
    "limit_c_heap_arenas",
    "trim_c_heap",
    "tune_gc_for_server",
]

SERVER_MALLOC_ARENAS = 2
"""glibc malloc arenas a server process uses at most (module docstring)."""

SERVER_GC_THRESHOLDS = (100_000, 20, 10)
"""``gc.set_threshold`` of a server process (:func:`tune_gc_for_server`)."""

COLLECT_INTERVAL_SECONDS = 60.0
"""Seconds between the releaser's collections of Python's youngest generation (module docstring)."""

# malloc_stats_print's summary line (jemalloc 5.x): "Allocated: N, active: N, metadata: N
# (n_thp N), resident: N, mapped: N, retained: N" - the counters of jemalloc's stats.* mallctls.
_SUMMARY = re.compile(
    r"Allocated: (\d+), active: (\d+), metadata: (\d+).*?resident: (\d+), mapped: (\d+), "
    r"retained: (\d+)",
    re.S,
)


@dataclass(frozen=True)
class AllocatorStats:
    """jemalloc's summary counters in bytes (jemalloc's ``stats.*`` mallctls): ``allocated``
    (live allocations), ``active`` (pages holding them), ``resident`` (pages mapped in RAM,
    dirty free pages included), ``mapped``, ``retained`` (virtual only, not resident)."""

    allocated: int
    active: int
    metadata: int
    resident: int
    mapped: int
    retained: int

    @property
    def dirty(self) -> int:
        """Resident bytes holding neither live data nor jemalloc's metadata: free pages not yet
        returned (bytes, ≥ 0)."""
        return max(0, self.resident - self.active - self.metadata)


def allocator_stats(store: Any) -> AllocatorStats | None:
    """The embedded store's jemalloc counters (``system.jemalloc_stats``), or ``None`` for a
    ClickHouse server store. Raises what the store raises; ``ValueError`` if the statistics
    text has no summary line (a chDB built without jemalloc statistics)."""
    if store.url.kind != "chdb":
        return None
    text = store.query("SELECT stats FROM system.jemalloc_stats")[0][0]
    match = _SUMMARY.search(text)
    if match is None:
        raise ValueError("system.jemalloc_stats has no 'Allocated: ..., retained: ...' summary line")
    return AllocatorStats(*map(int, match.groups()))


def tune_gc_for_server() -> None:
    """Garbage-collector settings for a process that is (mostly) the server: what start-up
    allocated is frozen out of the collector's scans, young
    collections run every 100 000 net allocations instead of 700 and middle ones every 20
    young ones instead of 10 (:data:`SERVER_GC_THRESHOLDS`). Cycles are still collected,
    later; objects without cycles are freed by reference counting as before.

    Ingest allocates many short-lived objects per span. In the server, with the defaults,
    collections took about a third of the CPU under a steady OTLP load; measured at ~45k
    spans/s over 30 s (bench/README.md, server_ingest): 20 000 / 10 spent 3.5 s in
    collections (148 young ones of ~16 ms, 13 middle ones of ~80 ms), 100 000 / 20 spent
    1.3 s (11 young ones of ~120 ms), 250 000 / 20 1.1 s but in pauses of ~220 ms."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVER_GC_THRESHOLDS)


def _load_glibc(function: str, argtypes: list) -> Callable[..., int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        loaded = getattr(ctypes.CDLL(name), function)  # glibc only; musl and macOS have none
    except (OSError, AttributeError):
        return None
    loaded.argtypes = argtypes
    loaded.restype = ctypes.c_int
    return loaded


_malloc_trim = _load_glibc("malloc_trim", [ctypes.c_size_t])
_mallopt = _load_glibc("mallopt", [ctypes.c_int, ctypes.c_int])
_M_ARENA_MAX = -8  # glibc's malloc.h


def limit_c_heap_arenas(arenas: int = SERVER_MALLOC_ARENAS) -> bool:
    """``mallopt(M_ARENA_MAX, arenas)``: threads that first allocate after this call share at
    most ``arenas`` glibc malloc arenas (what ``MALLOC_ARENA_MAX`` sets at start-up); arenas
    already made stay. Call it before the process starts its threads. False where the C
    library has no ``mallopt`` or refuses the value. Raises ``ValueError`` for ``arenas`` < 1.
    """
    if arenas < 1:
        raise ValueError(f"arenas must be at least 1, got {arenas}")
    return _mallopt is not None and _mallopt(_M_ARENA_MAX, arenas) == 1


def trim_c_heap() -> bool:
    """``malloc_trim(0)``: glibc returns the free pages of every malloc arena. False where the
    C library has no ``malloc_trim``."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


class MemoryReleaser(PeriodicPasses):
    """Every ``interval_seconds`` (> 0), returns free allocator pages to the OS (module docstring).

    A failed pass is counted (``failures_total``), logged once per failure streak, and tried
    again next interval; nothing here raises into the server. ``passes_total``,
    ``seconds_total`` (time spent in passes) and ``last_stats`` (the embedded store's
    :class:`AllocatorStats` after a pass, sampled at most every ``stats_interval_seconds``;
    ``None`` before the first or for a server store) are read by ``/metrics``, which so never
    waits on the store.
    """

    thread_name = "inferpath-memory-release"
    failure_message = "could not return free memory to the OS"

    def __init__(self, store: Any, *, interval_seconds: float, stats_interval_seconds: float = 5.0) -> None:
        super().__init__(interval_seconds)
        self.store = store
        self.passes_total = 0
        self.seconds_total = 0.0
        self.stats_interval_seconds = stats_interval_seconds
        self.last_stats: AllocatorStats | None = None
        self._stats_at = float("-inf")
        self._collected_at = float("-inf")
        # Whether the store is chDB built with jemalloc (system.build_options); None until asked.
        self._purge_jemalloc: bool | None = None if store.url.kind == "chdb" else False

    def release_now(self) -> None:
        """One pass: collect Python's youngest generation (at most every
        :data:`COLLECT_INTERVAL_SECONDS`), purge chDB's jemalloc (embedded store built with
        it), trim glibc's heap. Raises what the store raises."""
        started = time.perf_counter()
        try:
            if time.monotonic() - self._collected_at >= COLLECT_INTERVAL_SECONDS:
                self._collected_at = time.monotonic()
                gc.collect(0)  # cyclic garbage first: what it frees, the trim can return
            if self._purge_jemalloc is None:
                rows = self.store.query("SELECT value FROM system.build_options WHERE name = 'USE_JEMALLOC'")
                self._purge_jemalloc = bool(rows) and str(rows[0][0]).strip().upper() in ("1", "ON", "TRUE")
            if self._purge_jemalloc:
                self.store.command("SYSTEM JEMALLOC PURGE")
            trim_c_heap()
        finally:
            self.seconds_total += time.perf_counter() - started
        self.passes_total += 1

    def run_pass(self) -> None:
        """The thread's pass: :meth:`release_now`, then the allocator's counters when the last
        sample is ``stats_interval_seconds`` old."""
        self.release_now()
        if time.monotonic() - self._stats_at >= self.stats_interval_seconds:
            self._stats_at = time.monotonic()
            self.last_stats = allocator_stats(self.store)
