"""Versioned schema migrations: ``storage/schema/NNN_name.sql`` applied in order, once each.

The files are read by :mod:`.schema_files` (statements, placeholders ``{database}`` and
``{ttl_days}``); a store URL with ``?cluster=`` gets their cluster form (:mod:`.cluster`).
Applied versions are recorded in
``inferpath_schema_migrations``; every statement is ``IF NOT EXISTS``, so two processes
migrating the same ClickHouse at once (server replicas) do no harm.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from inferpath.storage.cluster import migration_cluster_statements
from inferpath.storage.schema_files import SCHEMA_DIR, Migration, created_table, load_migrations, validate_ttl_days
from inferpath.storage.url import validate_identifier

if TYPE_CHECKING:  # pragma: no cover
    from inferpath.storage.store import Store

MIGRATIONS_TABLE = "inferpath_schema_migrations"


def applied_versions(store: Store) -> set[int]:
    """Versions recorded in ``inferpath_schema_migrations`` of the store's database."""
    rows = store.query(f"SELECT DISTINCT version FROM `{store.database}`.{MIGRATIONS_TABLE}")
    return {int(r[0]) for r in rows}


def apply_migrations(
    store: Store, ttl_days: int, schema_dir: Path = SCHEMA_DIR, ttl_days_by_table: Mapping[str, int] | None = None
) -> list[int]:
    """Create the database and apply every migration not yet recorded; return their versions.

    ``ttl_days_by_table`` overrides ``ttl_days`` for the tables it names (when they are
    created). For a store URL with ``?cluster=NAME`` the cluster form of each file is applied
    (:mod:`inferpath.storage.cluster`); the version record stays on the node migrated, and
    re-applying on another node is harmless (every statement is idempotent).
    Idempotent: a second call applies nothing and returns ``[]``.
    """
    database = validate_identifier(store.database)
    validate_ttl_days(ttl_days)
    store.command(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    store.command(
        f"CREATE TABLE IF NOT EXISTS `{database}`.{MIGRATIONS_TABLE} ("
        " version UInt32, name String, checksum String, ttl_days UInt32,"
        " applied_at DateTime64(9, 'UTC')"
        ") ENGINE = ReplacingMergeTree(applied_at) ORDER BY version"
    )
    done = applied_versions(store)
    pending = [m for m in load_migrations(schema_dir) if m.version not in done]
    cluster = getattr(store.url, "cluster", None)
    if store.url.kind == "chdb" and pending:
        # Embedded chDB runs a multi-statement query in one call (~40 ms for a fresh store
        # instead of ~10 ms per statement); the records are written once all succeeded.
        statements = [s for m in pending for s in m.statements(database, ttl_days, ttl_days_by_table)]
        store.command(";\n".join(statements))
        _record(store, database, pending, ttl_days)
        return [m.version for m in pending]
    for migration in pending:
        if cluster:
            statements = migration_cluster_statements(migration, cluster, database, ttl_days, ttl_days_by_table)
        else:
            statements = migration.statements(database, ttl_days, ttl_days_by_table)
        for statement in statements:
            store.command(statement)
        _record(store, database, [migration], ttl_days)
    return [m.version for m in pending]


def _record(store: Store, database: str, migrations: list[Migration], ttl_days: int) -> None:
    """One record per applied migration in ``inferpath_schema_migrations``, in one insert."""
    now = datetime.now(timezone.utc)
    store.insert(
        f"{database}.{MIGRATIONS_TABLE}",
        [(m.version, m.name, m.checksum, ttl_days, now) for m in migrations],
        ["version", "name", "checksum", "ttl_days", "applied_at"],
    )


_TTL_CLAUSE = re.compile(r"^TTL\s+(.+?)\s*\+\s*toIntervalDay\(\{ttl_days\}\)\s*$", re.MULTILINE)


def table_ttl_expressions(schema_dir: Path = SCHEMA_DIR) -> dict[str, str]:
    """Table → the time expression its TTL counts from (e.g. ``toDateTime(Timestamp)``),
    read from the ``CREATE TABLE`` statements of the schema files."""
    out: dict[str, str] = {}
    for migration in load_migrations(schema_dir):
        for raw in migration.raw_statements():
            table = created_table(raw)
            match = _TTL_CLAUSE.search(raw) if table else None
            if table and match:
                out[table] = match.group(1).strip()
    return out


def set_table_ttl(store: Store, table: str, ttl_days: int, schema_dir: Path = SCHEMA_DIR) -> None:
    """Change the TTL of an existing ``table`` to ``ttl_days`` (``ALTER TABLE … MODIFY TTL``).

    ClickHouse re-applies the new TTL to existing parts in the background. Raises
    ``ValueError`` for a bad TTL or a table without a TTL in the schema files.
    """
    validate_ttl_days(ttl_days)
    expressions = table_ttl_expressions(schema_dir)
    if table not in expressions:
        raise ValueError(f"table must be one of {sorted(expressions)}, got {table!r}")
    database = validate_identifier(store.database)
    store.command(f"ALTER TABLE `{database}`.{table} MODIFY TTL {expressions[table]} + toIntervalDay({int(ttl_days)})")
