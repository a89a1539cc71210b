"""The signal catalog: every row points at a known signal, conversions are right, units are named."""

from __future__ import annotations

import pytest

from inferpath.collectors import catalog
from inferpath.config import ScrapeTarget
from inferpath.vocabulary import SIGNALS, SOURCES


def test_every_row_maps_to_a_declared_signal_and_source():
    for row in catalog.CATALOG:
        assert row.signal in SIGNALS and row.source in SOURCES, row
    for derived in catalog.DERIVED:
        assert derived.signal in SIGNALS and derived.source in SOURCES, derived
    # Every source of the vocabulary has rows: a configured source that maps nothing would
    # scrape and store nothing.
    assert {row.source for row in catalog.CATALOG} == set(SOURCES)


def test_each_metric_name_and_label_condition_appears_once_per_source():
    keys = [(row.source, row.metric, row.labels) for row in catalog.CATALOG]
    assert len(keys) == len(set(keys))
    # A metric split by label values must give every row a condition.
    for source in SOURCES:
        for metric, rows in catalog.metrics_for(source).items():
            assert len(rows) == 1 or all(r.labels for r in rows), (source, metric)


def test_canonical_names_carry_their_unit():
    suffix_by_unit = {"By": "_bytes", "W": "_watts", "Cel": "_celsius", "Hz": "_hertz", "s": "_seconds"}
    for sig in SIGNALS.values():
        if sig.unit == "1" and sig.name not in ("gpu_clock_event_reasons", "gpu_up"):
            assert sig.name.endswith("_ratio"), sig.name
        if sig.unit in suffix_by_unit:
            assert sig.name.endswith(suffix_by_unit[sig.unit]), sig.name
        if sig.kind == "sum":
            assert sig.name.endswith("_total"), sig.name


def test_conversions():
    assert catalog.percent_to_ratio(87.0) == pytest.approx(0.87)
    assert catalog.mib_to_bytes(46067) == 46067 * 1048576
    assert catalog.mhz_to_hertz(1980) == 1.98e9
    assert catalog.milliwatts_to_watts(71234) == pytest.approx(71.234)
    assert catalog.milliseconds_to_seconds(250) == 0.25
    rows = {name: r[0] for name, r in catalog.metrics_for("dcgm").items()}
    assert rows["DCGM_FI_DEV_GPU_UTIL"].convert(50) == 0.5
    assert rows["DCGM_FI_DEV_FB_USED"].convert(1) == 1048576
    assert rows["DCGM_FI_DEV_POWER_USAGE"].convert(35.686) == 35.686
    assert rows["DCGM_FI_DEV_SM_CLOCK"].convert(210) == 210e6
    assert catalog.metrics_for("triton")["nv_gpu_utilization"][0].convert(0.5) == 0.5
    assert catalog.metrics_for("triton")["nv_inference_first_response_histogram_ms"][0].convert(100) == 0.1
    for name, (signal, _convert) in catalog.NVML_CONVERSIONS.items():
        assert signal in SIGNALS, name
    assert catalog.NVML_CONVERSIONS["nvmlDeviceGetPowerUsage"][1](35686) == pytest.approx(35.686)


def test_old_and_new_vllm_names_meet_in_one_signal():
    rows = {name: r[0] for name, r in catalog.metrics_for("vllm").items()}
    assert rows["vllm:kv_cache_usage_perc"].signal == rows["vllm:gpu_cache_usage_perc"].signal == "kv_cache_usage_ratio"
    assert rows["vllm:gpu_cache_usage_perc"].deprecated and not rows["vllm:kv_cache_usage_perc"].deprecated
    assert rows["vllm:num_preemptions_total"].signal == rows["vllm:num_preemptions"].signal == "preemptions_total"


def test_model_server_protocol_signals_for_every_engine():
    # Gateway API Inference Extension, model-server protocol: TotalQueuedRequests,
    # TotalRunningRequests, KVCacheUtilization per engine.
    expected = {
        "vllm": {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"},
        "sglang": {"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"},
        "triton": {"nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics"},
        "trtllm": {"trtllm_num_requests_waiting", "trtllm_num_requests_running", "trtllm_kv_cache_utilization"},
    }
    for source, names in expected.items():
        assert names <= set(catalog.metrics_for(source)), source
        assert set(catalog.expected_signals(source)) == {"queue_depth", "running_requests", "kv_cache_usage_ratio"}
    trt = {r.labels: r.signal for r in catalog.metrics_for("triton")["nv_trt_llm_request_metrics"]}
    assert trt == {(("request_type", "waiting"),): "queue_depth", (("request_type", "scheduled"),): "running_requests"}
    assert catalog.expected_signals("tgi") == ("queue_depth",)
    assert catalog.expected_signals("dcgm") == ("gpu_utilization_ratio", "gpu_memory_used_bytes", "gpu_power_watts")


def test_combination_rules():
    assert catalog.signal("queue_depth").combine == "sum"
    assert catalog.signal("kv_cache_usage_ratio").combine == "max"
    assert catalog.signal("time_to_first_token_seconds").kind == "histogram"
    assert catalog.signal("gpu_power_watts").combine == "device"


def test_settings_and_collect_accept_every_catalog_source():
    configured = set(ScrapeTarget.model_fields["source"].annotation.__args__)
    assert configured == set(SOURCES) == {"dcgm", "vllm", "sglang", "tgi", "triton", "trtllm"}


def test_unknown_source_names_the_field():
    with pytest.raises(ValueError, match="source"):
        catalog.metrics_for("nvml-typo")
