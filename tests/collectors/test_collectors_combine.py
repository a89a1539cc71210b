"""Cases 2, 3, 5 and 6: deprecated names, combining engines and pid copies, host identity, blanks."""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest

from inferpath.collectors.combine import COMBINED_ATTRIBUTE
from inferpath.collectors.identity import device_key
from inferpath.collectors.pipeline import parse_scrape
from inferpath.collectors.prometheus import signals_of

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)

OLD = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.42\n'
NEW = 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42\n'


@pytest.mark.parametrize("body", [OLD, NEW, OLD + NEW, NEW + OLD], ids=["old", "new", "both", "both-reversed"])
def test_case_2_old_new_or_both_vllm_names_give_one_kv_value(body):
    result = parse_scrape(body, "vllm", timestamp=T0)
    [kv] = [s for s in result.samples if s.signal == "kv_cache_usage_ratio"]
    assert kv.value == 0.42 and kv.unit == "1"
    assert "kv_cache_usage_ratio" not in result.missing


def test_case_2_neither_name_stores_nothing_and_says_missing():
    result = parse_scrape('vllm:num_requests_waiting{engine="0",model_name="m"} 1\n', "vllm", timestamp=T0)
    assert "kv_cache_usage_ratio" not in signals_of(result.samples)
    assert "kv_cache_usage_ratio" in result.missing


CASE_3 = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3
vllm:num_requests_waiting{engine="1",model_name="m"} 5
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.80
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.20
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 10
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 20
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="m"} 30
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 30
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 30
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 12.5
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.5",model_name="m"} 0
vllm:time_to_first_token_seconds_bucket{engine="1",le="1.0",model_name="m"} 10
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 10
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 10
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 8.0
"""


def _check_case_3(result) -> None:
    grouped = signals_of(result.samples)
    [queue] = grouped["queue_depth"]
    assert queue.value == 8 and queue.attributes == {"model_name": "m", COMBINED_ATTRIBUTE: "sum"}
    per_engine = {
        s.attributes.get("engine"): s.value
        for s in grouped["kv_cache_usage_ratio"]
        if COMBINED_ATTRIBUTE not in s.attributes
    }
    assert per_engine == {"0": 0.80, "1": 0.20}
    [pod_kv] = [s for s in grouped["kv_cache_usage_ratio"] if COMBINED_ATTRIBUTE in s.attributes]
    assert pod_kv.value == 0.80 and pod_kv.attributes == {"model_name": "m", COMBINED_ATTRIBUTE: "max"}
    [ttft] = result.histograms
    assert ttft.signal == "time_to_first_token_seconds" and ttft.unit == "s"
    assert ttft.bounds == (0.1, 0.5, 1.0)
    assert ttft.cumulative_counts == (10, 20, 40, 40)
    assert ttft.bucket_counts() == [10, 10, 20, 0]
    assert ttft.count == 40 and ttft.sum == 20.5
    assert not result.duplicated_by_pid


def test_case_3_engines_combine_by_rule():
    _check_case_3(parse_scrape(CASE_3, "vllm", timestamp=T0))


def test_case_3_shuffled_lines_change_nothing():
    lines = CASE_3.splitlines()
    reference = parse_scrape(CASE_3, "vllm", timestamp=T0)
    rng = random.Random(7)
    for _ in range(20):
        rng.shuffle(lines)
        shuffled = parse_scrape("\n".join(lines) + "\n", "vllm", timestamp=T0)
        _check_case_3(shuffled)
        assert shuffled.samples == reference.samples and shuffled.histograms == reference.histograms


def test_case_3_gauge_repeated_per_pid_is_deduplicated_and_flagged():
    lines = [f'vllm:kv_cache_usage_perc{{engine="0",model_name="m",pid="{1000 + i}"}} 0.0' for i in range(7)]
    lines.append('vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="1007"} 0.65')
    rng = random.Random(3)
    for _ in range(5):
        rng.shuffle(lines)
        result = parse_scrape("\n".join(lines) + "\n", "vllm", timestamp=T0)
        [kv] = [s for s in result.samples if s.signal == "kv_cache_usage_ratio"]
        assert kv.value == 0.65 and "pid" not in kv.attributes
        assert result.duplicated_by_pid == {"kv_cache_usage_ratio"}


def test_histograms_with_different_bounds_are_not_merged():
    body = (
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="0.2"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"} 2\n'
    )
    result = parse_scrape(body, "vllm", timestamp=T0)
    assert sorted(h.bounds for h in result.histograms) == [(0.1,), (0.2,)]


def test_triton_trt_llm_gauges_split_by_label_and_ms_histograms():
    body = """\
