"""Every value crossing into storage goes through one converter (storage/values.py).

The failure this guards against, as a new user met it: TTFT values ``None``, ``"812.5"``
(text, as scraped values arrive), ``NaN`` and ``pandas.NA`` given to ``Store.insert`` lost the
whole batch (text and NA raised in the driver), NaN was stored as 0 in an integer column, and
through ``BatchWriter`` all four rows were dropped. The property tests feed arbitrary mixes of
None, NaN, inf, NumPy scalars, Decimal, bytes, number text and aware/naive datetimes.
"""

from __future__ import annotations

import logging
import math
import secrets
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest
from clickhouse_connect.datatypes.registry import get_from_name
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferpath.storage.rows import REQUEST_COLUMNS, RequestRow
from inferpath.storage.store import Store
from inferpath.storage.values import RowsRejected, convert_columns
from inferpath.storage.writer import BatchWriter

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
TTFT_VALUES = [None, "812.5", float("nan"), pd.NA]  # the four rows of the report

SAMPLES_DDL = (
    "CREATE TABLE IF NOT EXISTS ttft_samples (id UInt32, ts DateTime64(9, 'UTC'),"
    " ttft_ms Nullable(Float64)) ENGINE = MergeTree ORDER BY id"
)


def test_nan_na_and_number_text_through_store_insert_keep_every_row(store: Store) -> None:
    store.command(SAMPLES_DDL)
    assert store.insert("ttft_samples", [(i, T0, v) for i, v in enumerate(TTFT_VALUES)], ["id", "ts", "ttft_ms"]) == 4
    rows = store.query("SELECT id, ttft_ms FROM ttft_samples ORDER BY id")
    assert rows == [(0, None), (1, 812.5), (2, None), (3, None)]
    assert store.query("SELECT avg(ttft_ms), count() FROM ttft_samples") == [(812.5, 4)]


def test_nan_is_null_not_zero_in_an_integer_column(store: Store) -> None:
    ttft_ns = [None, "812500000", float("nan"), pd.NA]
    rows = [RequestRow(T0, secrets.token_hex(16), ttft_ns=v).to_insert_row() for v in ttft_ns]
    assert store.insert("inferpath_requests", rows, REQUEST_COLUMNS) == 4
    assert store.query("SELECT avg(ttft_ns), countIf(ttft_ns IS NULL), count() FROM inferpath_requests FINAL") == [
        (812_500_000.0, 3, 4)
    ]


def test_a_row_that_cannot_be_stored_is_named_and_nothing_else_is_lost(store: Store) -> None:
    store.command(SAMPLES_DDL)
    rows = [(0, T0, "812.5"), (1, T0, "fast"), (2, datetime(2025, 1, 1), 1.0), (3, T0, np.float32(0.5))]
    with pytest.raises(RowsRejected) as refused:  # default: all or nothing, the bad rows named
        store.insert("ttft_samples", rows, ["id", "ts", "ttft_ms"])
    message = str(refused.value)
    assert "row 1 column 'ttft_ms': text that is not a number (got 'fast')" in message
    assert "row 2 column 'ts': a naive datetime" in message
    assert store.query("SELECT count() FROM ttft_samples") == [(0,)]
    rejected: list = []
    assert store.insert("ttft_samples", rows, ["id", "ts", "ttft_ms"], rejected=rejected) == 2
    assert [(r.row, r.column) for r in rejected] == [(1, "ttft_ms"), (2, "ts")]
    assert store.query("SELECT id, ttft_ms FROM ttft_samples ORDER BY id") == [(0, 812.5), (3, 0.5)]


