"""The read API's service / model / replica filters, on a real chDB store behind a real
server on loopback: each filter keeps only its rows on /summary, /requests,
/requests/count, /views/latency, /views/breakdown and /diagnosis; over a window the rollups would
serve, a filtered answer is read from the raw rows and equals the exact one."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import httpx
import numpy as np
import pytest

from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread
from inferpath.storage.rows import REQUEST_COLUMNS, RequestRow
from inferpath.storage.store import Store

MS = 1_000_000
START = (datetime.now(timezone.utc) - timedelta(hours=7)).replace(minute=0, second=0, microsecond=0)
HOURS = 4
COUNT = 2400
# Two calls made 30 minutes ago by two calling services: 300 ms and 700 ms of hop overhead.
HOP_START = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=30)
HOP_CALLS = {"caller-a": ("a" * 32, 0.3), "caller-b": ("b" * 32, 0.7)}

FILTERS = {
    "service": ("service_name", ("svc-a", "svc-b")),
    "model": ("model", ("m-1", "m-2")),
    "replica": ("replica", ("r-1", "r-2")),
}


def _requests() -> list[dict]:
    """Rows whose service, model and replica vary independently (i % 2, i // 2 % 2, i // 4 % 2)."""
    rng = random.Random(11)
    rows = []
    for i in range(COUNT):
        ttft = int(150 * MS * rng.lognormvariate(0, 0.7)) * (1 + i % 2)  # svc-b twice as slow
        rows.append(
            {
                "timestamp": START + timedelta(seconds=HOURS * 3600 * i / COUNT),
                "trace_id": f"{i:032x}",
                "service_name": ("svc-a", "svc-b")[i % 2],
                "model": ("m-1", "m-2")[i // 2 % 2],
                "replica": ("r-1", "r-2")[i // 4 % 2],
                "ttft_ns": ttft,
                "e2e_ns": ttft + int(1e9 * rng.random()),
                "queue_ns": int(30 * MS * rng.lognormvariate(0, 1.0)),
            }
        )
    return rows


ROWS = _requests()


def _span(trace_id: str, service: str, span_id: str, parent: str, kind: int, start: datetime, seconds: float) -> dict:
    start_ns = int(start.timestamp() * 1e9)
    return {
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
        "scopeSpans": [
            {
                "spans": [
                    {
                        "traceId": trace_id,
                        "spanId": span_id,
                        "parentSpanId": parent,
                        "name": f"{service} call",
                        "kind": kind,
                        "startTimeUnixNano": str(start_ns),
                        "endTimeUnixNano": str(start_ns + int(seconds * 1e9)),
                    }
                ]
            }
        ],
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    url = f"chdb://{tmp_path_factory.mktemp('filters') / 'store'}"
    with Store.open(url) as store:
        store.insert(
            "inferpath_requests",
            [
                RequestRow(
                    endpoint="/v1/chat/completions",
                    endpoint_class="interactive",
                    status="ok",
                    http_status_code=200,
                    updated_at=START + timedelta(hours=HOURS),
                    **row,
                ).to_insert_row()
                for row in ROWS
            ],
            REQUEST_COLUMNS,
        )
        # The hop calls' request rows (the assembler derives none for bare client/server
        # pairs; a later updated_at would win over one it derived).
        store.insert(
            "inferpath_requests",
            [
                RequestRow(
                    timestamp=HOP_START,
                    trace_id=trace_id,
                    service_name=caller,
                    endpoint_class="interactive",
                    status="ok",
                    http_status_code=200,
                    e2e_ns=int((1.0 + overhead) * 1e9),
                    updated_at=HOP_START + timedelta(days=1),
                ).to_insert_row()
                for caller, (trace_id, overhead) in HOP_CALLS.items()
            ],
            REQUEST_COLUMNS,
        )
    settings = Settings(
        store_url=url, rollup_min_window_seconds=3600, rollup_interval_seconds=3600, assembly_settle_seconds=0.2
    )
    with serve_in_thread(settings, port=0) as running:
        with httpx.Client(base_url=running.url, timeout=60.0) as http:
            for index, (caller, (trace_id, overhead)) in enumerate(HOP_CALLS.items()):
                client_id, server_id = f"{index + 1:016x}", f"{index + 11:016x}"
                body = {
                    "resourceSpans": [
                        _span(trace_id, caller, client_id, "", 3, HOP_START, 1.0 + overhead),
                        _span(trace_id, "callee", server_id, client_id, 2, HOP_START + timedelta(milliseconds=50), 1.0),
                    ]
                }
                assert http.post("/v1/traces", json=body).status_code == 200
            assert http.post("/api/v1/flush", timeout=120).json()["ok"]
        running.runtime.refresh_rollups()
        yield running.url


WIDE = {"start": START.isoformat(), "end": (START + timedelta(hours=HOURS)).isoformat()}


def _rows_where(column: str, value: str) -> list[dict]:
    return [row for row in ROWS if row[column] == value]


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_each_filter_keeps_only_its_rows_on_every_route(server, name) -> None:
    column, values = FILTERS[name]
    with httpx.Client(base_url=server, timeout=60.0) as http:
        totals = 0
        for value in values:
            expected = _rows_where(column, value)
            params = {**WIDE, name: value}
            rows = http.get("/api/v1/requests", params={**params, "limit": 10_000}).json()["requests"]
            assert len(rows) == len(expected) == COUNT // 2
            assert {row[column] for row in rows} == {value}
            assert {row["trace_id"] for row in rows} == {row["trace_id"] for row in expected}
            assert http.get("/api/v1/requests/count", params=params).json()["count"] == len(expected)
            summary = http.get("/api/v1/summary", params=params).json()
            assert summary["request_count"] == len(expected)
            view = http.get("/api/v1/views/latency", params={**params, "max_points": 50}).json()
            assert view["percentiles"] == "exact"
            assert sum(point["requests"] for point in view["points"]) == len(expected)
            breakdown = http.get("/api/v1/views/breakdown", params=params).json()
            assert breakdown["request_count"] == len(expected)
            assert sum(band["count"] for band in breakdown["bands"]["ttft"]) == len(expected)
            totals += summary["request_count"]
        assert totals == http.get("/api/v1/requests/count", params=WIDE).json()["count"] == COUNT


def test_filters_combine_and_a_value_matching_nothing_gives_nothing(server) -> None:
    with httpx.Client(base_url=server, timeout=60.0) as http:
        params = {**WIDE, "service": "svc-a", "model": "m-2", "replica": "r-1"}
        expected = [r for r in ROWS if (r["service_name"], r["model"], r["replica"]) == ("svc-a", "m-2", "r-1")]
        assert http.get("/api/v1/requests/count", params=params).json()["count"] == len(expected) == COUNT // 8
        # Values are bound, not pasted into the SQL.
        for value in ("svc-a' OR 1=1 --", "nope"):
            assert http.get("/api/v1/requests/count", params={**WIDE, "service": value}).json()["count"] == 0
            summary = http.get("/api/v1/summary", params={**WIDE, "service": value}).json()
            assert summary["request_count"] == 0 and summary["measures"][0]["count"] == 0


def test_a_filtered_wide_window_reads_the_raw_rows_and_equals_the_exact_answer(server) -> None:
    with httpx.Client(base_url=server, timeout=60.0) as http:
        unfiltered = http.get("/api/v1/summary", params=WIDE).json()
        unfiltered_view = http.get("/api/v1/views/latency", params={**WIDE, "max_points": 50}).json()
        filtered = http.get("/api/v1/summary", params={**WIDE, "service": "svc-b"}).json()
        view = http.get("/api/v1/views/latency", params={**WIDE, "service": "svc-b", "max_points": 50}).json()
    # The window is wide enough for the rollups: unfiltered, they serve it.
    assert unfiltered["percentiles"] == "ddsketch" and unfiltered_view["percentiles"] == "ddsketch"
    assert filtered["percentiles"] == "exact" and view["percentiles"] == "exact"
    ttft = np.array([row["ttft_ns"] for row in _rows_where("service_name", "svc-b")], dtype=float) / 1e9
    measure = next(m for m in filtered["measures"] if m["measure"] == "ttft")
    assert measure["count"] == len(ttft)
    assert measure["avg_seconds"] == pytest.approx(ttft.mean(), rel=1e-9)
    for q in (50, 95, 99):
        assert measure[f"p{q}_seconds"] == pytest.approx(np.percentile(ttft, q), rel=1e-9)
    # The view's per-bucket means recombine into the same mean.
    weighted = sum(p["ttft_avg_seconds"] * p["requests"] for p in view["points"])
    assert weighted / sum(p["requests"] for p in view["points"]) == pytest.approx(ttft.mean(), rel=1e-9)
    assert unfiltered["request_count"] == COUNT and filtered["request_count"] == COUNT // 2


def test_breakdown_hops_are_those_of_the_filtered_requests(server) -> None:
    window = {
        "start": (HOP_START - timedelta(minutes=1)).isoformat(),
        "end": (HOP_START + timedelta(minutes=1)).isoformat(),
    }
    with httpx.Client(base_url=server, timeout=60.0) as http:
        every = http.get("/api/v1/views/breakdown", params=window).json()
        assert {hop["caller_service"] for hop in every["hops"]} == set(HOP_CALLS)
        for caller, (_, overhead) in HOP_CALLS.items():
            body = http.get("/api/v1/views/breakdown", params={**window, "service": caller}).json()
            assert body["request_count"] == 1 and body["hop_percentiles"] == "exact"
            (hop,) = body["hops"]
            assert hop["caller_service"] == caller and hop["callee_service"] == "callee"
            assert hop["avg_seconds"] == pytest.approx(overhead, abs=1e-6)


def test_the_correlate_view_counts_only_the_filtered_requests(server) -> None:
    with httpx.Client(base_url=server, timeout=60.0) as http:
        for service in ("svc-a", "svc-b"):
            body = http.get("/api/v1/views/correlate", params={**WIDE, "service": service, "max_points": 50}).json()
            assert sum(point["requests"] for point in body["points"]) == len(_rows_where("service_name", service))
        bulk = http.get("/api/v1/views/correlate", params={**WIDE, "endpoint_class": "bulk", "max_points": 50}).json()
        assert sum(point["requests"] for point in bulk["points"]) == 0


def test_the_diagnosis_judges_only_the_filtered_requests(server) -> None:
    with httpx.Client(base_url=server, timeout=60.0) as http:
        for service in ("svc-a", "svc-b"):
            response = http.get("/api/v1/diagnosis", params={**WIDE, "service": service})
            assert response.status_code == 200, response.text
            verdict = response.json()
            expected = _rows_where("service_name", service)
            assert verdict["current_requests"] == len(expected)
            ttft = np.array([row["ttft_ns"] for row in expected], dtype=float)
            (p99,) = [o for o in verdict["objectives"] if o["measure"] == "ttft" and o["quantile"] == 0.99]
            assert p99["requests"] == len(expected)
            assert p99["value_ns"] == pytest.approx(np.percentile(ttft, 99), rel=1e-6)
        # Every row is interactive: the filter that matched nothing is named, not the window.
        bulk = http.get("/api/v1/diagnosis", params={**WIDE, "endpoint_class": "bulk"})
        assert bulk.status_code == 422 and bulk.json()["detail"][0]["loc"] == ["query", "endpoint_class"]
        nothing = http.get("/api/v1/diagnosis", params={**WIDE, "service": "nope"})
        assert nothing.status_code == 422 and nothing.json()["detail"][0]["loc"] == ["query", "service"]
        assert "no request of service 'nope' in the window" in nothing.json()["detail"][0]["msg"]


ROUTES = ("/api/v1/summary", "/api/v1/requests", "/api/v1/requests/count", "/api/v1/views/latency")


@pytest.mark.parametrize("route", (*ROUTES, "/api/v1/views/breakdown", "/api/v1/views/correlate", "/api/v1/diagnosis"))
@pytest.mark.parametrize("name", sorted(FILTERS))
def test_an_empty_or_over_long_filter_is_refused_naming_it(server, route, name) -> None:
    with httpx.Client(base_url=server, timeout=60.0) as http:
        for value in ("", "x" * 257):
            response = http.get(route, params={**WIDE, name: value})
            assert response.status_code == 422, response.text
            assert [error["loc"] for error in response.json()["detail"]] == [["query", name]]
        accepted = http.get(route, params={**WIDE, name: "x" * 256})
        # The diagnosis refuses to judge the no requests such a value matches, and says so.
        assert accepted.status_code == 200 or (route.endswith("diagnosis") and "no request of" in accepted.text)
