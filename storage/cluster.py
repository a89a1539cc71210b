"""Cluster DDL generated from the single-node schema files, so the two never drift apart.

Every ``CREATE TABLE`` of ``schema/NNN_*.sql`` becomes two tables on every node
(``ON CLUSTER``), the usual ClickHouse layout:

- ``<table>_local``: the same columns, indexes, ORDER BY, PARTITION BY and TTL with the
  engine made replicated (``MergeTree`` → ``ReplicatedMergeTree('<zk>/<db>/<table>_local',
  '{replica}')``, ``ReplacingMergeTree(v)`` → ``ReplicatedReplacingMergeTree(…, v)``);
- ``<table>``: ``ENGINE = Distributed(cluster, db, <table>_local, <sharding key>)`` under the
  original name, so every query and insert of inferpath (and of the Collector's exporter
  and Grafana) runs unchanged.

A materialized view keeps its name and reads from / writes to the ``_local`` tables (it
runs on each node over the rows that node receives). ``ALTER TABLE`` statements address
``<table>_local ON CLUSTER``; one that adds, drops or changes a column is repeated for the
``Distributed`` table, whose column list is otherwise fixed when it is created. Sharding keys keep one trace on one shard
(``cityHash64(TraceId)`` / ``cityHash64(trace_id)``), so the trace-id lookup, request
assembly and ``FINAL`` on ``inferpath_requests`` see whole traces; metrics shard by
``rand()``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from inferpath.storage.schema_files import SCHEMA_DIR, Migration, created_table, load_migrations, validate_ttl_days
from inferpath.storage.url import validate_identifier

__all__ = ["LOCAL_SUFFIX", "SHARDING_KEYS", "cluster_statements", "migration_cluster_statements"]

LOCAL_SUFFIX = "_local"
# Tables whose rows must stay together per trace; everything else is spread evenly.
SHARDING_KEYS: dict[str, str] = {
    "otel_traces": "cityHash64(TraceId)",
    "otel_traces_trace_id_ts": "cityHash64(TraceId)",
    "inferpath_requests": "cityHash64(trace_id)",
    # A rebuilt rollup minute must land on the shard of the row it replaces.
    "inferpath_requests_1m": "cityHash64(minute, endpoint_class, endpoint, status)",
    "inferpath_requests_1h": "cityHash64(hour, endpoint_class, endpoint, status)",
    "inferpath_rollup_state": "cityHash64(name)",
}
DEFAULT_SHARDING_KEY = "rand()"
DEFAULT_REPLICATION_PATH = "/clickhouse/tables/{shard}"

_ENGINE = re.compile(r"ENGINE\s*=\s*([A-Za-z]*)MergeTree\(([^)]*)\)")
_CREATE_VIEW = re.compile(
    r"^CREATE\s+MATERIALIZED\s+VIEW\s+IF\s+NOT\s+EXISTS\s+`\{database\}`\.([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE
)
_ALTER_TABLE = re.compile(r"^ALTER\s+TABLE\s+`\{database\}`\.([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)
_TABLE_REF = re.compile(r"`\{database\}`\.([A-Za-z_][A-Za-z0-9_]*)")
_COLUMN_CHANGE = re.compile(r"\b(?:ADD|DROP|MODIFY|RENAME|COMMENT)\s+COLUMN\b", re.IGNORECASE)


def _local_refs(raw: str) -> str:
    return _TABLE_REF.sub(lambda m: f"`{{database}}`.{m.group(1)}{LOCAL_SUFFIX}", raw)


def _cluster_clause(raw: str, name_end: int, cluster: str) -> str:
    return raw[:name_end] + f" ON CLUSTER `{cluster}`" + raw[name_end:]


def _raw_cluster_statements(raw: str, cluster: str, replication_path: str) -> list[str]:
    table = created_table(raw)
    if table is not None:
        local = _local_refs(raw)
        name_end = _TABLE_REF.search(local).end()  # type: ignore[union-attr]
        local = _cluster_clause(local, name_end, cluster)

        def replicated(match: re.Match) -> str:
            variant, args = match.group(1), match.group(2).strip()
            zk = f"'{replication_path}/{{database}}/{table}{LOCAL_SUFFIX}', '{{replica}}'"
            return f"ENGINE = Replicated{variant}MergeTree({zk}{', ' + args if args else ''})"

        local, count = _ENGINE.subn(replicated, local, count=1)
        if count != 1:
            raise ValueError(f"table {table}: no *MergeTree engine to replicate")
        key = SHARDING_KEYS.get(table, DEFAULT_SHARDING_KEY)
        distributed = (
            f"CREATE TABLE IF NOT EXISTS `{{database}}`.{table} ON CLUSTER `{cluster}`"
            f" AS `{{database}}`.{table}{LOCAL_SUFFIX}"
            f" ENGINE = Distributed(`{cluster}`, `{{database}}`, {table}{LOCAL_SUFFIX}, {key})"
        )
        return [local, distributed]
    view = _CREATE_VIEW.match(raw)
    if view is not None:
        # The view keeps its name; its source and target become the node's local tables.
        name_end = view.end()
        head = _cluster_clause(raw[:name_end], name_end, cluster)
        return [head + _local_refs(raw[name_end:])]
    alter = _ALTER_TABLE.match(raw)
    if alter is not None:
        local = _local_refs(raw)
        statements = [_cluster_clause(local, _TABLE_REF.search(local).end(), cluster)]  # type: ignore[union-attr]
        if _COLUMN_CHANGE.search(raw):
            # A Distributed table copies its columns when it is created: a column added to
            # the local tables only would be invisible to every read and insert through it.
            statements.append(_cluster_clause(raw, alter.end(), cluster))
        return statements
    raise ValueError(f"no cluster form for statement: {raw[:80]!r}")


def migration_cluster_statements(
    migration: Migration,
    cluster: str,
    database: str,
    ttl_days: int,
    ttl_days_by_table: Mapping[str, int] | None = None,
    replication_path: str = DEFAULT_REPLICATION_PATH,
) -> list[str]:
    """The cluster form of one migration's statements, placeholders filled.

    Raises ``ValueError`` for a bad cluster/database name or TTL, or a statement with no
    cluster form (only CREATE TABLE, CREATE MATERIALIZED VIEW and ALTER TABLE have one).
    """
    validate_identifier(cluster, "cluster")
    validate_identifier(database)
    validate_ttl_days(ttl_days)
    overrides = {validate_identifier(t, "table"): validate_ttl_days(d) for t, d in (ttl_days_by_table or {}).items()}
    if "'" in replication_path or "`" in replication_path:
        raise ValueError(f"replication_path must not contain quotes, got {replication_path!r}")
    out = []
    for raw in migration.raw_statements():
        table = created_table(raw)
        days = overrides.get(table, ttl_days) if table else ttl_days
        for statement in _raw_cluster_statements(raw, cluster, replication_path):
            out.append(statement.replace("{database}", database).replace("{ttl_days}", str(days)))
    return out


def cluster_statements(
    cluster: str,
    database: str = "inferpath",
    ttl_days: int = 30,
    *,
    ttl_days_by_table: Mapping[str, int] | None = None,
    replication_path: str = DEFAULT_REPLICATION_PATH,
    schema_dir: Path = SCHEMA_DIR,
) -> list[str]:
    """The whole schema as cluster DDL: ``CREATE DATABASE … ON CLUSTER`` then, per schema
    file in version order, the statements of :func:`migration_cluster_statements`.

    ``replication_path``: Keeper path prefix of the replicated tables (``{shard}`` and
    ``{replica}`` are the servers' macros). Raises ``ValueError`` as that function does.
    """
    validate_identifier(cluster, "cluster")
    validate_identifier(database)
    out = [f"CREATE DATABASE IF NOT EXISTS `{database}` ON CLUSTER `{cluster}`"]
    for migration in load_migrations(schema_dir):
        out.extend(
            migration_cluster_statements(migration, cluster, database, ttl_days, ttl_days_by_table, replication_path)
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m inferpath.storage.cluster CLUSTER [DATABASE] [TTL_DAYS]``: print the DDL."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 3:
        print("usage: python -m inferpath.storage.cluster CLUSTER [DATABASE] [TTL_DAYS]", file=sys.stderr)
        return 2
    statements = cluster_statements(
        args[0], args[1] if len(args) > 1 else "inferpath", int(args[2]) if len(args) > 2 else 30
    )
    print(";\n\n".join(statements) + ";")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
