"""The server's moving parts in one object, and ways to run it (thread or foreground).

:class:`ServerRuntime` owns the :class:`Store`, the committed OTLP ingest
(:class:`~inferpath.server.ingest.DurableIngest`: a 200 only once rows are in the store,
or in the span log, :attr:`ServerRuntime.span_sink`), one :class:`BatchWriter` per table the server derives or scrapes itself, the request
assembler thread and the scrape loop. The HTTP layer (:mod:`inferpath.server.app`) only
decodes, hands rows to :meth:`ServerRuntime.ingest_spans` / ``ingest_metrics`` and reads
through :attr:`ServerRuntime.reader`.

:func:`serve_in_thread` runs uvicorn in a background thread (tests, the demo);
:func:`serve_forever` runs it in the foreground with signal handling (the CLI). Both stop
gracefully: stop accepting, insert what was accepted, assemble what was noted, close.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import gc
import logging
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from inferpath.config import Settings
from inferpath.server.app import create_app
from inferpath.server.assembler import RECOVERY_WINDOW_SECONDS, REQUESTS_TABLE, RequestAssembler
from inferpath.server.ingest import CommitResult, DirectSpanSink, DurableIngest, SpanSink, TableRows
from inferpath.server.otlp import DecodedMetrics, DecodedSpans
from inferpath.server.scrape import ScrapeLoop
from inferpath.server.services import BackgroundService
from inferpath.server.span_log import LoggedSpanIngest, SpanLog
from inferpath.storage import gauge_rollup
from inferpath.storage.periodic import PeriodicPasses
from inferpath.storage.reader import Reader
from inferpath.storage.refresher import RollupRefresher
from inferpath.storage.repair import repair_trace_id_index
from inferpath.storage.rollup import RefreshResult
from inferpath.storage.rows import (
    GAUGE_COLUMNS,
    HISTOGRAM_COLUMNS,
    REQUEST_COLUMNS,
    SUM_COLUMNS,
)
from inferpath.storage.store import Store
from inferpath.storage.url import store_open_failure
from inferpath.storage.writer import BatchWriter

__all__ = [
    "AllocatorRelease",
    "ServerRuntime",
    "RunningServer",
    "cap_c_heap_arenas",
    "serve_in_thread",
    "serve_forever",
    "tune_gc_for_server",
]

logger = logging.getLogger(__name__)

_STARTUP_TIMEOUT_SECONDS = 30.0
# The span log's folder inside the chDB data folder (see span_log.py).
SPAN_LOG_FOLDER_NAME = "inferpath_span_log"


class _FlushPasses:
    """Passes of one piece of flush work (the forced assembly, the rollup refresh), run on a
    worker thread so a flush can stop waiting at its timeout.

    :meth:`run` waits up to ``timeout_seconds`` for a pass that starts after the call (a pass
    already running may have read before the caller's rows landed). At most one pass runs
    and at most one more waits: flushes arriving meanwhile share that waiting pass. The
    work serialises with its own background loop (the assembler's run lock, ``refresh_now``).
    """

    def __init__(self, name: str, thread_name: str, work: Callable[[], object]) -> None:
        self.name = name
        self.thread_name = thread_name
        self.work = work
        self._lock = threading.Lock()
        self._waiting: dict | None = None  # the pass not yet started: {"done": Event, "ok": bool}
        self._running: threading.Thread | None = None

    def run(self, timeout_seconds: float) -> bool:
        """True when a pass started after this call finished within ``timeout_seconds``; False
        on timeout (the pass goes on; its background loop would do the same work later) or
        failure (logged)."""
        with self._lock:
            if self._waiting is None:
                self._waiting = {"done": threading.Event(), "ok": False}
            pending = self._waiting
            if self._running is None:
                self._start_locked()
        if not pending["done"].wait(max(0.0, timeout_seconds)):
            logger.warning(
                "%s at flush still running after %.1f s; answering without it", self.name, max(0.0, timeout_seconds)
            )
            return False
        return pending["ok"]

    def _start_locked(self) -> None:
        pending, self._waiting = self._waiting, None
        self._running = threading.Thread(target=self._pass, args=(pending,), name=self.thread_name, daemon=True)
        self._running.start()

    def _pass(self, pending: dict) -> None:
        try:
            self.work()
            pending["ok"] = True
        except Exception as exc:  # noqa: BLE001 - the background loop retries the same work
            logger.warning("%s at flush failed: %s", self.name, exc)
        finally:
            pending["done"].set()
            with self._lock:
                self._running = None
                if self._waiting is not None:  # flushes arrived during this pass: one more for them
                    self._start_locked()


def _glibc(function: str):
    """glibc's ``function``, or ``None`` where the C library has none (musl, macOS)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), function)
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM, _MALLOPT = _glibc("malloc_trim"), _glibc("mallopt")
_M_ARENA_MAX = -8  # glibc's malloc.h


def cap_c_heap_arenas(arenas: int = 2) -> bool:
    """``mallopt(M_ARENA_MAX, arenas)``: threads started after this share at most ``arenas``
    glibc malloc arenas (glibc gives each new thread one, up to eight per core, and each kept
    free chunks). Call it before the server starts its threads; False without glibc."""
    return _MALLOPT is not None and _MALLOPT(_M_ARENA_MAX, arenas) == 1


class AllocatorRelease(PeriodicPasses):
    """Every second the allocators hand their free pages back to the OS: chDB's jemalloc
    (``SYSTEM JEMALLOC PURGE``, embedded store only) and glibc's heap (``malloc_trim(0)``).
    With this and :func:`cap_c_heap_arenas`, a 10-minute soak at 20k spans/s levelled off
    ~70 MB lower and grew +7.8 % instead of +12 % (bench/README.md, server_soak). A failing
    pass is counted and logged once per streak."""

    thread_name = "inferpath-allocator-release"
    failure_message = "could not hand free allocator pages back"

    def __init__(self, store: Store, interval_seconds: float = 1.0) -> None:
        super().__init__(interval_seconds)
        self.store = store

    def run_pass(self) -> None:
        if self.store.url.kind == "chdb":  # a ClickHouse server's memory is its own
            self.store.command("SYSTEM JEMALLOC PURGE")
        if _MALLOC_TRIM is not None:
            _MALLOC_TRIM(0)


class ServerRuntime:
    """Storage, writers and background loops of one inferpath server.

    ``settings``: :class:`~inferpath.config.Settings` (``store_url``,
    ``assembly_settle_seconds``, ``scrape_targets``, ``scrape_interval_seconds``, …).
    Opening the store applies migrations; raises what :meth:`Store.open` raises.
    Background threads start with :meth:`start`. Counters (``*_total``) are read by
    ``GET /metrics``. ``services``: parts run for others (the alert evaluator, see
    :mod:`inferpath.server.services`), by name in :attr:`services`: started after the
    server's own loops, stopped before the store closes. ``ValueError`` for two services of
    one name.
    """

    def __init__(self, settings: Settings, services: Sequence[BackgroundService] = ()) -> None:
        self.settings = settings
        self.services: dict[str, BackgroundService] = {}
        for service in services:
            if service.name in self.services:
                raise ValueError(f"two services are named {service.name!r}")
            self.services[service.name] = service
        self.store = Store.open(
            settings.store_url, ttl_days=settings.ttl_days, ttl_days_by_table=settings.ttl_days_by_table or None
        )
        self.rollups = RollupRefresher(self.store, interval_seconds=settings.rollup_interval_seconds)
        self.reader = Reader(self.store, rollup_min_window_seconds=settings.rollup_min_window_seconds)
        # OTLP exports are committed synchronously (a 200 means stored); see ingest.py.
        self.ingest = DurableIngest(
            self.store,
            max_inflight_requests=settings.max_inflight_requests,
            max_inflight_bytes=settings.max_inflight_bytes,
            retry_after_seconds=settings.store_retry_after_seconds,
        )
        # Rows the server derives or scrapes itself: batched, and re-derivable after a crash.
        # Many attempts, so that request rows survive a store outage of about 30 s.
        self.writers: dict[str, BatchWriter] = {
            "otel_metrics_gauge": BatchWriter(self.store, "otel_metrics_gauge", GAUGE_COLUMNS),
            "otel_metrics_sum": BatchWriter(self.store, "otel_metrics_sum", SUM_COLUMNS),
            "otel_metrics_histogram": BatchWriter(self.store, "otel_metrics_histogram", HISTOGRAM_COLUMNS),
            REQUESTS_TABLE: BatchWriter(self.store, REQUESTS_TABLE, REQUEST_COLUMNS, max_insert_attempts=12),
        }
        self.assembler = RequestAssembler(
            self.store,
            settle_seconds=settings.assembly_settle_seconds,
            writer=self.writers[REQUESTS_TABLE],
        )
        # Span exports: 200 once logged, inserted in large blocks by one thread (span_log.py),
        # or once inserted (DirectSpanSink).
        self._ttl_days_by_table: dict[str, int] = {}  # read by the span log's recovery
        self.span_sink: SpanSink = self._open_span_sink(settings)
        # Flush work that can take long (after a restart, every recovered trace is read back;
        # a rollup pass over days of backdated traces): waited for only until the timeout.
        self._flush_assembly = _FlushPasses(
            "request assembly", "inferpath-flush-assembly", lambda: self.assembler.run_once(force=True)
        )
        self._flush_rollups = _FlushPasses(
            "rollup refresh", "inferpath-flush-rollup", lambda: self.rollups.refresh_now()
        )
        self.scrape_loop = ScrapeLoop(
            settings.scrape_targets,
            self.writers["otel_metrics_gauge"],
            self.writers["otel_metrics_sum"],
            interval_seconds=settings.scrape_interval_seconds,
            histogram_writer=self.writers["otel_metrics_histogram"],
        )
        self.allocator_release = AllocatorRelease(self.store)
        self._lock = threading.Lock()
        self._closed = False
        self.spans_received_total = 0
        self.spans_duplicate_total = 0  # of them, spans of retried exports answered without an insert
        self.spans_rejected_total = 0
        self.spans_warned_total = 0
        # Valid items answered 503 (the client retries) or 400 (the store refused their data):
        # refused, in the OpenTelemetry Collector's words; nothing acknowledged is in them.
        self.spans_refused_total = 0
        self.data_points_received_total = 0
        self.data_points_rejected_total = 0
        self.data_points_refused_total = 0
        self.bad_requests_total = 0

    @property
    def spans_dropped_total(self) -> int:
        """Spans acknowledged (200) and lost afterwards: logged exports whose rows the store
        refused for their data (should not happen: rows are validated at decode). Exports
        committed before their 200 are never lost after it, so without the span log: 0."""
        return self.span_sink.refused_spans_total

    def _open_span_sink(self, settings: Settings) -> SpanSink:
        """The span log in ``settings.span_log_dir`` or the chDB folder; a
        :class:`DirectSpanSink` (every export inserted before its 200) when the log is off,
        for a ClickHouse server without a folder, or when the folder is unusable."""
        direct = DirectSpanSink(self.ingest, on_committed=self.assembler.note_spans)
        self.span_log_state = "off"  # /healthz: "on", "off", or why the log is unusable
        if not settings.span_log:
            return direct
        if settings.span_log_dir:
            folder = Path(settings.span_log_dir)
        elif self.store.url.kind == "chdb" and self.store.url.path is not None:
            folder = self.store.url.path / SPAN_LOG_FOLDER_NAME
        else:
            return direct
        try:
            log = SpanLog(folder)
        except (OSError, sqlite3.Error) as exc:
            logger.warning(
                "span log %s unusable (%s); inserting every export before its 200 (exports it holds wait"
                " for a start that can open it)",
                folder,
                exc,
            )
            self.span_log_state = f"unusable ({folder}: {exc}); inserting every export before its 200"
            return direct
        self.span_log_state = "on"
        return LoggedSpanIngest(
            self.ingest,
            log,
            on_committed=self.assembler.note_spans,
            oldest_unix_ns=lambda: self.oldest_storable_unix_ns("otel_traces"),
            max_backlog_bytes=settings.span_log_max_backlog_bytes,
        )

    def oldest_storable_unix_ns(self, table: str) -> int:
        """Unix ns before which ``table``'s TTL drops a row at insert (0: no TTL found).

        Read from the table's DDL in ``system.tables`` (what ClickHouse applies), cached per
        table; the receiver rejects older items with a reason instead of a silent drop.
        """
        days = self._ttl_days_by_table.get(table)
        if days is None:
            days = 0
            try:
                rows = self.store.query(
                    "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = {table:String}",
                    {"db": self.store.database, "table": table},
                )
                match = re.search(r"toIntervalDay\((\d+)\)", rows[0][0]) if rows else None
                days = int(match.group(1)) if match else 0
            except Exception as exc:  # noqa: BLE001 - unknown TTL: reject nothing for age
                logger.warning("could not read the TTL of %s: %s", table, exc)
                return 0
            self._ttl_days_by_table[table] = days
        if not days:
            return 0
        return time.time_ns() - days * 86_400 * 1_000_000_000

    def start(self) -> None:
        """Start the assembler thread and the scrape loop; repair the trace-id bounds and
        re-note the traces a crash left unassembled (both over the recovery window)."""
        try:
            repaired = repair_trace_id_index(self.store, window_seconds=RECOVERY_WINDOW_SECONDS)
            if repaired:
                logger.warning(
                    "restored the trace-id bounds of %d traces an interrupted insert left without them", repaired
                )
        except Exception as exc:  # noqa: BLE001 - a repair failure must not stop the server
            logger.warning("could not check the trace-id bounds of recent traces: %s", exc)
        self.assembler.recover()
        self.assembler.start()
        self.span_sink.start()
        self.scrape_loop.start()
        self.rollups.start()
        self.allocator_release.start()
        gauge_rollup.backfill_quietly(self.store)  # gauges stored before schema 011 (storage/gauge_rollup.py)
        for service in self.services.values():
            service.start(self.store, self.settings)

    def refresh_rollups(self) -> RefreshResult:
        """Bring the per-minute request and hop rollups up to date now (the thread does it
        every ``rollup_interval_seconds``); raises what the store raises."""
        return self.rollups.refresh_now()

    # ------------------------------------------------------------------ ingest
    def ingest_spans(
        self,
        decoded: DecodedSpans,
        dedup_token: str,
        body: bytes,
        content_type: str | None = None,
        content_encoding: str | None = None,
    ) -> CommitResult:
        """Keep decoded spans durably through :attr:`span_sink`; the sink hands them to the
        assembler once they are in ``otel_traces``.

        ``dedup_token`` (see :func:`~inferpath.server.ingest.dedup_token`) makes a retried
        export a no-op; ``body`` (``content_type``/``content_encoding`` as received) is what
        the span log records. Returns the :class:`CommitResult` (not ``ok``: nothing was
        kept, the client retries). Never raises.
        """
        result = self.span_sink.accept(decoded.spans, dedup_token, body, content_type, content_encoding)
        count = len(decoded.spans)
        with self._lock:
            self.spans_rejected_total += decoded.rejected_spans
            self.spans_warned_total += decoded.warned_spans
            if result.ok:
                self.spans_received_total += count
                if result.duplicate:
                    self.spans_duplicate_total += count
            else:
                self.spans_refused_total += count
        return result

    def ingest_metrics(self, decoded: DecodedMetrics, dedup_token: str | None = None) -> CommitResult:
        """Commit decoded gauge/sum/histogram rows (one insert per table); see :meth:`ingest_spans`."""
        result = self.ingest.commit(
            [
                TableRows("otel_metrics_gauge", GAUGE_COLUMNS, [r.to_insert_row() for r in decoded.gauges]),
                TableRows("otel_metrics_sum", SUM_COLUMNS, [r.to_insert_row() for r in decoded.sums]),
                TableRows("otel_metrics_histogram", HISTOGRAM_COLUMNS, [r.to_insert_row() for r in decoded.histograms]),
            ],
            dedup_token,
        )
        kept = decoded.data_points if result.ok else 0
        with self._lock:
            self.data_points_rejected_total += decoded.rejected_data_points
            self.data_points_received_total += kept
            self.data_points_refused_total += decoded.data_points - kept
        return result

    def count_bad_request(self) -> None:
        """Count one malformed, oversized or unsupported OTLP request."""
        with self._lock:
            self.bad_requests_total += 1

    # ------------------------------------------------------------------ flush / close
    def flush(self, timeout_seconds: float = 30.0) -> dict:
        """Insert everything accepted so far, assemble every noted trace, insert those rows.

        Returns ``{"ok": bool, "spans_inserted_total", "data_points_inserted_total",
        "requests_inserted_total", "pending_traces"}`` (``spans_inserted_total``: spans this
        process inserted, those it recovered from the span log at start-up included, retried
        exports not); ``ok`` is False on timeout or when
        an insert, the assembly or the rollup pass failed. The forced assembly pass and the
        rollup pass run on worker threads and are waited for only until ``timeout_seconds``
        (they go on after a timeout).
        """
        deadline = time.monotonic() + timeout_seconds
        left = lambda: max(0.1, deadline - time.monotonic())  # noqa: E731
        ok = True
        ok = self.span_sink.flush(left())  # logged spans into otel_traces (and noted) first
        for table, writer in self.writers.items():
            if table != REQUESTS_TABLE:
                ok = writer.flush(left()) and ok
        ok = self._flush_assembly.run(left()) and ok
        ok = self.writers[REQUESTS_TABLE].flush(left()) and ok
        # Wide-window reads see re-derived rows of old minutes now, not a pass later; a slow
        # pass (minutes over days of traces) must not hold the answer past the timeout.
        ok = self._flush_rollups.run(left()) and ok
        return {
            "ok": ok,
            # Exports are committed (inserted or logged) before their 200; after the log's
            # flush above, its drainer inserted all it will (recovered spans included).
            "spans_inserted_total": self.span_sink.inserted_spans_total,
            "data_points_inserted_total": self.data_points_received_total
            + sum(self.writers[t].rows_inserted_total for t in ("otel_metrics_gauge", "otel_metrics_sum")),
            "requests_inserted_total": self.writers[REQUESTS_TABLE].rows_inserted_total,
            "pending_traces": self.assembler.pending_traces,
        }

    def close(self, timeout_seconds: float = 30.0) -> None:
        """Stop the loops, flush every writer, close the store. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        started = time.monotonic()
        backlog = self.span_sink.backlog_spans
        pending = self.assembler.pending_traces
        if backlog or pending:  # the work that can make a stop take seconds, said before it starts
            logger.info(
                "stopping: inserting %d spans still in the span log, assembling %d pending traces", backlog, pending
            )
        self.scrape_loop.stop()
        self.allocator_release.stop()
        self.rollups.stop(timeout_seconds)
        for service in self.services.values():
            service.stop(timeout_seconds)
        self.span_sink.close(timeout_seconds)  # drain the log; what the store refuses stays in it
        try:
            self.assembler.stop(timeout_seconds)  # final forced pass; flushes spans first
        finally:
            for writer in self.writers.values():
                writer.close(timeout_seconds)
            self.store.close()
            if backlog or pending:
                logger.info("stopped in %.1f s", time.monotonic() - started)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed


def tune_gc_for_server() -> None:
    """Collector settings for a process that is (mostly) the server, called once it started:
    start-up objects frozen out of the scans, young collections every 100 000 net
    allocations instead of 700. Ingest allocates many short-lived objects per span and holds
    spans for seconds; with the defaults the server spent ~40 % more CPU per span
    (bench/README.md, server_ingest). Cycles are still collected, later."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 20, 10)


class StoreOpenError(RuntimeError):
    """The store could not be opened (or migrated) at start: ``str()`` is one sentence naming
    the store (its password hidden) and why (:func:`~inferpath.storage.url.store_open_failure`),
    and for an embedded chDB folder another process holds, that it does."""

    def __init__(self, store_url: str | None, cause: Exception) -> None:
        from inferpath.storage.store import chdb_folder_in_use
        from inferpath.storage.url import parse_store_url

        message = store_open_failure(store_url, cause)
        try:
            parsed = parse_store_url(store_url) if store_url else None
        except ValueError:
            parsed = None
        if parsed is not None and parsed.kind == "chdb" and parsed.path is not None and chdb_folder_in_use(parsed.path):
            message = (
                f"the store at {parsed.path} is in use by another process (an inferpath up or demo?): "
                "stop it, or give this server another --store"
            )
        super().__init__(message)


class ListenError(OSError):
    """The server's address could not be bound: ``str()`` says which address, why, and what
    to try (another port when it is taken, another host when it is not this machine's)."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        reason = cause.strerror or str(cause)
        if cause.errno == errno.EADDRINUSE:
            hint = "is another inferpath server running? choose another with --port"
        elif isinstance(cause, socket.gaierror) or cause.errno == errno.EADDRNOTAVAIL:
            hint = "the host must be a name or address of this machine: see --host or INFERPATH_HOST"
        elif cause.errno == errno.EACCES:
            hint = "ports below 1024 need privileges; choose another with --port"
        else:
            hint = "check --host and --port"
        super().__init__(cause.errno, f"cannot listen on {host}:{port}: {reason} ({hint})")


_LISTEN_BACKLOG = 2048  # uvicorn's default


def _bind(host: str, port: int, *, listen: bool = True) -> socket.socket:
    try:
        return _bind_socket(host, port, listen=listen)
    except OSError as exc:
        raise ListenError(host, port, exc) from exc


def _bind_socket(host: str, port: int, *, listen: bool = True) -> socket.socket:
    """A TCP socket bound to ``host:port`` and, unless ``listen`` is False, listening. Bound
    only, it already holds the address (a port another server listens on fails here, with
    ``EADDRINUSE``) while connections are still refused; ``listen`` later."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket says it is TCP; without it every keep-alive response waits ~40 ms
    # for the delayed ACK of its header segment (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.set_inheritable(True)
        if listen:
            _listen(sock)
    except BaseException:
        sock.close()
        raise
    return sock


def _listen(sock: socket.socket) -> None:
    # Listening from here on (uvicorn's backlog; its own listen() later keeps it): the port
    # is logged before uvicorn starts accepting, and a client that connects in between
    # waits in the backlog instead of being refused.
    sock.listen(_LISTEN_BACKLOG)


def _uvicorn_server(app, settings: Settings):
    import uvicorn

    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="warning", lifespan="off", access_log=False
    )
    return uvicorn.Server(config)


@dataclass
class RunningServer:
    """A server running in a background thread: ``url`` (``http://host:port``, the real port
    when 0 was asked for), ``runtime``, ``port``. :meth:`stop` shuts it down gracefully."""

    url: str
    port: int
    runtime: ServerRuntime
    _server: object
    _thread: threading.Thread

    def stop(self, timeout_seconds: float = 30.0) -> None:
        """Stop accepting HTTP, then flush and close the runtime (closing the store)."""
        self._server.should_exit = True  # type: ignore[attr-defined]
        self._thread.join(timeout_seconds)
        self.runtime.close(timeout_seconds)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(
    settings: Settings, *, port: int | None = None, services: Sequence[BackgroundService] = ()
) -> RunningServer:
    """Start the server (runtime + HTTP) on ``settings.host:settings.port`` in a daemon thread.

    ``port`` overrides ``settings.port``; 0 picks a free port (``Settings`` itself only
    admits 1..65535). ``services``: see :class:`ServerRuntime`. The socket is bound here, so ``.url``/``.port`` are final on return.
    Returns once uvicorn accepts connections; raises ``RuntimeError`` if it does not within
    30 s, and what binding (:class:`ListenError`, before the store is opened) or
    :class:`ServerRuntime` raises.
    """
    listen_port = settings.port if port is None else int(port)
    if not 0 <= listen_port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {listen_port}")
    # The address first: a taken port or a bad host leaves no store folder behind.
    sock = _bind(settings.host, listen_port)
    try:
        runtime = ServerRuntime(settings, services)
    except BaseException:
        sock.close()
        raise
    runtime.start()
    server = _uvicorn_server(create_app(runtime), settings)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="inferpath-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + _STARTUP_TIMEOUT_SECONDS
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(5.0)
            runtime.close()
            sock.close()
            raise RuntimeError(f"inferpath server did not start on {settings.host}:{listen_port}")
        time.sleep(0.02)
    bound_port = sock.getsockname()[1]
    shown_host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return RunningServer(
        url=f"http://{shown_host}:{bound_port}", port=bound_port, runtime=runtime, _server=server, _thread=thread
    )


class _Terminated(Exception):
    """SIGTERM re-raised by uvicorn after its graceful shutdown."""


def serve_forever(settings: Settings, services: Sequence[BackgroundService] = ()) -> None:
    """Run the server in the foreground until SIGINT/SIGTERM, then flush and close.
    ``services``: see :class:`ServerRuntime`.

    uvicorn shuts HTTP down gracefully and then re-raises the signal it caught; both are
    turned into a normal return here so the runtime is always flushed and the store closed.
    """
    import signal

    def _terminated(signum: int, frame: object) -> None:
        raise _Terminated()

    cap_c_heap_arenas()  # before the runtime starts its threads

    # Bound here, as in serve_in_thread: the listening socket says it is TCP (so replies are
    # not held back by Nagle), and the log names the real port when 0 was asked for. Bound
    # before the store opens, so that a taken port stops the start before a store folder is
    # made or migrated; listening only once the store is open.
    sock = _bind(settings.host, settings.port, listen=False)
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        runtime = ServerRuntime(settings, services)
    except Exception as exc:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        raise StoreOpenError(settings.store_url, exc) from exc
    try:
        try:
            _listen(sock)  # fails only if another server bound the port meanwhile
        except OSError as exc:
            raise ListenError(settings.host, settings.port, exc) from exc
        runtime.start()
        tune_gc_for_server()
        server = _uvicorn_server(create_app(runtime), settings)
        shown_host = f"[{settings.host}]" if ":" in settings.host else settings.host
        logger.info(
            "inferpath server listening on http://%s:%d (store %s)",
            shown_host,
            sock.getsockname()[1],
            runtime.store.url,
        )
        server.run(sockets=[sock])
    except (KeyboardInterrupt, _Terminated):
        pass
    finally:
        sock.close()
        runtime.close()
        signal.signal(signal.SIGTERM, previous)
        logger.info("inferpath server stopped; store %s closed", runtime.store.url)