def test_batch_writer_keeps_the_valid_rows_and_counts_and_logs_each_drop(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    store.command(SAMPLES_DDL)
    writer = BatchWriter(store, "ttft_samples", ["id", "ts", "ttft_ms"], flush_interval_seconds=60.0)
    try:
        with caplog.at_level(logging.WARNING, logger="inferpath.storage.writer"):
            assert writer.submit([(i, T0, v) for i, v in enumerate(TTFT_VALUES)] + [(4, T0, "n/a")])
            assert writer.flush(timeout_seconds=20) is False  # one row of the flush was dropped
        assert (writer.rows_inserted_total, writer.rows_rejected_total, writer.rows_dropped_total) == (4, 1, 1)
        assert writer.insert_errors_total == 0
        assert store.query("SELECT avg(ttft_ms), count() FROM ttft_samples") == [(812.5, 4)]
        assert "1 of 5 rows for ttft_samples cannot be stored" in caplog.text
        assert "column 'ttft_ms': text that is not a number (got 'n/a')" in caplog.text
    finally:
        writer.close()


# ---------------------------------------------------------------- property tests

_MISSING = st.sampled_from([None, float("nan"), pd.NA, pd.NaT, np.float64("nan"), Decimal("NaN"), np.datetime64("NaT")])
_FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)
_NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    _FINITE,
    st.sampled_from([math.inf, -math.inf]),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    _FINITE.map(np.float64),
    st.floats(width=32, allow_nan=False, allow_infinity=False).map(np.float32),
    _FINITE.map(Decimal),
    st.integers(-(10**6), 10**6).map(lambda n: Decimal(n) / 4),
)
_NUMBER_TEXT = st.one_of(
    st.integers(-(2**70), 2**70).map(str), _FINITE.map(repr), st.sampled_from(["nan", "inf", " 42 ", "812.5"])
)
_TEXT = st.one_of(
    _NUMBER_TEXT, _NUMBER_TEXT.map(str.encode), st.sampled_from(["fast", "", "n/a", "12 ms"]), st.text(max_size=8)
)
_ZONES = st.sampled_from([timezone.utc, timezone(timedelta(hours=-5)), timezone(timedelta(hours=5, minutes=30))])
_NAIVE = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1))
_TIMES = st.one_of(
    st.builds(lambda t, z: t.replace(tzinfo=z), _NAIVE, _ZONES),
    _NAIVE,
    st.builds(lambda t, z: pd.Timestamp(t.replace(tzinfo=z)), _NAIVE, _ZONES),
    _NAIVE.map(pd.Timestamp),
    _NAIVE.map(np.datetime64),
    st.builds(lambda t, z: t.replace(tzinfo=z).isoformat(), _NAIVE, _ZONES),
)
_ANY = st.one_of(_MISSING, _NUMBERS, _TEXT, _TIMES)

COLUMNS = {  # name: (type, strategy of its values)
    "ttft_ms": ("Nullable(Float64)", st.one_of(_MISSING, _NUMBERS, _TEXT)),
    "tokens": ("Nullable(Int64)", st.one_of(_MISSING, _NUMBERS, _TEXT)),
    "value": ("Float64", st.one_of(_MISSING, _NUMBERS, _TEXT)),
    "model": ("String", _ANY),
    "ts": ("DateTime64(9, 'UTC')", st.one_of(_TIMES, _MISSING)),
    "bounds": (
        "Array(Float64)",
        st.lists(st.one_of(_NUMBERS, _NUMBER_TEXT, _MISSING), max_size=3).map(
            lambda items: np.array(items, dtype=float) if items and all(isinstance(i, float) for i in items) else items
        ),
    ),
    "attrs": (
        "Map(LowCardinality(String), String)",
        st.dictionaries(st.text(max_size=4), st.one_of(_TEXT, _NUMBERS, _MISSING), max_size=3),
    ),
}
NAMES = list(COLUMNS)
TYPES = [get_from_name(t) for t, _ in COLUMNS.values()]
_ROWS = st.lists(st.tuples(*(strategy for _, strategy in COLUMNS.values())), max_size=12)


# The oracle: which values each column can hold and what they become, written out
# independently of the converter (plain float() parsing, no type tables).
def _is_missing(v) -> bool:
    return (
        v is None
        or v is pd.NA
        or v is pd.NaT
        or (isinstance(v, float) and math.isnan(v))
        or (isinstance(v, Decimal) and v.is_nan())
        or (isinstance(v, np.datetime64) and np.isnat(v))
    )


