"""Schemas 012 and 016 (the TTFT-phase columns and the hop into the engine's trip out of the
request row) on a single node and on a cluster."""

from __future__ import annotations

import re

from inferpath.storage.cluster import LOCAL_SUFFIX, cluster_statements
from inferpath.storage.rows import REQUEST_COLUMNS
from inferpath.storage.store import Store
from inferpath.vocabulary import REQUEST_DURATION_COLUMNS

PHASE_COLUMNS = ("gateway_ttft_ns", "network_ttft_ns", "engine_send_ns")  # schemas 012, 016


def test_phase_columns_are_nullable_and_follow_the_row_order(store: Store) -> None:
    types = dict(store.table_columns("inferpath_requests"))
    assert all(types[c] == "Nullable(Int64)" for c in PHASE_COLUMNS)
    assert [n for n, _ in store.table_columns("inferpath_requests")] == list(REQUEST_COLUMNS)
    assert set(PHASE_COLUMNS) <= set(REQUEST_DURATION_COLUMNS)
    # The request row's duration columns are the vocabulary's, in its order.
    assert [c for c in REQUEST_COLUMNS if c.endswith("_ns")] == list(REQUEST_DURATION_COLUMNS)


def test_cluster_form_adds_the_columns_to_local_and_distributed_tables(store: Store) -> None:
    statements = cluster_statements("prod", "obs")
    for column in PHASE_COLUMNS:
        hits = [s for s in statements if re.search(rf"ADD COLUMN IF NOT EXISTS {column}\b", s)]
        # The Distributed table fixes its columns at creation: it needs the column as well.
        assert sorted(h.split(" ON CLUSTER")[0] for h in hits) == [
            "ALTER TABLE `obs`.inferpath_requests",
            f"ALTER TABLE `obs`.inferpath_requests{LOCAL_SUFFIX}",
        ]
        for statement in hits:
            assert "ON CLUSTER `prod`" in statement
            assert store.query("SELECT formatQuery({q:String})", {"q": statement})[0][0]
    # An index is the local tables' business only.
    index = [s for s in statements if "ADD INDEX IF NOT EXISTS idx_updated_at" in s]
    assert len(index) == 1 and f"inferpath_requests{LOCAL_SUFFIX} ON CLUSTER" in index[0]
