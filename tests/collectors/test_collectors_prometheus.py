"""scrape_samples on real recorded scrapes; expected values read by eye from the files."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from inferpath.collectors.prometheus import Sample, is_dcgm_blank, scrape_samples, signals_of

MIB = 1024 * 1024
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def _one(samples: list[Sample], signal: str) -> Sample:
    [sample] = [s for s in samples if s.signal == signal]
    return sample


def _read(shared_data, relative: str) -> str:
    return (shared_data / relative).read_text()


def test_dcgm_l40s(shared_data):
    samples = scrape_samples(
        _read(shared_data, "dcgm_exporter_metrics/cncf_ai_conformance_upcloud_L40S.prom"), "dcgm", timestamp=T0
    )
    assert sorted(signals_of(samples)) == [
        "gpu_graphics_engine_active_ratio",
        "gpu_memory_clock_hertz",
        "gpu_memory_free_bytes",
        "gpu_memory_total_bytes",
        "gpu_memory_used_bytes",
        "gpu_power_watts",
        "gpu_sm_clock_hertz",
        "gpu_temperature_celsius",
        "gpu_utilization_ratio",
    ]
    # Values read from the file: SM 210 MHz, memory 405 MHz, 32 C, FB_FREE 45459 MiB.
    assert _one(samples, "gpu_sm_clock_hertz").value == 210e6
    assert _one(samples, "gpu_memory_clock_hertz").value == 405e6
    assert (
        _one(samples, "gpu_temperature_celsius").value == 32 and _one(samples, "gpu_temperature_celsius").unit == "Cel"
    )
    assert _one(samples, "gpu_memory_free_bytes").value == 45459 * MIB
    power = _one(samples, "gpu_power_watts")
    assert power.value == pytest.approx(35.686) and power.unit == "W" and power.kind == "gauge"
    assert power.source_metric == "DCGM_FI_DEV_POWER_USAGE"
    assert power.attributes["host"] == "gpu1-wl8sg" and "Hostname" not in power.attributes
    assert power.attributes["UUID"] == "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43"
    assert power.attributes["gpu"] == "0" and power.attributes["modelName"] == "NVIDIA L40S"
    assert power.attributes["pci_bus_id"] == "00000000:00:07.0"
    assert _one(samples, "gpu_utilization_ratio").value == 0.0
    assert _one(samples, "gpu_memory_used_bytes").value == 0.0
    total = _one(samples, "gpu_memory_total_bytes")
    # FB_USED 0 + FB_FREE 45459 + FB_RESERVED 608 = 46067 MiB (nvidia-smi on that host: 46068MiB).
    assert total.value == 46067 * MIB and total.unit == "By"
    assert total.attributes == power.attributes


def test_dcgm_l4_idle(shared_data):
    samples = scrape_samples(
        _read(shared_data, "dcgm_exporter_metrics/cncf_ai_conformance_kops_L4_idle.prom"), "dcgm", timestamp=T0
    )
    assert _one(samples, "gpu_power_watts").value == pytest.approx(16.365)
    assert _one(samples, "gpu_memory_total_bytes").value == (0 + 22563 + 470) * MIB
    assert _one(samples, "gpu_power_watts").attributes["host"] == "i-030791dc5a37cd257"


def test_sglang_under_load(shared_data):
    samples = scrape_samples(
        _read(shared_data, "model_server_metrics/sglang_llama3.1-8b_under_load_docs.prom"), "sglang", timestamp=T0
    )
    assert _one(samples, "queue_depth").value == 2826
    assert _one(samples, "running_requests").value == 162
    kv = _one(samples, "kv_cache_usage_ratio")
    assert kv.value == pytest.approx(0.28) and kv.unit == "1"
    assert kv.attributes == {"model_name": "meta-llama/Llama-3.1-8B-Instruct"}


def test_vllm_v1_scrape_with_created_series_and_empty_family(shared_data):
    samples = scrape_samples(
        _read(shared_data, "model_server_metrics/vllm_v1_qwen2.5-0.5b_cncf_kops.prom"), "vllm", timestamp=T0
    )
    assert sorted(s.signal for s in samples) == [
        "kv_cache_config_info",
        "kv_cache_usage_ratio",
        "preemptions_total",
        "prefix_cache_hits_total",
        "prefix_cache_queries_total",
        "queue_depth",
        "running_requests",
    ]
    state = [s for s in samples if s.signal != "kv_cache_config_info"]
    assert all(s.value == 0.0 for s in state)
    assert all(s.attributes == {"engine": "0", "model_name": "Qwen/Qwen2.5-0.5B-Instruct"} for s in state)
    # The cache configuration is an info series: value 1, the configuration in its labels.
    config = _one(samples, "kv_cache_config_info")
    assert config.value == 1.0 and config.source_metric == "vllm:cache_config_info"
    assert (config.attributes["num_gpu_blocks"], config.attributes["block_size"], config.attributes["engine"]) == (
        "101625",
        "16",
        "0",
    )
    preemptions = _one(samples, "preemptions_total")
    assert preemptions.kind == "sum" and preemptions.source_metric == "vllm:num_preemptions_total"


def test_vllm_live_capture_under_load(shared_data):
    samples = scrape_samples(
        _read(shared_data, "vllm_live_capture/metrics_1796037503909019406.prom"), "vllm", timestamp=T0
    )
    assert _one(samples, "running_requests").value == 6
    assert _one(samples, "queue_depth").value == 3
    assert _one(samples, "kv_cache_usage_ratio").value == pytest.approx(0.8095238095238095)
    assert _one(samples, "preemptions_total").value == 1


def test_every_live_capture_scrape_is_sane_and_counters_only_grow(shared_data):
    files = sorted((shared_data / "vllm_live_capture").glob("metrics_*.prom"), key=lambda p: int(p.stem.split("_")[1]))
    assert len(files) >= 60  # about one scrape a second over the run
    previous = 0.0
    saw_queue = False
    for path in files:
        stamp = datetime.fromtimestamp(int(path.stem.split("_")[1]) / 1e9, tz=timezone.utc)
        grouped = signals_of(scrape_samples(path.read_text(), "vllm", timestamp=stamp))
        assert set(grouped) == {
            "queue_depth",
            "running_requests",
            "kv_cache_usage_ratio",
            "preemptions_total",
            "kv_cache_config_info",
            "prefix_cache_queries_total",
            "prefix_cache_hits_total",
        }
        assert 0.0 <= grouped["kv_cache_usage_ratio"][0].value <= 1.0
        queried, hit = grouped["prefix_cache_queries_total"][0].value, grouped["prefix_cache_hits_total"][0].value
        assert 0.0 <= hit <= queried  # tokens found in the cache are tokens looked up
        assert grouped["running_requests"][0].value <= 16  # --max-num-seqs 16
        assert grouped["preemptions_total"][0].value >= previous
        previous = grouped["preemptions_total"][0].value
        saw_queue = saw_queue or grouped["queue_depth"][0].value > 0
        assert grouped["queue_depth"][0].timestamp == stamp
    assert saw_queue


def test_timestamps_are_utc_and_must_be_aware(shared_data):
    text = _read(shared_data, "model_server_metrics/vllm_v1_qwen2.5-0.5b_cncf_kops.prom")
    local = T0.astimezone(timezone(timedelta(hours=5)))
    samples = scrape_samples(text, "vllm", timestamp=local)
    assert all(s.timestamp == T0 and s.timestamp.utcoffset() == timedelta(0) for s in samples)
    with pytest.raises(ValueError, match="timestamp"):
        scrape_samples(text, "vllm", timestamp=datetime(2026, 1, 1))


def test_dcgm_blank_sentinels_are_dropped(shared_data):
    text = _read(shared_data, "dcgm_exporter_metrics/cncf_ai_conformance_upcloud_L40S.prom")
    line = next(row for row in text.splitlines() if row.startswith("DCGM_FI_DEV_POWER_USAGE{"))
    blanked = text.replace(line, line.rsplit(" ", 1)[0] + " 9223372036854775794")
    samples = scrape_samples(blanked, "dcgm", timestamp=T0)
    assert "gpu_power_watts" not in signals_of(samples)
    assert "gpu_utilization_ratio" in signals_of(samples)
    assert is_dcgm_blank(2147483632) and is_dcgm_blank(140737488355328.0)
    assert not is_dcgm_blank(700.0)


def test_lowercase_hostname_and_extra_attributes():
    text = 'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-x",hostname="node-a"} 87\n'
    [sample] = scrape_samples(text, "dcgm", timestamp=T0, extra_attributes={"scrape.target": "dcgm-a"})
    assert sample.value == pytest.approx(0.87)
    assert sample.attributes == {"gpu": "1", "UUID": "GPU-x", "host": "node-a", "scrape.target": "dcgm-a"}


def test_deprecated_vllm_name_is_used_only_when_the_current_one_is_missing():
    both = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.4\nvllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
    [kv] = scrape_samples(both, "vllm", timestamp=T0)
    assert kv.value == 0.5 and kv.source_metric == "vllm:kv_cache_usage_perc"
    [old] = scrape_samples('vllm:gpu_cache_usage_perc{model_name="m"} 0.4\n', "vllm", timestamp=T0)
    assert old.signal == "kv_cache_usage_ratio" and old.value == 0.4


def test_tgi_names():
    text = "# TYPE tgi_queue_size gauge\ntgi_queue_size 7\n# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 24\n"
    grouped = signals_of(scrape_samples(text, "tgi", timestamp=T0))
    assert grouped["queue_depth"][0].value == 7 and grouped["batch_size"][0].value == 24


def test_nan_is_dropped():
    assert scrape_samples('vllm:num_requests_waiting{engine="0"} NaN\n', "vllm", timestamp=T0) == []


def test_malformed_text_raises_value_error_naming_the_line(shared_data):
    text = _read(shared_data, "vllm_live_capture/metrics_1796037503909019406.prom")
    lines = text.splitlines()
    lines.insert(3, 'vllm:num_requests_waiting{engine="0" 3.0')
    with pytest.raises(ValueError, match=r"line 4: 'vllm:num_requests_waiting\{engine=\"0\" 3\.0'"):
        scrape_samples("\n".join(lines) + "\n", "vllm", timestamp=T0)


def test_unknown_source_is_rejected():
    with pytest.raises(ValueError, match="source"):
        scrape_samples("", "nope", timestamp=T0)


def test_dcgm_profiling_sm_active_is_already_a_ratio():
    text = 'DCGM_FI_PROF_SM_ACTIVE{gpu="0",Hostname="n"} 0.420000\nDCGM_FI_PROF_DRAM_ACTIVE{gpu="0",Hostname="n"} 0.1\n'
    [sample] = scrape_samples(text, "dcgm", timestamp=T0)
    assert sample.signal == "gpu_sm_active_ratio" and sample.value == pytest.approx(0.42) and sample.unit == "1"


def test_crlf_lines_and_sample_timestamps_are_accepted():
    text = 'vllm:num_requests_waiting{engine="0"} 3 1700000000000\r\nvllm:num_requests_running{engine="0"} 2\r\n'
    grouped = signals_of(scrape_samples(text, "vllm", timestamp=T0))
    assert grouped["queue_depth"][0].value == 3 and grouped["running_requests"][0].value == 2
    assert grouped["queue_depth"][0].timestamp == T0  # the scrape time, not the exposition's