def _number(v):
    """The number ``v`` stands for; None when missing; raises ValueError when not a number."""
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str):
        v = float(v)  # ValueError for "fast"
    if _is_missing(v):
        return None
    if isinstance(v, (bool, int, float, Decimal, np.integer, np.floating)):
        return v
    raise ValueError(v)


def _expected_float(v, nullable: bool):
    number = _number(v)
    if number is None:
        if nullable:
            return None
        raise ValueError("missing")
    result = float(number)
    if not math.isfinite(result):
        raise ValueError("not finite")
    return result


def _expected_int(v):
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str):
        float(v)  # ValueError when not a number
        v = Decimal(v.strip())  # the value the text spells, not its nearest float
    number = _number(v)
    if number is None:
        return None
    if isinstance(number, (float, np.floating)) and not (math.isfinite(number) and float(number).is_integer()):
        raise ValueError("not a whole number")
    whole = int(number)
    if whole != number or not -(2**63) <= whole < 2**63:
        raise ValueError("not whole or out of range")
    return whole


def _expected_row(row):
    ttft, tokens, value, model, ts, bounds, attrs = row
    out = [_expected_float(ttft, True), _expected_int(tokens), _expected_float(value, False)]
    if _is_missing(model) or isinstance(model, datetime) or isinstance(model, np.datetime64):
        raise ValueError("model")
    if isinstance(ts, str):
        ts = datetime.fromisoformat(ts)
    if not isinstance(ts, datetime) or ts is pd.NaT or ts.tzinfo is None:
        raise ValueError("ts")
    out.append(ts.astimezone(timezone.utc))
    out.append([_expected_float(b, False) for b in bounds])
    for item in attrs.values():
        if _is_missing(item):
            raise ValueError("attr")
    return out


def _oracle(rows):
    valid, invalid = {}, set()
    for index, row in enumerate(rows):
        try:
            valid[index] = _expected_row(row)
        except (ValueError, OverflowError):
            invalid.add(index)
    return valid, invalid


@settings(max_examples=400, deadline=None)
@given(_ROWS)
def test_converter_keeps_every_valid_row_and_never_passes_a_nan(rows) -> None:
    columns = list(zip(*rows)) or [() for _ in NAMES]
    converted, rejections = convert_columns(columns, NAMES, TYPES)
    valid, invalid = _oracle(rows)
    assert {r.row for r in rejections} == invalid
    assert all(len(column) == len(valid) for column in converted)
    for position, index in enumerate(sorted(valid)):
        expected = valid[index]
        ttft, tokens, value, bounds = (
            converted[0][position],
            converted[1][position],
            converted[2][position],
            converted[5][position],
        )
        assert (ttft, tokens, value) == tuple(expected[:3])
        assert list(bounds) == expected[4]
        for number in (ttft, value, *bounds):
            assert number is None or math.isfinite(number)
        assert all(type(v) is str for v in converted[6][position].values())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_ROWS)
def test_stored_rows_are_the_valid_ones_and_no_nan_is_stored(store: Store, rows) -> None:
    store.command(
        "CREATE TABLE IF NOT EXISTS mixed (id UInt32, "
        + ", ".join(f"`{n}` {t}" for n, (t, _) in COLUMNS.items())
        + ") ENGINE = MergeTree ORDER BY id"
    )
    store.command("TRUNCATE TABLE mixed")
    rejected: list = []
    inserted = store.insert("mixed", [(i, *row) for i, row in enumerate(rows)], ["id", *NAMES], rejected=rejected)
    valid, invalid = _oracle(rows)
    assert inserted == len(valid) and {r.row for r in rejected} == invalid
    stored = store.query("SELECT id, ttft_ms, tokens, value, ts, bounds FROM mixed ORDER BY id")
    assert [r[0] for r in stored] == sorted(valid)
    for id_, ttft, tokens, value, ts, bounds in stored:
        expected = valid[id_]
        assert (ttft, tokens, value, bounds) == (expected[0], expected[1], expected[2], expected[4])
        assert ts == expected[3]
    assert store.query(
        "SELECT countIf(isNaN(ttft_ms) OR isNaN(value) OR arrayExists(x -> isNaN(x), bounds)) FROM mixed"
    ) == [(0,)]
