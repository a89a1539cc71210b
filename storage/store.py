"""The one handle to ClickHouse (embedded chDB or a server) used by every inferpath part.

Both backends go through clickhouse-connect with the same SQL. Differences are settled here:

- Time: the session runs with ``session_timezone='UTC'`` and the client formats and decodes
  datetimes as UTC, so ``toDate``/``toStartOfInterval`` and every returned datetime are UTC
  whatever the host's ``TZ`` is. Results come back timezone-aware (UTC). Naive datetimes
  passed in, as insert values or query parameters, are refused (``ValueError``) instead of
  being read in some implicit zone.
- Values: every inserted value goes through one converter for its column's type
  (``values.py``): NaN and NA become NULL, numeric text a number, and a row that cannot be
  stored is named, never half-written by the driver.
- Concurrency: each call runs on a connection of its own. Embedded chDB is one engine per
  process that serves any number of connection handles at once, so the store keeps a small
  pool of them (:data:`CHDB_MAX_CONNECTIONS`, opened as calls overlap): an insert does not
  wait for a rollup pass or a read that another thread runs (with one shared handle, the
  span-log drainer waited behind every statement of every other thread: 60 % of the wall
  time of a 20k spans/s soak went to one holder or another, see ``bench/README.md``,
  ``server_soak.py``). A ClickHouse server keeps one connection, serialized (its session
  state stays simple). ``_lock`` is taken briefly by each call to get its connection, so a
  thread holding it pauses the store (tests use that to make the store "slow").
- chDB allows one data path per process: opening a second path while a store on another
  path is open raises ``RuntimeError``; closing and reopening the same path is fine.
"""

from __future__ import annotations

import errno
import logging
import operator
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from inferpath.storage.migrations import apply_migrations, validate_ttl_days
from inferpath.storage.url import StoreURL, default_store_url, parse_store_url
from inferpath.storage.values import Rejection, RowsRejected, convert_columns

logger = logging.getLogger(__name__)

_TABLE_NAME = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*\.)?[A-Za-z_][A-Za-z0-9_]*$")
_COLUMN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?$")
_SESSION_SETTINGS = {"session_timezone": "UTC"}

# chDB: data path -> number of open Store objects on it (one path per process).
_open_chdb_paths: dict[str, int] = {}
_open_chdb_lock = threading.Lock()


def chdb_folder_in_use(path: str | os.PathLike[str]) -> bool:
    """True when another process has the embedded chDB store in ``path`` open, so that
    opening it here would fail (chDB then only says "Error initializing EmbeddedServer" and
    prints "Cannot lock file …/status. Another server instance …" (Code 76) to stderr).

    chDB holds an exclusive ``flock`` on the folder's ``status`` file while the store is
    open; this tries to take it for a moment. False when there is no such file, nothing
    holds it, this process itself has the store open, or the platform has no ``flock``.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: let the open say what it says
        return False
    folder = Path(path)
    with _open_chdb_lock:
        if _open_chdb_paths.get(str(folder.resolve()), 0) > 0:
            return False  # this process holds the lock itself
    try:
        fd = os.open(folder / "status", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


CHDB_MAX_CONNECTIONS = 8
"""Connections a chDB store opens at most (lazily, one per overlapping call): the ingest
drainer, the assembler, the writers, the rollup refresher, the read API and the scrape
loop each hold one during a statement; a ninth caller waits for one to come back."""


def validate_table_name(table: str) -> str:
    """Return ``table`` if it is ``name`` or ``database.name`` made of plain identifiers.

    Raises ``ValueError`` naming the table otherwise (table names are placed into SQL).
    """
    if not isinstance(table, str) or not _TABLE_NAME.match(table):
        raise ValueError(f"table name must be an identifier (optionally database.table), got {table!r}")
    return table


def _column_names(column_names: Sequence[str]) -> list[str]:
    """``column_names`` as a list; raises ``ValueError`` for a name that is not an
    identifier (or ``Nested.field``)."""
    names = list(column_names)
    for name in names:
        if not isinstance(name, str) or not _COLUMN_NAME.match(name):
            raise ValueError(f"column name must be an identifier (or Nested.field), got {name!r}")
    return names


def _check_value(value: Any, where: str) -> None:
    """Raise ``ValueError`` for a naive datetime at any depth of lists/tuples/dicts (query
    parameters; inserted values go through ``values.convert_columns``)."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"{where} is a naive datetime {value!r}; pass a timezone-aware datetime")
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_value(item, where)
    elif isinstance(value, dict):
        for item in value.values():
            _check_value(item, where)


