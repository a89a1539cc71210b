"""Figures and tables of the Overview, Correlate, Breakdown, Trace and GPU pages, on small
view bodies shaped as the read API sends them (no browser)."""

from __future__ import annotations

import pandas as pd
import pytest

from inferpath.dashboard import charts, fleet, waterfall
from inferpath.dashboard.figures import NO_DATA

T0 = "2026-11-30T11:00:00Z"


def _point(second: int, **values) -> dict:
    return {"time": f"2026-11-30T11:00:{second:02d}Z", **values}


def test_wall_time_converts_utc_to_the_chosen_zone_across_a_dst_change() -> None:
    # 2026-03-29 01:30 UTC is after the switch to summer time in Berlin (UTC+2).
    shown = charts.wall_time(["2026-03-29T00:30:00Z", "2026-03-29T01:30:00Z"], "Europe/Berlin")
    assert list(shown) == [pd.Timestamp("2026-03-29 01:30"), pd.Timestamp("2026-03-29 03:30")]
    assert shown.dt.tz is None
    assert list(charts.wall_time([1796037411], "UTC")) == [pd.Timestamp("2026-11-30 11:16:51")]
    with pytest.raises(KeyError):  # zoneinfo's ZoneInfoNotFoundError
        charts.wall_time([T0], "Mars/Olympus")


def test_latency_figures_per_class_with_rates_and_tail_ratio() -> None:
    view = {
        "step_seconds": 10,
        "points": [
            {
                "bucket": T0,
                "endpoint_class": "",
                "requests": 20,
                "errors": 2,
                **{f"ttft_{s}_seconds": v for s, v in (("avg", 0.2), ("p50", 0.1), ("p95", 0.5), ("p99", 0.8))},
                **{f"e2e_{s}_seconds": 1.0 for s in ("avg", "p50", "p95", "p99")},
                **{f"itl_{s}_seconds": None for s in ("avg", "p50", "p95", "p99")},
            }
        ],
    }
    figures = charts.latency_by_class(view, "UTC")
    assert list(figures) == ["unclassified"]
    figure = figures["unclassified"]
    by_name = {trace.name: trace for trace in figure.data}
    assert list(by_name["requests/s"].y) == [2.0] and list(by_name["errors/s"].y) == [0.2]
    assert list(by_name["TTFT p99/mean"].y) == [pytest.approx(4.0)]
    assert "ITL p50" not in by_name  # not measured: no line, an annotation instead
    assert "no ITL measured" in [a.text for a in figure.layout.annotations]


def test_a_class_with_no_ttft_or_itl_keeps_the_windows_time_axis() -> None:
    # Client-only rows of an instrumentation that records no TTFT: every TTFT and ITL point null.
    points = [
        {
            "bucket": (pd.Timestamp(T0) + pd.Timedelta(seconds=10 * i)).isoformat(),
            "endpoint_class": "interactive",
            "requests": 3,
            "errors": 0,
            **{f"{m}_{s}_seconds": None for m in ("ttft", "itl") for s in ("avg", "p50", "p95", "p99")},
            **{f"e2e_{s}_seconds": 0.3 for s in ("avg", "p50", "p95", "p99")},
        }
        for i in range(6)
    ]
    figure = charts.latency_by_class({"step_seconds": 10, "points": points}, "UTC")["interactive"]
    start, end = (pd.Timestamp(v) for v in figure.layout.xaxis.range)
    assert start == pd.Timestamp(charts.wall_time([T0], "UTC")[0])
    assert end - start == pd.Timedelta(seconds=60)
    texts = [a.text for a in figure.layout.annotations]
    assert "no TTFT measured" in texts and "no ITL measured" in texts


def test_lines_break_across_buckets_without_requests() -> None:
    def point(seconds: int) -> dict:
        return {
            "bucket": (pd.Timestamp(T0) + pd.Timedelta(seconds=seconds)).isoformat(),
            "endpoint_class": "interactive",
            "requests": 5,
            "errors": 0,
            **{f"{m}_{s}_seconds": 0.2 for m in ("ttft", "itl", "e2e") for s in ("avg", "p50", "p95", "p99")},
        }

    view = {"step_seconds": 10, "points": [point(t) for t in (0, 10, 20, 100, 110)]}
    by_name = {trace.name: trace for trace in charts.latency_by_class(view, "UTC")["interactive"].data}
    seconds = [
        (pd.Timestamp(x) - pd.Timestamp(charts.wall_time([T0], "UTC")[0])).seconds for x in by_name["TTFT p99"].x
    ]
    assert seconds == [0, 10, 20, 30, 90, 100, 110]
    assert [None if y is None or y != y else y for y in by_name["TTFT p99"].y] == [200, 200, 200, None, None, 200, 200]
    assert list(by_name["requests/s"].y) == [0.5, 0.5, 0.5, 0.0, 0.0, 0.5, 0.5]


def test_band_shares_and_hops_tables() -> None:
    bands = [
        {
            "group": "p0-50",
            "count": 5,
            "total_mean_ns": 1e8,
            "stage_share": {"queue": 0.5, "prefill": 0.6, "rest": -0.1},
            "stage_mean_ns": {"queue": 5e7, "prefill": 6e7, "rest": -1e7},
        }
    ]
    figure = charts.band_shares_figure(bands, measure="ttft")
    assert [trace.name for trace in figure.data] == ["queue", "prefill", "rest"]
    assert list(figure.data[2].x) == [pytest.approx(-10.0)]  # overlap is shown, not clipped
    assert NO_DATA in [a.text for a in charts.band_shares_figure([], measure="e2e").layout.annotations]
    hops = charts.hops_table(
        [
            {
                "caller_service": "gw",
                "callee_service": "engine",
                "callee_span": "llm_request",
                "count": 3,
                "avg_seconds": 0.002,
                "p50_seconds": 0.001,
                "p95_seconds": None,
                "p99_seconds": 0.004,
            }
        ]
    )
    assert hops.loc[0, "callee"] == "engine (llm_request)" and hops.loc[0, "avg_ms"] == 2.0
    assert pd.isna(hops.loc[0, "p95_ms"])


