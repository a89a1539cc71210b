"""Cluster DDL from the schema files, per-table TTL, insert dedup tokens, credentials kept out
of logs and errors."""

from __future__ import annotations

import logging
import re

import pytest

from inferpath.storage.cluster import LOCAL_SUFFIX, cluster_statements
from inferpath.storage.migrations import set_table_ttl, table_ttl_expressions
from inferpath.storage.rows import REQUEST_COLUMNS, RequestRow
from inferpath.storage.store import Store
from inferpath.storage.url import parse_store_url


def _single_node_objects(store: Store) -> dict[str, str]:
    rows = store.query(
        "SELECT name, engine FROM system.tables WHERE database = {db:String} AND name != 'inferpath_schema_migrations'",
        {"db": store.database},
    )
    return dict(rows)


def _find(statements: list[str], pattern: str) -> str:
    hits = [s for s in statements if re.search(pattern, s, re.DOTALL)]
    assert len(hits) == 1, (pattern, len(hits))
    return hits[0]


def test_every_single_node_table_and_view_has_its_cluster_counterparts(store: Store) -> None:
    statements = cluster_statements("prod", store.database, ttl_days=7)
    objects = _single_node_objects(store)
    assert {"otel_traces", "otel_traces_trace_id_ts", "otel_traces_trace_id_ts_mv", "inferpath_requests"} <= set(
        objects
    )
    db = f"`{store.database}`"
    for name, engine in objects.items():
        if engine == "MaterializedView":
            view = _find(statements, rf"^CREATE MATERIALIZED VIEW IF NOT EXISTS {db}\.{name} ON CLUSTER `prod`")
            # It runs on each node, from the node's local spans into the local lookup table.
            assert re.search(rf"TO {db}\.\w+{LOCAL_SUFFIX}\b", view)
            assert re.search(rf"FROM {db}\.\w+{LOCAL_SUFFIX}\b", view)
            continue
        assert engine.endswith("MergeTree"), (name, engine)
        local = _find(statements, rf"^CREATE TABLE IF NOT EXISTS {db}\.{name}{LOCAL_SUFFIX} ON CLUSTER `prod` \(")
        assert (
            f"ENGINE = Replicated{engine}('/clickhouse/tables/{{shard}}/{store.database}/{name}_local', "
            "'{replica}'" in local
        )
        distributed = _find(statements, rf"^CREATE TABLE IF NOT EXISTS {db}\.{name} ON CLUSTER `prod` AS ")
        assert f"ENGINE = Distributed(`prod`, {db}, {name}{LOCAL_SUFFIX}, " in distributed
        # Same columns and ordering as the single node: the local table is the schema file's.
        assert "ORDER BY" in local and "toIntervalDay(7)" in local
    # ReplacingMergeTree keeps its version column after the replication arguments.
    requests = _find(statements, rf"^CREATE TABLE IF NOT EXISTS {db}\.inferpath_requests{LOCAL_SUFFIX} ON CLUSTER")
    assert "'{replica}', updated_at)" in requests
    # Later migrations alter the node-local table on every node.
    index = _find(statements, r"ADD INDEX IF NOT EXISTS idx_updated_at")
    assert index.startswith(f"ALTER TABLE {db}.inferpath_requests{LOCAL_SUFFIX} ON CLUSTER `prod`")
    assert _find(statements, r"Distributed\(`prod`, `\w+`, otel_traces_local, ").endswith("cityHash64(TraceId))")
    assert statements[0] == f"CREATE DATABASE IF NOT EXISTS {db} ON CLUSTER `prod`"
    assert all("{database}" not in s and "{ttl_days}" not in s for s in statements)


def test_cluster_statements_parse_as_clickhouse_sql(store: Store) -> None:
    # chDB has no cluster to run them on, but its parser checks every statement.
    for statement in cluster_statements("prod", "inferpath"):
        formatted = store.query("SELECT formatQuery({q:String})", {"q": statement})[0][0]
        assert "ON CLUSTER prod" in formatted


def test_cluster_and_names_are_validated() -> None:
    with pytest.raises(ValueError, match="cluster"):
        cluster_statements("prod; DROP", "inferpath")
    with pytest.raises(ValueError, match="ttl_days"):
        cluster_statements("prod", "inferpath", ttl_days=0)
    url = parse_store_url("https://ops:s3cret@ch.example:8443/obs?cluster=prod")
    assert url.cluster == "prod" and str(url) == "https://ops@ch.example:8443/obs?cluster=prod"
    with pytest.raises(ValueError, match="unknown query parameter"):
        parse_store_url("http://ch.example/obs?shard=1")


def test_ttl_is_configurable_per_table(store_url: str) -> None:
    with Store.open(store_url, ttl_days=30, ttl_days_by_table={"otel_traces": 3, "inferpath_requests": 400}) as store:
        engines = dict(
            store.query(
                "SELECT name, engine_full FROM system.tables WHERE database = {db:String}", {"db": store.database}
            )
        )
        assert "toIntervalDay(3)" in engines["otel_traces"]
        assert "toIntervalDay(400)" in engines["inferpath_requests"]
        assert "toIntervalDay(30)" in engines["otel_metrics_gauge"]
        set_table_ttl(store, "otel_metrics_gauge", 9)
        engine = store.query(
            "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = 'otel_metrics_gauge'",
            {"db": store.database},
        )[0][0]
        assert "toIntervalDay(9)" in engine
        with pytest.raises(ValueError, match="table must be one of"):
            set_table_ttl(store, "system_users", 9)
    assert table_ttl_expressions()["otel_traces"] == "toDateTime(Timestamp)"
    cluster = cluster_statements("prod", ttl_days=30, ttl_days_by_table={"otel_traces": 3})
    assert "toIntervalDay(3)" in _find(cluster, r"otel_traces_local ON CLUSTER `prod` \(")


def test_insert_with_the_same_dedup_token_is_stored_once(store: Store) -> None:
    from datetime import datetime, timezone

    from inferpath.storage.rows import SPAN_COLUMNS, SpanRow

    rows = [
        SpanRow(
            timestamp=datetime.now(timezone.utc), trace_id="ab" * 16, span_id=f"{i:016x}", duration_ns=5
        ).to_insert_row()
        for i in range(10)
    ]
    for _ in range(3):
        store.insert("otel_traces", rows, SPAN_COLUMNS, dedup_token="export-1")
    store.insert("otel_traces", rows[:2], SPAN_COLUMNS, dedup_token="export-2")
    assert store.query("SELECT count() FROM otel_traces")[0][0] == 12
    # Without a token the request table (ReplacingMergeTree) takes every insert as usual.
    row = RequestRow(datetime.now(timezone.utc), "cd" * 16).to_insert_row()
    store.insert("inferpath_requests", [row], REQUEST_COLUMNS)
    assert store.query("SELECT count() FROM inferpath_requests FINAL")[0][0] == 1


def test_http_credentials_from_the_environment_are_never_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "pw-" + "9f3e1c77aa"
    monkeypatch.setenv("CLICKHOUSE_USER", "ops")
    monkeypatch.setenv("CLICKHOUSE_PASSWORD", secret)
    url = parse_store_url("http://127.0.0.1:9/inferpath")  # discard port: nothing listens
    assert url.username == "ops" and url.password == secret
    assert secret not in repr(url) and secret not in str(url)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(Exception) as raised:
        Store.open("http://127.0.0.1:9/inferpath")
    assert secret not in str(raised.value) and secret not in repr(raised.value)
    assert secret not in caplog.text
