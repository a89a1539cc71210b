"""Per-minute request rollups: exact counts and means, DDSketch percentiles within 1 % of the
exact ones, re-derived rows counted once, ragged edges and recent minutes read raw."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread
from inferpath.storage import rollup
from inferpath.storage.reader import Reader
from inferpath.storage.rows import REQUEST_COLUMNS, RequestRow
from inferpath.storage.store import Store
from inferpath.vocabulary import REQUEST_MEASURES

MS = 1_000_000
START = (datetime.now(timezone.utc) - timedelta(hours=7)).replace(minute=0, second=0, microsecond=0)
HOURS = 6


def _rows(count: int, *, seed: int = 3, updated_at: datetime | None = None, ttft_scale: float = 1.0) -> list:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        ttft = int(150 * MS * ttft_scale * rng.lognormvariate(0, 0.7))
        rows.append(
            RequestRow(
                timestamp=START + timedelta(seconds=HOURS * 3600 * i / count),
                trace_id=f"{seed:08x}{i:024x}",
                endpoint="/v1/chat/completions",
                endpoint_class="bulk" if i % 4 == 0 else "interactive",
                status="error" if i % 37 == 0 else "ok",
                http_status_code=200,
                client_ttft_ns=ttft + 2 * MS if i % 3 else None,
                ttft_ns=ttft,
                e2e_ns=ttft + int(1e9 * rng.random()),
                itl_ns=int(20 * MS * rng.lognormvariate(0, 0.2)),
                queue_ns=int(30 * MS * rng.lognormvariate(0, 1.0)),
                updated_at=updated_at or START + timedelta(hours=HOURS),
            ).to_insert_row()
        )
    return rows


@pytest.fixture()
def store(store_url):
    with Store.open(store_url) as opened:
        opened.insert("inferpath_requests", _rows(20_000), REQUEST_COLUMNS)
        yield opened


def _exact(store, start, end, column, endpoint_class=None):
    where = "timestamp >= {a:DateTime64(9, 'UTC')} AND timestamp < {b:DateTime64(9, 'UTC')}"
    params = {"a": start, "b": end}
    if endpoint_class:
        where += " AND endpoint_class = {c:String}"
        params["c"] = endpoint_class
    count, avg, q = store.query(
        f"SELECT count({column}), avg({column}), quantilesExactInclusive(0.5, 0.95, 0.99)({column})"
        f" FROM inferpath_requests FINAL WHERE {where}",
        params,
    )[0]
    return int(count), avg / 1e9, [v / 1e9 for v in q]


def test_wide_summary_from_the_rollup_matches_exact_within_one_percent(store):
    result = rollup.refresh(store)
    assert result.minutes == HOURS * 60
    assert store.query(f"SELECT sum(requests) FROM {rollup.HOURLY_TABLE} FINAL")[0][0] == 20_000
    exact_reader, rollup_reader = Reader(store), Reader(store, rollup_min_window_seconds=3600)
    # Ragged edges on both sides: 20 s into the first minute, 40 s before the last.
    start, end = START + timedelta(seconds=20), START + timedelta(hours=HOURS, seconds=-40)
    plan = rollup_reader.rollup_plan(start, end)
    assert plan.raw  # the edges are read raw
    assert any(table == rollup.HOURLY_TABLE for table, _, _ in plan.tiers)
    exact = exact_reader.summary(start, end)
    approximate = rollup_reader.summary(start, end)
    assert exact["percentiles"] == "exact" and approximate["percentiles"] == "ddsketch"
    assert approximate["request_count"] == exact["request_count"] == _count(store, start, end)
    for want, got in zip(exact["measures"], approximate["measures"]):
        assert got["measure"] == want["measure"] and got["count"] == want["count"]
        if want["count"] == 0:
            assert got["p99_seconds"] is None
            continue
        assert got["avg_seconds"] == pytest.approx(want["avg_seconds"], rel=1e-9)
        for key in ("p50_seconds", "p95_seconds", "p99_seconds"):
            assert got[key] == pytest.approx(want[key], rel=0.01), (want["measure"], key)
    assert [m["measure"] for m in approximate["measures"]] == list(REQUEST_MEASURES)


def _count(store, start, end) -> int:
    return store.query(
        "SELECT count() FROM inferpath_requests FINAL WHERE timestamp >= {a:DateTime64(9, 'UTC')}"
        " AND timestamp < {b:DateTime64(9, 'UTC')}",
        {"a": start, "b": end},
    )[0][0]


def test_a_re_derived_request_replaces_its_old_version_in_the_rollup(store):
    rollup.refresh(store)
    reader = Reader(store, rollup_min_window_seconds=0)
    start, end = START, START + timedelta(hours=HOURS)
    before = reader.summary(start, end)
    # Late spans re-derive every row of the first hour with a 10x TTFT and a newer version.
    later = datetime.now(timezone.utc)
    store.insert(
        "inferpath_requests", _rows(20_000, updated_at=later, ttft_scale=10.0)[: 20_000 // HOURS], REQUEST_COLUMNS
    )
    assert reader.summary(start, end)["measures"][2]["avg_seconds"] == pytest.approx(
        before["measures"][2]["avg_seconds"], rel=1e-9
    ), "unchanged until the next pass"
    result = rollup.refresh(store)
    assert result.minutes == 60  # only the first hour's minutes are rebuilt
    after = reader.summary(start, end)
    assert after["request_count"] == before["request_count"] == 20_000
    count, avg, _ = _exact(store, start, end, "ttft_ns")
    ttft = after["measures"][2]
    assert ttft["measure"] == "ttft" and ttft["count"] == count
    assert ttft["avg_seconds"] == pytest.approx(avg, rel=1e-9)
    assert ttft["avg_seconds"] > 2 * before["measures"][2]["avg_seconds"]


def test_minutes_after_the_horizon_and_without_a_pass_are_read_raw(store):
    reader = Reader(store, rollup_min_window_seconds=0)
    start, end = START, START + timedelta(hours=HOURS)
    assert reader.rollup_plan(start, end) is None  # no pass yet: exact
    rollup.refresh(store, now=START + timedelta(hours=3))  # watermark 3 h in, minus the margin
    plan = reader.rollup_plan(start, end)
    assert plan.rollup[1] <= START + timedelta(hours=3) and plan.raw[-1][1] == end
    assert reader.summary(start, end)["request_count"] == 20_000
    assert reader.summary(start, end)["measures"][0]["count"] == _exact(store, start, end, "client_ttft_ns")[0]


def test_plan_window_aligns_to_the_step_and_rejects_odd_alignments():
    start = datetime(2026, 1, 1, 0, 0, 10, tzinfo=timezone.utc)
    plan = rollup.plan_window(start, start + timedelta(hours=2), start + timedelta(hours=3), align_seconds=300)
    assert plan.rollup == (
        datetime(2026, 1, 1, 0, 5, tzinfo=timezone.utc),
        datetime(2026, 1, 1, 2, 0, tzinfo=timezone.utc),
    )
    assert plan.raw == ((start, plan.rollup[0]), (plan.rollup[1], start + timedelta(hours=2)))
    # 00:05-01:00 from minutes, 01:00-02:00 from the hourly tier (no step: one group).
    assert plan.tiers == (
        (rollup.ROLLUP_TABLE, plan.rollup[0], plan.rollup[0].replace(hour=1, minute=0)),
        (rollup.HOURLY_TABLE, plan.rollup[0].replace(hour=1, minute=0), plan.rollup[1]),
    )
    minutes_only = rollup.plan_window(
        start, start + timedelta(hours=2), start + timedelta(hours=3), align_seconds=300, hourly=False
    )
    assert minutes_only.tiers == ((rollup.ROLLUP_TABLE, *plan.rollup),)
    assert rollup.plan_window(start, start + timedelta(minutes=3), None).rollup is None
    with pytest.raises(ValueError, match="align_seconds"):
        rollup.plan_window(start, start + timedelta(hours=1), None, align_seconds=90)


def test_latency_view_over_a_wide_window_reads_the_rollup_through_the_api(store_url):
    with Store.open(store_url) as store:
        store.insert("inferpath_requests", _rows(20_000), REQUEST_COLUMNS)
    settings = Settings(store_url=store_url, rollup_min_window_seconds=3600, rollup_interval_seconds=3600)
    with serve_in_thread(settings, port=0) as running:
        running.runtime.refresh_rollups()
        window = {"start": START.isoformat(), "end": (START + timedelta(hours=HOURS)).isoformat()}
        with httpx.Client(base_url=running.url, timeout=60) as http:
            view = http.get("/api/v1/views/latency", params={**window, "max_points": 100}).json()
            summary = http.get("/api/v1/summary", params=window).json()
            narrow = http.get(
                "/api/v1/summary",
                params={"start": START.isoformat(), "end": (START + timedelta(minutes=30)).isoformat()},
            ).json()
            metrics = http.get("/metrics").text
        store = running.runtime.store
        assert view["percentiles"] == "ddsketch" and view["step_seconds"] % 60 == 0
        assert view["step_seconds"] >= HOURS * 3600 / 100
        assert sum(p["requests"] for p in view["points"]) == 20_000
        assert sum(p["errors"] for p in view["points"]) == len(range(0, 20_000, 37))
        first = view["points"][0]
        bucket_end = START + timedelta(seconds=view["step_seconds"])
        count, avg, q = _exact(store, START, bucket_end, "coalesce(client_ttft_ns, ttft_ns)", first["endpoint_class"])
        assert first["ttft_avg_seconds"] == pytest.approx(avg, rel=1e-9)
        # A bucket holds ~50 requests: the sketch's p99 is (within 0.5 %) one of the two
        # values whose ranks bracket the 99th percentile, not an interpolation between them.
        values = sorted(
            v / 1e9
            for (v,) in store.query(
                "SELECT coalesce(client_ttft_ns, ttft_ns) FROM inferpath_requests FINAL"
                " WHERE timestamp >= {a:DateTime64(9, 'UTC')} AND timestamp < {b:DateTime64(9, 'UTC')}"
                " AND endpoint_class = {c:String}",
                {"a": START, "b": bucket_end, "c": first["endpoint_class"]},
            )
        )
        rank = 0.99 * (len(values) - 1)
        low, high = values[int(rank)], values[min(int(rank) + 1, len(values) - 1)]
        assert low * 0.995 <= first["ttft_p99_seconds"] <= high * 1.005
        assert summary["percentiles"] == "ddsketch" and summary["request_count"] == 20_000
        assert narrow["percentiles"] == "exact"
        assert "inferpath_rollup_passes_total 1.0" in metrics


def test_a_request_re_derived_into_another_group_leaves_no_stale_group(store):
    """A partial row (no endpoint yet) re-derived with its endpoint moves to another group:
    the rebuilt minute must not keep the vanished group (its request would count twice)."""
    rollup.refresh(store)
    reader = Reader(store, rollup_min_window_seconds=0)
    start, end = START, START + timedelta(hours=HOURS)
    t = START + timedelta(minutes=90, seconds=30)
    partial = RequestRow(
        timestamp=t, trace_id="f" * 32, status="incomplete", ttft_ns=5 * MS, updated_at=datetime.now(timezone.utc)
    )
    store.insert("inferpath_requests", [partial.to_insert_row()], REQUEST_COLUMNS)
    rollup.refresh(store)
    assert reader.summary(start, end)["request_count"] == 20_001
    whole = RequestRow(
        timestamp=t,
        trace_id="f" * 32,
        endpoint="/v1/chat/completions",
        endpoint_class="interactive",
        status="ok",
        ttft_ns=6 * MS,
        updated_at=datetime.now(timezone.utc) + timedelta(seconds=1),
    )
    store.insert("inferpath_requests", [whole.to_insert_row()], REQUEST_COLUMNS)
    rollup.refresh(store)
    summary = reader.summary(start, end)
    assert summary["percentiles"] == "ddsketch"
    assert summary["request_count"] == 20_001 == _count(store, start, end)
    by_hour = rollup.aggregate(
        store, reader.rollup_plan(start, end, step_seconds=3600), measures=["ttft"], step_seconds=3600
    )
    assert sum(row["requests"] for row in by_hour) == 20_001


def test_a_filter_matching_nothing_over_a_wide_window_gives_empty_measures(store):
    rollup.refresh(store)
    reader = Reader(store, rollup_min_window_seconds=0)
    summary = reader.summary(START, START + timedelta(hours=HOURS), endpoint_class="no-such-class")
    assert summary["percentiles"] == "ddsketch" and summary["request_count"] == 0
    assert all(m["count"] == 0 and m["p99_seconds"] is None for m in summary["measures"])
