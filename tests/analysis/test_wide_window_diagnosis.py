"""The diagnosis's fast paths against the Python definitions, on real chDB:

- both windows read by one :meth:`StoredWindow.pair` (``-If`` aggregates, tail sums and replica
  spans of both windows in one scan) equal each window's rows held in Python, for adjacent,
  overlapping and separate windows, with and without excluded traces;
- a healthy verdict, or a window with too few requests, costs one query;
- gauges aligned on a grid of whole minutes from the per-minute rollup (schema 011) equal the
  samples aligned in Python, before and after the one-time backfill;
- a diagnosis over two 11-hour windows (minute grid, rollup) equals the diagnosis of every row
  and sample read into Python, and names the KV-cache pressure of its last hours.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from fault_scenarios import MS, SCENARIOS, T0, Profile, load_scenario
from test_in_database_diagnosis import _assert_same, _python_diagnosis

from inferpath.analysis.breakdown import fetch_request_rows
from inferpath.analysis.diagnosis import DIAGNOSIS_COLUMNS, InsufficientDataError, diagnose
from inferpath.analysis.request_window import (
    MEASURED_COLUMNS,
    QUANTILE_LEVELS,
    RowsWindow,
    StoredWindow,
    prepare_attribution,
)
from inferpath.analysis.signals import alignment_grid, fetch_window_signals_rows
from inferpath.analysis.timeline_query import fetch_signal_windows, fetch_window_signals
from inferpath.analysis.verdict import verdict_to_dict
from inferpath.storage import gauge_rollup
from inferpath.storage.rows import GAUGE_COLUMNS, REQUEST_COLUMNS, SUM_COLUMNS, GaugeRow, RequestRow, SumRow
from inferpath.storage.store import Store
from inferpath.vocabulary import TTFT_PHASE_COLUMNS

HOURS = 11
# Recent (tables have a TTL) and off the minute, so the wide grid's epoch anchoring is exercised.
WIDE_START = (datetime.now(timezone.utc) - timedelta(hours=2 * HOURS + 1)).replace(
    minute=0, second=17, microsecond=250_000
)
WIDE = timedelta(hours=HOURS)
REQUEST_SPACING = timedelta(seconds=45)
SAMPLE_SPACING = timedelta(seconds=20)


class CountingStore:
    """The real store, counting the SELECTs run through it (a diagnosis's cost in queries)."""

    def __init__(self, store: Store) -> None:
        self.store, self.sql = store, []

    def query(self, sql, parameters=None):
        self.sql.append(sql)
        return self.store.query(sql, parameters)

    def query_dicts(self, sql, parameters=None):
        self.sql.append(sql)
        return self.store.query_dicts(sql, parameters)


def _jitter(rng: random.Random, value_ms: float) -> int:
    return int(value_ms * MS * rng.lognormvariate(0.0, 0.2))


def _wide_requests(start: datetime, *, incident_from: datetime | None, seed: int) -> list[RequestRow]:
    """One request every 45 s over :data:`WIDE`; from ``incident_from`` on, the KV-cache
    pressure profile of the scenarios (long queue tail)."""
    rng = random.Random(seed)
    normal, pressure = Profile(), SCENARIOS["kv_cache_pressure"].current
    rows = []
    for i in range(int(WIDE / REQUEST_SPACING)):
        ts = start + i * REQUEST_SPACING
        profile = pressure if incident_from is not None and ts >= incident_from else normal
        stages = {
            "gateway_ns": _jitter(rng, profile.gateway_ms),
            "tokenize_ns": _jitter(rng, profile.tokenize_ms),
            "retrieval_ns": _jitter(rng, profile.retrieval_ms),
            "network_ns": _jitter(rng, profile.network_ms),
            "queue_ns": _jitter(rng, profile.queue_ms)
            + (_jitter(rng, profile.queue_tail_ms) if rng.random() < 0.3 else 0),
            "prefill_ns": _jitter(rng, profile.prefill_ms),
        }
        output_tokens = rng.randint(50, 150)
        itl_ns = _jitter(rng, profile.itl_ms)
        ttft_ns = sum(stages.values()) + MS
        rows.append(
            RequestRow(
                timestamp=ts,
                trace_id=f"{seed:08x}{i:024x}",
                service_name="gateway",
                endpoint="/v1/chat/completions",
                endpoint_class="interactive",
                model="m",
                replica="engine-0",
                status="ok",
                http_status_code=200,
                input_tokens=512,
                output_tokens=output_tokens,
                ttft_ns=ttft_ns,
                e2e_ns=ttft_ns + itl_ns * (output_tokens - 1),
                itl_ns=itl_ns,
                decode_ns=itl_ns * (output_tokens - 1),
                **stages,
            )
        )
    return rows


def _wide_samples(start: datetime, end: datetime, incident_from: datetime) -> tuple[list, list]:
    """Gauges of two engines and one GPU every 20 s from 10 minutes before ``start``; engine
    1 stops reporting for an hour (longer than the lookback, so it goes stale) and samples
    at odd seconds; a cumulative preemption counter that rises in the incident."""
    rng = random.Random(7)
    gauges, sums = [], []
    counter = 0.0
    ts = start - timedelta(minutes=10)
    gap = (start + timedelta(hours=3), start + timedelta(hours=4))
    while ts < end:
        hot = ts >= incident_from
        for engine in ("0", "1"):
            if engine == "1" and gap[0] <= ts < gap[1]:
                continue
            at = ts + timedelta(seconds=3 if engine == "1" else 0)
            resource = {"service.instance.id": f"engine-{engine}"}
            for name, value in (
                ("queue_depth", rng.gauss(20 if hot else 1, 0.5)),
                ("running_requests", rng.gauss(8, 1)),
                ("kv_cache_usage_ratio", min(1.0, rng.gauss(0.95 if hot else 0.45, 0.02))),
            ):
                gauges.append(
                    GaugeRow(
                        resource_attributes=resource,
                        service_name="engine",
                        metric_name=name,
                        description="",
                        unit="",
                        attributes={"engine": engine},
                        start_time=None,
                        time=at,
                        value=max(0.0, value),
                    )
                )
        gauges.append(
            GaugeRow(
                resource_attributes={"host.name": "node-1"},
                service_name="nvml",
                metric_name="gpu_utilization_ratio",
                description="",
                unit="",
                attributes={"gpu": "0"},
                start_time=None,
                time=ts,
                value=rng.uniform(0.5, 0.7),
            )
        )
        counter += 3.0 if hot else 0.0
        sums.append(
            SumRow(
                resource_attributes={"service.instance.id": "engine-0"},
                service_name="engine",
                metric_name="preemptions_total",
                description="",
                unit="",
                attributes={"engine": "0"},
                start_time=start,
                time=ts,
                value=counter,
            )
        )
        ts += SAMPLE_SPACING
    return gauges, sums


def _load_wide(store: Store) -> dict[str, datetime]:
    baseline_start, window_start = WIDE_START, WIDE_START + WIDE
    window_end = window_start + WIDE
    incident_from = window_end - timedelta(hours=2)
    requests = _wide_requests(baseline_start, incident_from=None, seed=1) + _wide_requests(
        window_start, incident_from=incident_from, seed=2
    )
    gauges, sums = _wide_samples(baseline_start, window_end, incident_from)
    store.insert("inferpath_requests", [r.to_insert_row() for r in requests], REQUEST_COLUMNS)
    store.insert("otel_metrics_gauge", [g.to_insert_row() for g in gauges], GAUGE_COLUMNS)
    store.insert("otel_metrics_sum", [s.to_insert_row() for s in sums], SUM_COLUMNS)
    return {
        "baseline_start": baseline_start,
        "baseline_end": window_start,
        "window_start": window_start,
        "window_end": window_end,
    }


def _utc_ns(unix_ns: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=unix_ns // 1000)


# ---------------------------------------------------------------------------- the alignment grid


def test_a_wide_grid_is_whole_minutes_from_the_epoch_and_every_point_is_inside_the_window() -> None:
    start, end = WIDE_START, WIDE_START + WIDE
    origin_ns, step_ns, steps = alignment_grid(start, end, WIDE.total_seconds() / 600)  # 66 s asked
    assert step_ns == 120 * 10**9 and origin_ns % step_ns == 0
    points = [origin_ns + (i + 1) * step_ns - 1 for i in range(steps)]
    start_ns = int(start.timestamp()) * 10**9 + start.microsecond * 1000
    end_ns = int(end.timestamp()) * 10**9 + end.microsecond * 1000
    assert start_ns <= points[0] and points[-1] < end_ns and points[-1] + step_ns >= end_ns
    # The next window of the same length continues the same grid.
    next_origin, next_step, _ = alignment_grid(end, end + WIDE, WIDE.total_seconds() / 600)
    assert next_step == step_ns and (next_origin - origin_ns) % step_ns == 0
    # Under a minute, the grid starts at the window's start as before.
    narrow = alignment_grid(T0, T0 + timedelta(minutes=10), 1.0)
    assert narrow == (int(T0.timestamp()) * 10**9, 10**9, 600)
    with pytest.raises(ValueError, match="step_seconds"):
        alignment_grid(start, end, 0.0)


# ---------------------------------------------------------------------------- the gauge rollup


def test_gauges_on_a_minute_grid_from_the_rollup_equal_the_samples_before_and_after_backfill(tmp_path) -> None:
    with Store.open(f"chdb://{tmp_path / 'store'}") as store:
        windows = _load_wide(store)
        # As if every sample were stored before the view existed (a store upgraded in place).
        store.command(f"TRUNCATE TABLE {gauge_rollup.GAUGE_ROLLUP_TABLE}")
        counting = CountingStore(store)
        start, end = windows["baseline_start"], windows["window_end"]
        expected = fetch_window_signals_rows(store, start, end)
        assert not gauge_rollup.is_ready(store)
        assert fetch_window_signals(counting, start, end) == expected
        assert not any(gauge_rollup.GAUGE_ROLLUP_TABLE in sql for sql in counting.sql)

        assert gauge_rollup.backfill(store) is True
        assert gauge_rollup.backfill(store) is False  # once per store
        minutes = store.query(
            "SELECT count() FROM (SELECT DISTINCT MetricName, ServiceName, ResourceAttributes,"
            " Attributes, intDiv(toUnixTimestamp64Nano(TimeUnix), 60000000000)"
            " FROM otel_metrics_gauge)"
        )[0][0]
        assert store.query(f"SELECT count() FROM {gauge_rollup.GAUGE_ROLLUP_TABLE} FINAL")[0][0] == minutes
        counting.sql.clear()
        for window in (
            (start, end),
            (windows["window_start"], end),
            (windows["baseline_start"] + timedelta(hours=2, seconds=31), end),
        ):
            got = fetch_window_signals(counting, *window)
            assert got == fetch_window_signals_rows(store, *window), window
        assert sum(gauge_rollup.GAUGE_ROLLUP_TABLE in sql for sql in counting.sql) == 3
        assert got.gauges["queue_depth"].max > 30  # both engines' queues in the incident, summed

        # A sample stored twice (a retried insert) changes nothing; a new one reaches the
        # rollup through the view at once. It lands just before a grid point mid-window.
        origin_ns, step_ns, steps = alignment_grid(windows["window_start"], end, WIDE.total_seconds() / 600)
        point = _utc_ns(origin_ns + (steps // 2) * step_ns - 1)
        late = GaugeRow(
            resource_attributes={"service.instance.id": "engine-0"},
            service_name="engine",
            metric_name="queue_depth",
            description="",
            unit="",
            attributes={"engine": "0"},
            start_time=None,
            time=point,
            value=500.0,
        )
        store.insert("otel_metrics_gauge", [late.to_insert_row(), late.to_insert_row()], GAUGE_COLUMNS)
        after = fetch_window_signals(store, windows["window_start"], end)
        assert after == fetch_window_signals_rows(store, windows["window_start"], end)
        assert after.gauges["queue_depth"].max >= 500.0


# ---------------------------------------------------------------------------- both windows per scan


@pytest.mark.parametrize("layout", ["adjacent", "overlapping", "apart"])
def test_a_pair_of_stored_windows_equals_each_windows_rows(tmp_path, layout) -> None:
    with Store.open(f"chdb://{tmp_path / 'store'}") as store:
        windows = load_scenario(store, SCENARIOS["cold_start"])
        # The hop into the engine's trip out on a third of the rows with a hop (the scenario's
        # rows carry none): both paths must read it alike, NULLs included.
        store.command(
            "ALTER TABLE inferpath_requests UPDATE engine_send_ns = intDiv(network_ns, 2) "
            "WHERE network_ns IS NOT NULL AND cityHash64(trace_id) % 3 = 0 SETTINGS mutations_sync = 2"
        )
        current = (windows["window_start"], windows["window_end"])
        baseline = {
            "adjacent": (windows["baseline_start"], windows["baseline_end"]),
            "overlapping": (windows["baseline_start"], windows["window_start"] + timedelta(minutes=3)),
            "apart": (windows["baseline_start"], windows["baseline_start"] + timedelta(minutes=4)),
        }[layout]
        rows = [
            RowsWindow(fetch_request_rows(store, start=s, end=e, columns=DIAGNOSIS_COLUMNS))
            for s, e in (current, baseline)
        ]
        pair = StoredWindow.pair(store, current, baseline)
        edges = [r.quantile("ttft_ns", 0.9) for r in rows]
        prepare_attribution(pair[0], pair[1], "ttft", *edges)
        excluded = [r["trace_id"] for r in rows[0].rows if r["replica"] == "engine-1"][:40]
        for stored, held, edge in zip(pair, rows, edges):
            assert len(stored) == len(held) > 0
            assert stored.replicas() == held.replicas() and len(held.replicas()) >= 1
            assert stored.replica_spans() == held.replica_spans()
            for column in MEASURED_COLUMNS:
                assert stored.measured(column) == held.measured(column), column
                for q in (*QUANTILE_LEVELS, 0.75):
                    expected = held.quantile(column, q)
                    # The scenario's rows carry no TTFT-phase parts (no streamed hop): NULL on both paths.
                    if column in TTFT_PHASE_COLUMNS.values():
                        assert expected is None and stored.quantile(column, q) is None, column
                        continue
                    assert expected is not None, column
                    assert stored.quantile(column, q) == pytest.approx(expected, rel=1e-12), (column, q)
            for exclude in ((), excluded):
                assert stored.tail_sums("ttft", edge, exclude) == held.tail_sums("ttft", edge, exclude)
            assert stored.tail_sums("e2e", edge) == held.tail_sums("e2e", edge)  # not prepared: its own query


def test_a_healthy_verdict_or_a_thin_window_costs_a_few_scans(tmp_path) -> None:
    with Store.open(f"chdb://{tmp_path / 'store'}") as store:
        windows = load_scenario(store, SCENARIOS["healthy"])
        counting = CountingStore(store)
        verdict = diagnose(counting, **windows)
        # The window's failed requests (one scan of the rows that did not end ok), both windows'
        # compared measures in one scan, then each window's objectives per class, and the
        # engine's TTFT histogram (do the spans hold the requests it counted?).
        assert verdict.healthy and len(counting.sql) == 5
        assert "otel_metrics_histogram" in counting.sql[-1]
        assert sum("status != 'ok'" in sql for sql in counting.sql) == 1  # none failed: no times read
        counting.sql.clear()
        thin = diagnose(
            counting,
            window_start=windows["window_start"],
            window_end=windows["window_end"],
            baseline_start=T0 - timedelta(hours=2),
            baseline_end=T0 - timedelta(hours=1),
        )
        assert thin.healthy and "baseline ignored" in thin.notes[0] and len(counting.sql) == 4
        counting.sql.clear()
        with pytest.raises(InsufficientDataError, match="insufficient data: 0 requests"):
            diagnose(counting, window_start=T0 - timedelta(hours=2), window_end=T0 - timedelta(hours=1))
        assert len(counting.sql) == 3  # the failed requests, the count, the engine's histograms


# ---------------------------------------------------------------------------- a wide diagnosis


def test_a_diagnosis_over_two_wide_windows_equals_the_diagnosis_of_their_rows(tmp_path) -> None:
    with Store.open(f"chdb://{tmp_path / 'store'}") as store:
        windows = _load_wide(store)
        gauge_rollup.backfill(store)  # as the server does at start; the view saw every sample
        counting = CountingStore(store)
        got = verdict_to_dict(diagnose(counting, **windows))
        expected = _python_diagnosis(store, windows)
    _assert_same(got, expected)
    assert not got["healthy"] and got["top_cause"] == "gpu_memory"
    assert any(gauge_rollup.GAUGE_ROLLUP_TABLE in sql for sql in counting.sql)
    # One replica in both windows and no start-up: the cold-start rule reads no replica spans;
    # request rows are read by three scans (compared measures; the tail band's stages; the
    # evidence's quantiles), the objectives per class, one scan per window, and the failed
    # requests, one scan of the rows that did not end ok.
    assert not any("GROUP BY replica" in sql for sql in counting.sql)
    assert sum("FROM inferpath_requests" in sql for sql in counting.sql) == 6
    kv = next(e for c in got["causes"] for e in c["evidence"] if e["measure"] == "kv_cache_usage_ratio")
    assert kv["current"] >= 0.9 > kv["baseline"]


@pytest.mark.parametrize("layout", ["wide adjacent", "narrow adjacent", "apart", "overlapping", "uneven"])
def test_both_windows_signals_read_together_equal_each_windows_samples(tmp_path, layout) -> None:
    with Store.open(f"chdb://{tmp_path / 'store'}") as store:
        windows = _load_wide(store)
        gauge_rollup.backfill(store)
        end = windows["window_end"]
        hour = timedelta(hours=1)
        current, baseline = {
            "wide adjacent": ((windows["window_start"], end), (windows["baseline_start"], windows["baseline_end"])),
            "narrow adjacent": ((end - hour, end), (end - 2 * hour, end - hour)),  # 6 s steps, the incident
            "apart": ((end - hour, end), (end - 5 * hour, end - 4 * hour)),
            "overlapping": ((end - 12 * hour, end), (end - 14 * hour, end - 2 * hour)),
            "uneven": ((end - 12 * hour, end), (end - 13 * hour, end - 12 * hour)),
        }[layout]
        counting = CountingStore(store)
        got = fetch_signal_windows(counting, current, baseline)
        assert got.current == fetch_window_signals_rows(store, *current), layout
        assert got.baseline == fetch_window_signals_rows(store, *baseline), layout
    queries = {"wide adjacent": 2, "narrow adjacent": 2, "apart": 3, "overlapping": 3, "uneven": 4}[layout]
    # (the rollup's readiness is asked once per store object, and this wrapper is a new one)
    assert len([sql for sql in counting.sql if gauge_rollup.STATE_TABLE not in sql]) == queries
    assert got.current.gauges["kv_cache_usage_ratio"].max >= 0.9