def _to_utc(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            # Only reachable if a driver ever decodes a zone-less column without our UTC
            # setting; the session is UTC, so the wall time is UTC.
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)
    if isinstance(value, list):
        return [_to_utc(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_utc(v) for v in value)
    return value


class Store:
    """A connection to inferpath's ClickHouse database with migrations applied.

    Use :meth:`open`. Attributes: ``url`` (:class:`StoreURL`, ``str()`` is safe to log),
    ``database`` (str), ``ttl_days`` (int). Thread-safe; usable as a context manager.
    """

    def __init__(self, url: StoreURL, client: Any, ttl_days: int) -> None:
        self.url = url
        self.database = url.database
        self.ttl_days = ttl_days
        self._client = client  # the first connection (migrations, and benchmarks' raw inserts)
        self._lock = threading.RLock()  # held to take a connection; holding it pauses the store
        self._closed = False
        self._max_connections = CHDB_MAX_CONNECTIONS if url.kind == "chdb" else 1
        self._connections = [client]  # every open connection, idle or in use
        self._idle = [client]
        self._returned = threading.Condition(threading.Lock())  # a connection came back
        self._client_settings: dict[str, Any] = {}
        self._client_database: str | None = None

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(
        cls, url: str | None = None, *, ttl_days: int = 30, ttl_days_by_table: Mapping[str, int] | None = None
    ) -> Store:
        """Connect to the store at ``url`` (default :func:`default_store_url`) and migrate it.

        For chDB the data folder is created if missing. ``ttl_days`` (1..3650) sets the TTL
        of tables created by this call, ``ttl_days_by_table`` (table → days) per table;
        existing tables keep theirs (see :func:`~inferpath.storage.migrations.set_table_ttl`).
        Raises ``ValueError`` for a bad URL or TTL, ``RuntimeError`` when another chDB path
        is already open in this process, and the driver's errors when ClickHouse refuses.
        """
        validate_ttl_days(ttl_days)
        for days in (ttl_days_by_table or {}).values():
            validate_ttl_days(days)
        parsed = parse_store_url(url if url else default_store_url())
        if parsed.kind == "chdb":
            client = cls._connect_chdb(parsed)
        else:
            client = cls._connect_http(parsed)
        store = cls(parsed, client, ttl_days)
        try:
            applied = apply_migrations(store, ttl_days, ttl_days_by_table=ttl_days_by_table)
            # Queries from every part use unqualified table names.
            store._client_database = parsed.database
            store._client_settings = {
                # inferpath_requests has hourly partitions: a batch of request rows of an
                # imported trace file may span more than the default 100 of them.
                "max_partitions_per_insert_block": 10_000,
                # FINAL merges versions of a row inside its partition only, so a time-window
                # read with FINAL prunes partitions (else ClickHouse reads every partition,
                # the WHERE applying after the merge). Versions of a request share their
                # partition unless a late span moved its start across an hour boundary.
                "do_not_merge_across_partitions_select_final": 1,
            }
            with store._lock:
                store._configure(client)
        except BaseException:
            store.close()
            raise
        if applied:
            logger.info("store %s: applied schema versions %s", parsed, applied)
        return store

    @staticmethod
    def _connect_chdb(parsed: StoreURL) -> Any:
        import clickhouse_connect

        assert parsed.path is not None
        if parsed.path.exists() and not parsed.path.is_dir():
            raise ValueError(f"chdb store path exists and is not a folder: {parsed.path}")
        parsed.path.mkdir(parents=True, exist_ok=True)
        key = str(parsed.path.resolve())
        with _open_chdb_lock:
            others = [p for p, n in _open_chdb_paths.items() if n > 0 and p != key]
            if others:
                raise RuntimeError(
                    f"chDB allows one data folder per process and {others[0]} is open; "
                    f"close that store before opening {key}"
                )
            client = clickhouse_connect.get_client(
                dsn=f"chdb://{key}", settings=dict(_SESSION_SETTINGS), tz_mode="aware"
            )
            _open_chdb_paths[key] = _open_chdb_paths.get(key, 0) + 1
        # chDB reports the host process's zone as the server zone, but the session zone
        # above is UTC: make the client format parameters and decode values as UTC too.
        client.server_tz = timezone.utc
        return client

    @staticmethod
    def _connect_chdb_again(parsed: StoreURL) -> Any:
        """Another connection handle to the engine of an already open chDB path."""
        import clickhouse_connect

        assert parsed.path is not None
        client = clickhouse_connect.get_client(
            dsn=f"chdb://{parsed.path.resolve()}", settings=dict(_SESSION_SETTINGS), tz_mode="aware"
        )
        client.server_tz = timezone.utc
        return client

    def _configure(self, client: Any) -> None:
        """Give ``client`` the database and client settings every connection of this store has."""
        if self._client_database is not None:
            client.database = self._client_database
        for name, value in self._client_settings.items():
            client.set_client_setting(name, value)

    @staticmethod
    def _connect_http(parsed: StoreURL) -> Any:
        import clickhouse_connect

        client = clickhouse_connect.get_client(
            host=parsed.host,
            port=parsed.port,
            username=parsed.username,
            password=parsed.password or "",
            secure=parsed.secure,
            settings=dict(_SESSION_SETTINGS),
            tz_mode="aware",
        )
        client.server_tz = timezone.utc
        return client

    def close(self) -> None:
        """Close the connections (after the calls in progress end); idempotent. A chDB path
        can be reopened afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            with self._returned:
                while len(self._idle) < len(self._connections):
                    self._returned.wait()
                connections, self._connections, self._idle = self._connections, [], []
            try:
                for client in connections:
                    client.close()
            finally:
                if self.url.kind == "chdb" and self.url.path is not None:
                    key = str(self.url.path.resolve())
                    with _open_chdb_lock:
                        left = _open_chdb_paths.get(key, 0) - 1
                        if left > 0:
                            _open_chdb_paths[key] = left
                        else:
                            _open_chdb_paths.pop(key, None)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.url)!r}, closed={self._closed})"

    # ------------------------------------------------------------------ calls
    def _ensure_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"store {self.url} is closed")

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        """An idle connection for one call (a new one while under the bound, else the next
        to come back); raises ``RuntimeError`` when the store is closed."""
        with self._lock:
            self._ensure_open()
            with self._returned:
                while not self._idle and len(self._connections) >= self._max_connections:
                    self._returned.wait()
                client = self._idle.pop() if self._idle else None
                if client is None:
                    self._connections.append(None)  # the slot, taken before connecting
            if client is None:
                try:
                    client = self._connect_chdb_again(self.url)
                    self._configure(client)
                except BaseException:
                    with self._returned:
                        self._connections.remove(None)
                        self._returned.notify()
                    raise
                with self._returned:
                    self._connections[self._connections.index(None)] = client
        try:
            yield client
        finally:
            with self._returned:
                self._idle.append(client)
                self._returned.notify()

    @staticmethod
    def _check_parameters(parameters: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if parameters is None:
            return None
        if not isinstance(parameters, Mapping):
            raise ValueError("parameters must be a dict of name -> value")
        for name, value in parameters.items():
            _check_value(value, f"parameter {name!r}")
        return dict(parameters)

    def insert(
        self,
        table: str,
        rows: Sequence[Sequence[Any]],
        column_names: Sequence[str],
        *,
        dedup_token: str | None = None,
        checked: bool = False,
        rejected: list[Rejection] | None = None,
    ) -> int:
        """Insert ``rows`` (each a sequence in ``column_names`` order) into ``table``.

        Every value goes through :func:`~inferpath.storage.values.convert_columns`, the one
        converter into storage, for its column's type: NaN and ``pandas.NA`` become NULL,
        numeric text and NumPy values numbers, and so on (rules in ``storage/values.py``).
        A row that cannot be stored (a naive datetime, text that is not a number in a number
        column, a missing value in a non-Nullable column, the wrong number of values) is
        rejected by row index, column and reason: with ``rejected=None`` (default) the call
        raises :class:`~inferpath.storage.values.RowsRejected` (a ``ValueError``) and inserts
        nothing; with a list, the :class:`~inferpath.storage.values.Rejection` of each is
        appended to it and every other row is inserted.
        ``dedup_token``: ClickHouse ``insert_deduplication_token``; a later insert with the
        same token into the same table is skipped by ClickHouse (tables created with a
        deduplication window, see ``schema/005_insert_dedup.sql``), so a client's retry of
        an insert that did commit stores nothing twice.
        ``checked``: the caller built every value itself from checked ones (the OTLP
        decoder's span rows: times are aware UTC or ns ints by construction), so the
        conversion is skipped; its scan costs ~0.9 µs per 22-column span row on the ingest path.
        Returns the number of rows inserted. Raises ``ValueError`` for a bad table or column
        name; driver errors propagate.
        """
        validate_table_name(table)
        names = _column_names(column_names)
        if not rows:
            return 0
        width, total_rows = len(names), len(rows)
        rejections: list[Rejection] = []
        if set(map(len, rows)) != {width}:
            rejections = [
                Rejection(i, None, f"has {len(row)} values for {width} columns")
                for i, row in enumerate(rows)
                if len(row) != width
            ]
            if rejected is None:
                raise RowsRejected(rejections, total_rows)
            wrong = {r.row for r in rejections}
            kept_index = [i for i in range(len(rows)) if i not in wrong]
            rows = [rows[i] for i in kept_index]
        else:
            kept_index = None
        settings = None if dedup_token is None else {"insert_deduplication_token": str(dedup_token)}
        # Converted and sent column by column: the transposition and the type scans run in C,
        # and clickhouse-connect serializes columns without transposing rows itself.
        columns: list = list(zip(*rows))
        try:
            with self._connection() as client:
                context = client.create_insert_context(
                    table, column_names=names, column_oriented=True, settings=settings
                )
                try:
                    if not checked:
                        columns, found = convert_columns(columns, names, context.column_types)
                        if found and kept_index is not None:  # back to the caller's row numbers
                            found = [Rejection(kept_index[r.row], r.column, r.reason) for r in found]
                        rejections.extend(found)
                        if rejections and rejected is None:
                            raise RowsRejected(sorted(rejections, key=_row_of), total_rows)
                    if rejected is not None:
                        rejected.extend(sorted(rejections, key=_row_of))
                    inserted = len(columns[0]) if columns else 0
                    if inserted:
                        client.insert(data=columns, context=context)
                finally:
                    _untie_insert_context(context)
        finally:
            columns.clear()  # should another cycle hold the context, it holds no rows
        return inserted

    def query(self, sql: str, parameters: dict | None = None) -> list[tuple]:
        """Run a SELECT with server-side bound ``parameters`` (``{name:Type}`` placeholders).

        Returns rows as tuples; datetimes (also inside arrays) are timezone-aware UTC.
        Raises ``ValueError`` for naive datetime parameters; driver errors propagate.
        """
        return self._query(sql, parameters)[1]

    def query_dicts(self, sql: str, parameters: dict | None = None) -> list[dict]:
        """Like :meth:`query`, each row as a dict keyed by column name."""
        names, rows = self._query(sql, parameters)
        return [dict(zip(names, row)) for row in rows]

    def _query(self, sql: str, parameters: dict | None) -> tuple[tuple[str, ...], list[tuple]]:
        params = self._check_parameters(parameters)
        with self._connection() as client:
            result = client.query(sql, parameters=params)
            names = tuple(result.column_names)
            types = [t.name for t in result.column_types]
            rows = result.result_rows
        time_columns = [i for i, t in enumerate(types) if "DateTime" in t]
        if not time_columns:
            return names, [tuple(r) for r in rows]
        out = []
        for row in rows:
            values = list(row)
            for i in time_columns:
                values[i] = _to_utc(values[i])
            out.append(tuple(values))
        return names, out

    def command(self, sql: str, parameters: dict | None = None) -> Any:
        """Run DDL or another statement that returns no rows; returns the driver's summary."""
        params = self._check_parameters(parameters)
        with self._connection() as client:
            return client.command(sql, parameters=params)

    def table_columns(self, table: str) -> list[tuple[str, str]]:
        """``(name, type)`` of each column of ``table`` in this database, in table order."""
        validate_table_name(table)
        return [
            (name, type_)
            for name, type_ in self.query(
                "SELECT name, type FROM system.columns"
                " WHERE database = {db:String} AND table = {table:String} ORDER BY position",
                {"db": self.database, "table": table},
            )
        ]


_row_of = operator.attrgetter("row")


def _untie_insert_context(context: Any) -> None:
    """Break the reference cycle of a used clickhouse-connect ``InsertContext``: given data,
    it keeps a bound method of itself (``_next_block_data``), so the context and every row
    it holds wait for Python's cycle collector, which reaches a long-lived context only in
    a full collection. Without the method, reference counting frees them as the insert
    returns (``tests/storage/test_storage_store.py`` asserts that an insert leaves
    no cyclic garbage, so a driver upgrade that adds another cycle is caught)."""
    getattr(context, "__dict__", {}).pop("_next_block_data", None)


def ensure_aware(value: datetime, name: str) -> datetime:
    """Return ``value`` converted to UTC; raise ``ValueError`` naming ``name`` if naive."""
    if not isinstance(value, datetime):
        raise ValueError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got naive {value!r}")
    return value.astimezone(timezone.utc)


__all__ = ["Store", "chdb_folder_in_use", "ensure_aware", "validate_table_name"]