def _spans() -> pd.DataFrame:
    base = 1_796_037_400_000_000_000
    rows = [
        (
            "c" * 16,
            "",
            "demo-client",
            "chat m",
            "Client",
            0,
            1_000,
            {
                "gen_ai.response.time_to_first_chunk": "0.2",
                "inferpath.itl_seconds": "0.1",
                "inferpath.stream.chunks": "5",
            },
        ),
        (
            "e" * 16,
            "g" * 16,
            "demo-engine",
            "llm_request",
            "Server",
            50,
            900,
            {
                "gen_ai.latency.time_in_queue": "0.05",
                "gen_ai.latency.time_in_model_prefill": "0.1",
                "gen_ai.latency.time_in_model_decode": "0.7",
            },
        ),
        ("g" * 16, "c" * 16, "demo-gateway", "POST /v1", "Server", 10, 980, {}),
    ]
    return pd.DataFrame(
        [
            {
                "span_id": s,
                "parent_span_id": p,
                "service_name": svc,
                "span_name": n,
                "span_kind": k,
                "start_ns": base + a * 1_000_000,
                "end_ns": base + b * 1_000_000,
                "span_attributes": attrs,
                "timestamp": pd.Timestamp(base + a * 1_000_000, tz="UTC"),
            }
            for s, p, svc, n, k, a, b, attrs in rows
        ]
    )


def test_waterfall_orders_children_under_parents_with_ttft_token_and_phase_marks() -> None:
    rows = waterfall.span_rows(_spans())
    assert list(rows["service_name"]) == ["demo-client", "demo-gateway", "demo-engine"]
    assert list(rows["depth"]) == [0, 1, 2]
    assert list(rows["offset_ms"]) == [0.0, 10.0, 50.0]
    figure = waterfall.waterfall_figure(_spans())
    by_name = {}
    for trace in figure.data:
        by_name.setdefault(trace.name, []).append(trace)
    first = by_name["first token (TTFT)"][0]
    assert list(first.x) == [pytest.approx(200.0)]
    ticks = by_name["tokens (at mean ITL)"][0]
    assert [round(x) for x in ticks.x] == [300, 400, 500, 600]  # 5 tokens: 4 after the first
    # Engine phases follow each other from the span's start: queue, prefill, decode.
    assert [(t.base[0], t.x[0]) for t in (by_name["queue"][0], by_name["prefill"][0], by_name["decode"][0])] == [
        (pytest.approx(50.0), pytest.approx(50.0)),
        (pytest.approx(100.0), pytest.approx(100.0)),
        (pytest.approx(200.0), pytest.approx(700.0)),
    ]


def _series(signal: str, source_metric: str, value: float, **attributes: str) -> dict:
    return {
        "signal": signal,
        "kind": "sum" if signal == "preemptions_total" else "gauge",
        "service_name": "vllm" if source_metric.startswith("vllm") else "dcgm",
        "attributes": {**attributes, "inferpath.source_metric": source_metric},
        "samples": 10,
        "last_value": value,
        "avg_value": value,
        "max_value": value,
        "min_value": value,
        "increase": 0.0,
    }


SOURCES = {
    "dcgm": {"gpu_utilization_ratio": ["DCGM_FI_DEV_GPU_UTIL"], "gpu_sm_active_ratio": ["DCGM_FI_PROF_SM_ACTIVE"]},
    "vllm": {"queue_depth": ["vllm:num_requests_waiting"], "kv_cache_usage_ratio": ["vllm:kv_cache_usage_perc"]},
    "triton": {"gpu_utilization_ratio": ["nv_gpu_utilization"]},
}


def test_fleet_tables_show_missing_signals_with_why_never_zero() -> None:
    view = {
        "sources": SOURCES,
        "series": [
            _series("gpu_utilization_ratio", "DCGM_FI_DEV_GPU_UTIL", 0.0, host="h1", UUID="GPU-1", gpu="0"),
            _series("queue_depth", "vllm:num_requests_waiting", 3, engine="0", model_name="m"),
        ],
    }
    gpus, engines, missing = fleet.fleet_tables(view)
    assert gpus.loc[0, "UUID"] == "GPU-1" and gpus.loc[0, "source"] == "dcgm"
    assert gpus.loc[0, "gpu_utilization_ratio"].startswith("0.0 %")  # a real zero stays a zero
    assert gpus.loc[0, "gpu_sm_active_ratio"] == "missing: no samples from dcgm in this window"
    assert gpus.loc[0, "gpu_power_watts"] == "missing: not exported by dcgm"
    assert engines.loc[0, "queue_depth"].startswith("3.0 (mean 3.0")
    assert engines.loc[0, "kv_cache_usage_ratio"].startswith("missing: no samples from vllm")
    assert set(missing["signal"]) >= {"gpu_sm_active_ratio", "kv_cache_usage_ratio", "batch_size"}

    no_gpus = fleet.fleet_tables({"sources": SOURCES, "series": view["series"][1:]})
    gpu_row = no_gpus[2][no_gpus[2]["kind"] == "GPU"].iloc[0]
    assert gpu_row["which"] == "all GPUs" and "dcgm, triton" in gpu_row["why"]
    assert fleet.format_signal(
        "gpu_memory_used_bytes", {"last_value": 2**31, "avg_value": 2**30, "max_value": 2**31}
    ).startswith("2.0 GiB")