nv_trt_llm_request_metrics{model="ensemble",request_type="waiting",version="1"} 4
nv_trt_llm_request_metrics{model="ensemble",request_type="scheduled",version="1"} 9
nv_trt_llm_request_metrics{model="ensemble",request_type="max",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="ensemble",version="1"} 0.37
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="ensemble",version="1"} 370
nv_inference_first_response_histogram_ms_bucket{model="ensemble",version="1",le="100"} 3
nv_inference_first_response_histogram_ms_bucket{model="ensemble",version="1",le="500"} 5
nv_inference_first_response_histogram_ms_bucket{model="ensemble",version="1",le="+Inf"} 6
nv_inference_first_response_histogram_ms_count{model="ensemble",version="1"} 6
nv_inference_first_response_histogram_ms_sum{model="ensemble",version="1"} 1900
"""
    result = parse_scrape(body, "triton", timestamp=T0)
    values = {s.signal: (s.value, s.attributes) for s in result.samples}
    assert values["queue_depth"] == (4, {"model": "ensemble", "version": "1"})
    assert values["running_requests"][0] == 9
    assert values["kv_cache_usage_ratio"][0] == pytest.approx(0.37)
    [ttft] = result.histograms
    assert ttft.bounds == (0.1, 0.5) and ttft.sum == pytest.approx(1.9) and ttft.cumulative_counts == (3, 5, 6)
    assert result.missing == ()


def test_trtllm_serve_names():
    body = (
        'trtllm_num_requests_waiting{model_name="q",engine_type="trtllm"} 2\n'
        'trtllm_num_requests_running{model_name="q",engine_type="trtllm"} 7\n'
        'trtllm_kv_cache_utilization{model_name="q",engine_type="trtllm"} 0.5\n'
    )
    values = {s.signal: s.value for s in parse_scrape(body, "trtllm", timestamp=T0).samples}
    assert values == {"queue_depth": 2, "running_requests": 7, "kv_cache_usage_ratio": 0.5}


def _gpu_line(host_label: str, host: str, value: int) -> str:
    return (
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43",'
        f'modelName="NVIDIA L40S",{host_label}="{host}"}} {value}\n'
    )


def test_case_5_host_spelling_and_localhost_resolve_to_one_key():
    first = parse_scrape(_gpu_line("Hostname", "node-a", 10), "dcgm", timestamp=T0, scrape_host="10.0.0.5")
    second = parse_scrape(_gpu_line("hostname", "node-a", 20), "dcgm", timestamp=T0, scrape_host="10.0.0.6")
    third = parse_scrape(_gpu_line("hostname", "localhost", 30), "dcgm", timestamp=T0, scrape_host="10.0.0.7")
    [a], [b], [c] = first.samples, second.samples, third.samples
    # The first two are one series (identical attributes); the third belongs to the scraped host.
    assert a.attributes == b.attributes and a.attributes["host"] == "node-a"
    assert c.attributes["host"] == "10.0.0.7"
    assert device_key(a.attributes) == ("node-a", "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43", "")
    assert device_key(c.attributes) != device_key(a.attributes)
    # Same GPU index on another host is another series.
    other = parse_scrape(_gpu_line("Hostname", "node-b", 10).replace("GPU-5b4e", "GPU-ffff"), "dcgm", timestamp=T0)
    assert device_key(other.samples[0].attributes) != device_key(a.attributes)


@pytest.mark.parametrize("blank", ["9223372036854775794", "9223372036854775792", "2147483632", "140737488355328"])
def test_case_6_dcgm_blank_sentinels_are_missing(blank):
    body = (
        _gpu_line("Hostname", "node-a", 0).replace(" 0\n", f" {blank}\n")
        + 'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-x",Hostname="node-a"} 70.5\n'
    )
    result = parse_scrape(body, "dcgm", timestamp=T0)
    assert [s.signal for s in result.samples] == ["gpu_power_watts"]
    assert "gpu_utilization_ratio" in result.missing
