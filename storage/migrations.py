"""Versioned schema migrations: ``storage/schema/NNN_name.sql`` applied in order, once each.

A migration file holds one or more statements separated by ``;`` at the end of a line.
Two placeholders are substituted, both validated first: ``{database}`` (identifier) and
``{ttl_days}`` (positive integer). Applied versions are recorded in
``inferpath_schema_migrations``; every statement is ``IF NOT EXISTS``, so two processes
migrating the same ClickHouse at once (server replicas) do no harm.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from hashlib import sha256
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from inferpath.storage.url import validate_identifier

if TYPE_CHECKING:  # pragma: no cover
    from inferpath.storage.store import Store

SCHEMA_DIR = Path(__file__).resolve().parent / "schema"
MIGRATIONS_TABLE = "inferpath_schema_migrations"
MAX_TTL_DAYS = 3650
_FILE_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
_STATEMENT_END = re.compile(r";[ \t]*(?:\n|$)")


@dataclass(frozen=True)
class Migration:
    """One schema file: ``version`` (from the ``NNN_`` prefix), ``name``, raw ``sql`` text."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """sha256 of the raw file text, recorded so a changed file can be noticed."""
        return sha256(self.sql.encode()).hexdigest()

    def statements(self, database: str, ttl_days: int,
                   ttl_days_by_table: Mapping[str, int] | None = None) -> list[str]:
        """The file's statements with placeholders filled; comments-only chunks dropped.

        ``ttl_days_by_table`` (table name → days) overrides ``ttl_days`` in the statement
        that creates that table. Raises ``ValueError`` for a bad database name or TTL.
        """
        validate_identifier(database)
        validate_ttl_days(ttl_days)
        overrides = {validate_identifier(t, "table"): validate_ttl_days(d)
                     for t, d in (ttl_days_by_table or {}).items()}
        out = []
        for raw in self.raw_statements():
            created = created_table(raw)
            days = overrides.get(created, ttl_days) if created else ttl_days
            out.append(raw.replace("{database}", database).replace("{ttl_days}", str(days)))
        return out

    def raw_statements(self) -> list[str]:
        """The file's statements with placeholders left in; comments-only chunks dropped."""
        # Whole-line comments go first so that a ';' ending a comment line splits nothing.
        code = "\n".join(
            line for line in self.sql.splitlines() if not line.lstrip().startswith("--")
        )
        return [chunk.strip() for chunk in _STATEMENT_END.split(code) if chunk.strip()]


_CREATE_TABLE = re.compile(r"^CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+`\{database\}`\.([A-Za-z_][A-Za-z0-9_]*)",
                           re.IGNORECASE)


def created_table(raw_statement: str) -> str | None:
    """The table a raw ``CREATE TABLE IF NOT EXISTS `{database}`.name`` statement creates, else None."""
    match = _CREATE_TABLE.match(raw_statement.strip())
    return match.group(1) if match else None


def validate_ttl_days(ttl_days: int) -> int:
    """Return ``ttl_days`` if it is an int in 1..3650, else raise ``ValueError`` naming it."""
    if isinstance(ttl_days, bool) or not isinstance(ttl_days, int) or not 1 <= ttl_days <= MAX_TTL_DAYS:
        raise ValueError(f"ttl_days must be an integer in 1..{MAX_TTL_DAYS}, got {ttl_days!r}")
    return ttl_days


def load_migrations(schema_dir: Path = SCHEMA_DIR) -> list[Migration]:
    """All migration files of ``schema_dir`` sorted by version.

    Raises ``ValueError`` for a ``.sql`` file with a malformed name or a duplicate version.
    """
    found: dict[int, Migration] = {}
    for path in sorted(schema_dir.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if not match:
            raise ValueError(f"schema file name must look like 001_name.sql: {path.name}")
        version = int(match.group(1))
        if version in found:
            raise ValueError(f"two schema files share version {version:03d}: {path.name}")
        found[version] = Migration(version, match.group(2), path.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


def applied_versions(store: "Store") -> set[int]:
    """Versions recorded in ``inferpath_schema_migrations`` of the store's database."""
    rows = store.query(f"SELECT DISTINCT version FROM `{store.database}`.{MIGRATIONS_TABLE}")
    return {int(r[0]) for r in rows}


def apply_migrations(store: "Store", ttl_days: int, schema_dir: Path = SCHEMA_DIR,
                     ttl_days_by_table: Mapping[str, int] | None = None) -> list[int]:
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
    newly_applied = []
    for migration in load_migrations(schema_dir):
        if migration.version in done:
            continue
        cluster = getattr(store.url, "cluster", None)
        if cluster:
            from inferpath.storage.cluster import migration_cluster_statements

            statements = migration_cluster_statements(migration, cluster, database, ttl_days, ttl_days_by_table)
        else:
            statements = migration.statements(database, ttl_days, ttl_days_by_table)
        for statement in statements:
            store.command(statement)
        store.insert(
            f"{database}.{MIGRATIONS_TABLE}",
            [(migration.version, migration.name, migration.checksum, ttl_days,
              datetime.now(timezone.utc))],
            ["version", "name", "checksum", "ttl_days", "applied_at"],
        )
        newly_applied.append(migration.version)
    return newly_applied


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


def set_table_ttl(store: "Store", table: str, ttl_days: int, schema_dir: Path = SCHEMA_DIR) -> None:
    """Change the TTL of an existing ``table`` to ``ttl_days`` (``ALTER TABLE … MODIFY TTL``).

    ClickHouse re-applies the new TTL to existing parts in the background. Raises
    ``ValueError`` for a bad TTL or a table without a TTL in the schema files.
    """
    validate_ttl_days(ttl_days)
    expressions = table_ttl_expressions(schema_dir)
    if table not in expressions:
        raise ValueError(f"table must be one of {sorted(expressions)}, got {table!r}")
    database = validate_identifier(store.database)
    store.command(f"ALTER TABLE `{database}`.{table} MODIFY TTL "
                  f"{expressions[table]} + toIntervalDay({int(ttl_days)})")
