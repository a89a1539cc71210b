"""Schema migrations: applied once, in order, and shaped like the OTel ClickHouse exporter's tables."""

from __future__ import annotations

import time

import pytest
from otel_exporter_columns import EXPORTER_INSERT_COLUMNS

from inferpath.storage.migrations import apply_migrations
from inferpath.storage.rows import (
    GAUGE_COLUMNS,
    HISTOGRAM_COLUMNS,
    REQUEST_COLUMNS,
    SPAN_COLUMNS,
    SUM_COLUMNS,
)
from inferpath.storage.schema_files import load_migrations
from inferpath.storage.store import Store

EXPORTER_TRACE_INSERT_COLUMNS = EXPORTER_INSERT_COLUMNS["traces"]


def test_migration_files_are_numbered_in_order() -> None:
    versions = [m.version for m in load_migrations()]
    assert versions == sorted(versions) == list(range(1, len(versions) + 1))
    assert len(versions) >= 3


def test_migrations_are_idempotent(store: Store, store_url: str, ttl_days: int) -> None:
    recorded = store.query("SELECT version, name FROM inferpath_schema_migrations ORDER BY version")
    assert [v for v, _ in recorded] == [m.version for m in load_migrations()]
    assert apply_migrations(store, ttl_days) == []
    store.close()
    with Store.open(store_url, ttl_days=ttl_days) as again:
        count = again.query("SELECT count() FROM inferpath_schema_migrations")[0][0]
        assert count == len(recorded)


def test_otel_traces_columns_match_exporter_insert_list(store: Store) -> None:
    names = [name for name, _ in store.table_columns("otel_traces")]
    assert names == EXPORTER_TRACE_INSERT_COLUMNS == list(SPAN_COLUMNS)
    types = dict(store.table_columns("otel_traces"))
    assert types["Timestamp"] == "DateTime64(9)"
    assert types["Duration"] == "UInt64"
    assert types["SpanAttributes"] == "Map(LowCardinality(String), String)"
    assert types["Events.Timestamp"] == "Array(DateTime64(9))"


def test_lookup_table_and_view_exist(store: Store) -> None:
    assert [n for n, _ in store.table_columns("otel_traces_trace_id_ts")] == ["TraceId", "Start", "End"]
    engines = dict(
        store.query("SELECT name, engine FROM system.tables WHERE database = {db:String}", {"db": store.database})
    )
    assert engines["otel_traces_trace_id_ts_mv"] == "MaterializedView"
    assert engines["inferpath_requests"] == "ReplacingMergeTree"


@pytest.mark.parametrize(
    ("table", "columns"),
    [
        ("otel_metrics_gauge", GAUGE_COLUMNS),
        ("otel_metrics_sum", SUM_COLUMNS),
        ("otel_metrics_histogram", HISTOGRAM_COLUMNS),
        ("inferpath_requests", REQUEST_COLUMNS),
    ],
)
def test_table_columns_match_row_column_lists(store: Store, table: str, columns: tuple) -> None:
    assert [n for n, _ in store.table_columns(table)] == list(columns)


def test_requests_table_types(store: Store) -> None:
    types = dict(store.table_columns("inferpath_requests"))
    assert types["timestamp"] == "DateTime64(9, 'UTC')"
    assert types["ttft_ns"] == "Nullable(Int64)"
    assert types["input_tokens"] == "Nullable(UInt32)"
    assert types["endpoint_class"] == "LowCardinality(String)"


def test_ttl_days_is_applied_to_tables(tmp_path) -> None:
    with Store.open(f"chdb://{tmp_path}/ttl7", ttl_days=7) as store:
        ddl = store.query(
            "SELECT create_table_query FROM system.tables WHERE database = {db:String} AND name = 'otel_traces'",
            {"db": store.database},
        )[0][0]
    assert "toIntervalDay(7)" in ddl


@pytest.mark.parametrize("ttl", [0, -1, 3651, 1.5, "30", True])
def test_bad_ttl_days_rejected(tmp_path, ttl) -> None:
    with pytest.raises(ValueError, match="ttl_days"):
        Store.open(f"chdb://{tmp_path}/bad", ttl_days=ttl)


def test_statements_reject_bad_database() -> None:
    migration = load_migrations()[0]
    with pytest.raises(ValueError, match="database"):
        migration.statements("x`; DROP TABLE y; --", 30)
    statements = migration.statements("telemetry", 30)
    assert statements and all("{database}" not in s and "{ttl_days}" not in s for s in statements)


def _outdated_parts_cleanup_thread_growth(store: Store, table: str, parts: int) -> int:
    """Leave ``parts`` outdated parts in ``table`` (single-row inserts, merged in the
    background and then by one OPTIMIZE) and wait for ClickHouse's cleanup to remove them;
    the growth of the engine's global thread pool meanwhile."""
    threads = "SELECT value FROM system.metrics WHERE metric = 'GlobalThread'"
    # Cleanup looks every second (ClickHouse's default: 30 s); outdated parts are kept until all
    # are there, then let go at once, so one cleanup removes them all however slow the inserts.
    # How many threads removal takes is unchanged.
    store.command(
        f"ALTER TABLE {table} MODIFY SETTING old_parts_lifetime = 3600, cleanup_delay_period = 1,"
        " cleanup_delay_period_random_add = 0"
    )
    for n in range(parts):  # distinct rows: identical blocks would be deduplicated
        store.command(
            f"INSERT INTO {table} (TraceId, SpanId, Timestamp) VALUES ('{n:032x}', '{n:016x}', '2025-01-01 12:00:00')"
        )
    before = store.query(threads)[0][0]
    store.command(f"OPTIMIZE TABLE {table} FINAL")
    store.command(f"ALTER TABLE {table} MODIFY SETTING old_parts_lifetime = 1")
    deadline = time.monotonic() + 90
    while store.query(
        f"SELECT count() FROM system.parts WHERE database = currentDatabase() AND table = '{table}' AND NOT active"
    )[0][0]:
        assert time.monotonic() < deadline, f"{table}: outdated parts not removed within 90 s"
        time.sleep(0.2)
    return store.query(threads)[0][0] - before


def test_outdated_parts_are_removed_without_a_burst_of_engine_threads(store: Store) -> None:
    # Concurrent removal (ClickHouse's default from 100 outdated parts) takes up to 128 threads
    # from the engine's global pool, which keeps them idle for good; schema 014 makes removal
    # sequential in every inferpath table. The control table has ClickHouse's default.
    assert _outdated_parts_cleanup_thread_growth(store, "otel_traces", 200) < 10
    store.command("CREATE TABLE removal_control AS otel_traces")
    store.command("ALTER TABLE removal_control MODIFY SETTING concurrent_part_removal_threshold = 100")
    assert _outdated_parts_cleanup_thread_growth(store, "removal_control", 200) >= 20


def test_every_table_removes_outdated_parts_sequentially(store: Store) -> None:
    tables = dict(
        store.query(
            "SELECT name, engine_full FROM system.tables WHERE database = currentDatabase()"
            " AND engine LIKE '%MergeTree' AND name != 'inferpath_schema_migrations'"
        )
    )
    assert len(tables) == 12
    assert {
        name for name, engine in tables.items() if "concurrent_part_removal_threshold = 1000000" not in engine
    } == set()
