"""Store: round trips through real chDB, UTC end to end, persistence across restarts."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from inferpath.storage.reader import Reader
from inferpath.storage.rows import SPAN_COLUMNS, SpanRow
from inferpath.storage.store import Store

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
REPO_ROOT = Path(__file__).resolve().parents[2]


def _span(trace_id: str, **overrides) -> SpanRow:
    values = dict(
        timestamp=T0,
        trace_id=trace_id,
        span_id=secrets.token_hex(8),
        span_name="POST /v1/chat/completions",
        span_kind="Server",
        service_name="gateway",
        resource_attributes={"service.name": "gateway", "inferpath.endpoint_class": "interactive"},
        span_attributes={"inferpath.stage": "gateway", "http.response.status_code": "200"},
        duration_ns=1_500_000_123,
        status_code="Ok",
        events=[(T0 + timedelta(milliseconds=5), "first_token", {"n": "1"})],
        links=[(secrets.token_hex(16), secrets.token_hex(8), "k=v", {"why": "batch"})],
    )
    values.update(overrides)
    return SpanRow(**values)


def _run_python(code: str, env_overrides: dict[str, str] | None = None) -> dict:
    env = dict(os.environ)
    env.update(env_overrides or {})
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_span_round_trip_is_exact(store: Store) -> None:
    trace_id = secrets.token_hex(16)
    root = _span(trace_id)
    child = _span(
        trace_id,
        parent_span_id=root.span_id,
        span_kind="Internal",
        span_name="tokenize",
        timestamp=T0 + timedelta(microseconds=250),
        duration_ns=42,
        events=[],
        links=[],
    )
    assert store.insert("otel_traces", [root.to_insert_row(), child.to_insert_row()], SPAN_COLUMNS) == 2
    spans = Reader(store).trace_spans(trace_id)
    assert spans == [root, child]
    assert spans[0].timestamp.tzinfo == timezone.utc
    assert spans[1].end_ns - spans[0].start_ns == 250_000 + 42


def test_query_results_are_aware_utc(store: Store) -> None:
    store.insert("otel_traces", [_span(secrets.token_hex(16)).to_insert_row()], SPAN_COLUMNS)
    ((ts, events_ts, hour),) = store.query("SELECT Timestamp, Events.Timestamp, toHour(Timestamp) FROM otel_traces")
    assert ts == T0 and ts.utcoffset() == timedelta(0)
    assert events_ts[0].tzinfo is not None and events_ts[0] == T0 + timedelta(milliseconds=5)
    assert hour == 12
    rows = store.query_dicts("SELECT Timestamp AS ts, SpanName FROM otel_traces")
    assert rows == [{"ts": T0, "SpanName": "POST /v1/chat/completions"}]


def test_aware_parameters_in_other_zones_bind_as_the_same_instant(store: Store) -> None:
    store.insert("otel_traces", [_span(secrets.token_hex(16)).to_insert_row()], SPAN_COLUMNS)
    plus_five = timezone(timedelta(hours=5))
    count = store.query(
        "SELECT count() FROM otel_traces WHERE Timestamp = {t:DateTime64(9)}",
        {"t": T0.astimezone(plus_five)},
    )[0][0]
    assert count == 1


def test_naive_datetimes_are_rejected(store: Store) -> None:
    row = list(_span(secrets.token_hex(16)).to_insert_row())
    row[0] = datetime(2025, 1, 1, 12, 0, 0)
    with pytest.raises(ValueError, match="row 0 column 'Timestamp'"):
        store.insert("otel_traces", [row], SPAN_COLUMNS)
    row = list(_span(secrets.token_hex(16)).to_insert_row())
    row[15] = [datetime(2025, 1, 1)]
    with pytest.raises(ValueError, match="Events.Timestamp"):
        store.insert("otel_traces", [row], SPAN_COLUMNS)
    with pytest.raises(ValueError, match="parameter 't'"):
        store.query("SELECT {t:DateTime64(9)}", {"t": datetime(2025, 1, 1)})
    with pytest.raises(ValueError, match="timestamp"):
        _span(secrets.token_hex(16), timestamp=datetime(2025, 1, 1))
    assert store.query("SELECT count() FROM otel_traces")[0][0] == 0


@pytest.mark.parametrize("table", ["otel_traces; DROP TABLE x", "a.b.c", "1table", "", "t-1"])
def test_bad_table_names_rejected(store: Store, table: str) -> None:
    with pytest.raises(ValueError, match="table name"):
        store.insert(table, [(1,)], ["a"])


def test_bad_column_name_and_row_width_rejected(store: Store) -> None:
    with pytest.raises(ValueError, match="column name"):
        store.insert("inferpath_requests", [(1,)], ["trace_id) VALUES"])
    with pytest.raises(ValueError, match="row 0 has 1 values for 2 columns"):
        store.insert("inferpath_requests", [(1,)], ["trace_id", "status"])


def test_closed_store_refuses_calls_and_close_is_idempotent(store_url: str) -> None:
    store = Store.open(store_url)
    store.close()
    store.close()
    assert store.closed
    with pytest.raises(RuntimeError, match="closed"):
        store.query("SELECT 1")


def test_second_chdb_path_while_open_is_refused(store: Store, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="one data folder per process"):
        Store.open(f"chdb://{tmp_path}/other")
    assert store.query("SELECT 1") == [(1,)]


def test_reopen_same_path_in_process_sees_data(store_url: str) -> None:
    trace_id = secrets.token_hex(16)
    with Store.open(store_url, ttl_days=3650) as store:
        store.insert("otel_traces", [_span(trace_id).to_insert_row()], SPAN_COLUMNS)
    with Store.open(store_url, ttl_days=3650) as store:
        assert [s.trace_id for s in Reader(store).trace_spans(trace_id)] == [trace_id]


def test_data_survives_restart_in_fresh_process(store_url: str) -> None:
    trace_id = secrets.token_hex(16)
    with Store.open(store_url, ttl_days=3650) as store:
        store.insert("otel_traces", [_span(trace_id).to_insert_row()], SPAN_COLUMNS)
    child = _run_python(f"""
        import json
        from datetime import datetime, timezone
        from inferpath.storage.store import Store
        from inferpath.storage.reader import Reader
        from inferpath.storage.rows import REQUEST_COLUMNS, RequestRow
        with Store.open({store_url!r}, ttl_days=3650) as store:
            spans = Reader(store).trace_spans({trace_id!r})
            row = RequestRow(datetime(2025, 1, 1, 12, tzinfo=timezone.utc), {trace_id!r}, endpoint="/from-child")
            store.insert("inferpath_requests", [row.to_insert_row()], REQUEST_COLUMNS)
        print(json.dumps({{"names": [s.span_name for s in spans], "start_ns": spans[0].start_ns}}))
    """)
    assert child["names"] == ["POST /v1/chat/completions"]
    assert child["start_ns"] == 1_735_732_800 * 10**9
    with Store.open(store_url, ttl_days=3650) as store:
        assert store.query("SELECT endpoint FROM inferpath_requests FINAL") == [("/from-child",)]


@pytest.mark.parametrize("zone, abbreviation", [("Europe/Berlin", "CET"), ("America/Los_Angeles", "PST")])
def test_host_timezone_does_not_shift_times(store_url: str, zone: str, abbreviation: str) -> None:
    """A process in Berlin (UTC+1 in January) or Los Angeles (UTC-8) stores and finds 12:00 UTC
    as 12:00 UTC."""
    result = _run_python(
        f"""
        import json, secrets, time
        from datetime import datetime, timedelta, timezone
        from inferpath.storage.store import Store
        from inferpath.storage.reader import Reader
        from inferpath.storage.rows import SPAN_COLUMNS, SpanRow
        t0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
        trace_id = secrets.token_hex(16)
        with Store.open({store_url!r}, ttl_days=3650) as store:
            span = SpanRow(timestamp=t0, trace_id=trace_id, span_id=secrets.token_hex(8), duration_ns=10)
            store.insert("otel_traces", [span.to_insert_row()], SPAN_COLUMNS)
            found = Reader(store).trace_spans(trace_id)
            text, hour, day = store.query("SELECT toString(Timestamp), toHour(Timestamp), toString(toDate(Timestamp)) FROM otel_traces")[0]
            in_window = store.query(
                "SELECT count() FROM otel_traces WHERE Timestamp >= {{a:DateTime64(9)}} AND Timestamp < {{b:DateTime64(9)}}",
                {{"a": t0 - timedelta(seconds=1), "b": t0 + timedelta(seconds=1)}},
            )[0][0]
        print(json.dumps({{
            "local_zone": time.strftime("%Z", time.localtime(t0.timestamp())),
            "found_iso": found[0].timestamp.isoformat(),
            "text": text, "hour": hour, "day": day, "in_window": in_window,
        }}))
    """,
        {"TZ": zone},
    )
    assert result["local_zone"] == abbreviation  # the child really ran in that zone
    assert result["found_iso"] == "2025-01-01T12:00:00+00:00"
    assert result["text"] == "2025-01-01 12:00:00.000000000"
    assert result["hour"] == 12
    assert result["day"] == "2025-01-01"
    assert result["in_window"] == 1
    # And the parent (other zone) reads the same instant back.
    with Store.open(store_url, ttl_days=3650) as store:
        assert store.query("SELECT Timestamp FROM otel_traces")[0][0] == T0


def test_a_chdb_call_does_not_wait_for_another_threads_long_statement(tmp_path) -> None:
    """Each call has a connection of its own: a quick query runs while a slow one holds
    another connection (one shared connection made every insert wait behind rollups)."""
    with Store.open(f"chdb://{tmp_path / 'store'}") as store:
        slow = threading.Thread(target=lambda: store.query("SELECT sleep(2)"))
        began = time.monotonic()
        slow.start()
        time.sleep(0.3)
        quick_began = time.monotonic()
        assert store.query("SELECT 1") == [(1,)]
        quick_seconds = time.monotonic() - quick_began
        slow.join(30)
        assert time.monotonic() - began >= 2.0 and quick_seconds < 1.0
        assert len(store._connections) == 2 and len(store._idle) == 2


class _Attributes(dict):
    """A map value that can be watched with a weak reference."""


def test_an_insert_keeps_none_of_its_rows_alive(store: Store) -> None:
    # clickhouse-connect's InsertContext sits in a reference cycle with the data it was given;
    # with the cycle collector idle (as on the loaded server), the rows must still go at once.
    import gc
    import weakref

    store.command("CREATE TABLE rows_probe (Id UInt64, Attributes Map(String, String)) ENGINE = Memory")
    rows = [(n, _Attributes(key=str(n))) for n in range(2000)]
    watched = [weakref.ref(attributes) for _, attributes in rows]
    gc.disable()
    try:
        assert store.insert("rows_probe", rows, ["Id", "Attributes"]) == 2000
        del rows
        assert sum(ref() is not None for ref in watched) == 0
    finally:
        gc.enable()
    assert store.query("SELECT count(), sum(Id), Attributes['key'] FROM rows_probe WHERE Id = 7 GROUP BY 3") == [
        (1, 7, "7")
    ]


def test_inserts_leave_no_cyclic_garbage(store: Store) -> None:
    # clickhouse-connect's InsertContext, given data, keeps a bound method of itself: such a
    # cycle keeps an insert's rows until a full collection.
    import gc

    store.command("CREATE TABLE cycle_probe (Id UInt64, At DateTime64(9, 'UTC'), Tags Array(String)) ENGINE = Memory")
    at = datetime(2025, 1, 1, 12, tzinfo=timezone.utc)
    rows = [(n, at, [str(n)]) for n in range(1000)]
    store.insert("cycle_probe", rows, ["Id", "At", "Tags"])  # the driver's first-use caches
    gc.collect()
    gc.disable()
    try:
        for token in ("a", "b", None):
            assert store.insert("cycle_probe", rows, ["Id", "At", "Tags"], dedup_token=token) == 1000
        with pytest.raises(DatabaseError):  # a column the table lacks: refused by the store
            store.insert("cycle_probe", rows, ["Id", "At", "Nope"])
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert store.query("SELECT count() FROM cycle_probe") == [(4000,)]


def test_the_installed_clickhouse_connect_is_in_the_range_pyproject_pins() -> None:
    # storage/store.py (_untie_insert_context) reaches a private attribute of the driver's
    # InsertContext; a version outside the checked range fails here, before it fails quietly.
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    pinned = next(
        Requirement(item)
        for item in pyproject["project"]["optional-dependencies"]["server"]
        if Requirement(item).name == "clickhouse-connect"
    )
    assert pinned.specifier != SpecifierSet("") and any(spec.operator == "<" for spec in pinned.specifier)
    assert version("clickhouse-connect") in pinned.specifier, (version("clickhouse-connect"), str(pinned.specifier))
