"""The signal catalog: every row points at a known signal, conversions are right, units are named."""

from __future__ import annotations

import pytest

from inferpath.collectors import catalog
from inferpath.config import ScrapeTarget


def test_every_row_maps_to_a_declared_signal():
    for row in catalog.CATALOG:
        assert row.signal in catalog.SIGNALS, row
    for derived in catalog.DERIVED:
        assert derived.signal in catalog.SIGNALS


def test_each_metric_name_appears_once_per_source():
    keys = [(row.source, row.metric) for row in catalog.CATALOG]
    assert len(keys) == len(set(keys))


def test_canonical_names_carry_their_unit():
    suffix_by_unit = {"1": "_ratio", "By": "_bytes", "W": "_watts"}
    for sig in catalog.SIGNALS.values():
        if sig.unit in suffix_by_unit:
            assert sig.name.endswith(suffix_by_unit[sig.unit]), sig.name
        if sig.kind == "sum":
            assert sig.name.endswith("_total"), sig.name


def test_conversions():
    assert catalog.percent_to_ratio(87.0) == pytest.approx(0.87)
    assert catalog.mib_to_bytes(46067) == 46067 * 1048576
    rows = catalog.metrics_for("dcgm")
    assert rows["DCGM_FI_DEV_GPU_UTIL"].convert(50) == 0.5
    assert rows["DCGM_FI_DEV_FB_USED"].convert(1) == 1048576
    assert rows["DCGM_FI_DEV_POWER_USAGE"].convert(35.686) == 35.686
    assert catalog.metrics_for("triton")["nv_gpu_utilization"].convert(0.5) == 0.5


def test_old_and_new_vllm_names_meet_in_one_signal():
    rows = catalog.metrics_for("vllm")
    assert rows["vllm:kv_cache_usage_perc"].signal == rows["vllm:gpu_cache_usage_perc"].signal == "kv_cache_usage_ratio"
    assert rows["vllm:gpu_cache_usage_perc"].deprecated and not rows["vllm:kv_cache_usage_perc"].deprecated
    assert rows["vllm:num_preemptions_total"].signal == rows["vllm:num_preemptions"].signal == "preemptions_total"


def test_catalog_sources_cover_the_configured_scrape_sources():
    configured = set(ScrapeTarget.model_fields["source"].annotation.__args__)
    assert {"dcgm", "vllm", "sglang", "tgi", "triton"} <= configured
    assert catalog.SOURCES <= configured


def test_unknown_source_names_the_field():
    with pytest.raises(ValueError, match="source"):
        catalog.metrics_for("nvml-typo")
