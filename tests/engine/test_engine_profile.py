"""The measured profile: curves read back against the CSV rows themselves."""

from __future__ import annotations

import csv
import statistics

import pytest

from inferpath.demo.engine.profile import PROFILE_CSV, PerfProfile


def _rows(**match: str) -> list[dict[str, str]]:
    with open(PROFILE_CSV, newline="") as handle:
        return [r for r in csv.DictReader(handle) if all(r[k] == v for k, v in match.items())]


@pytest.fixture(scope="module")
def profile() -> PerfProfile:
    return PerfProfile.load("llama2-70b", "h100-80gb", 4)


def test_shipped_profile_is_the_splitwise_file(shared_data):
    assert (
        PROFILE_CSV.read_bytes()
        == (shared_data / "model_server_perf_profiles" / "splitwise_sim_perf_model.csv").read_bytes()
    )


def test_prefill_at_a_measured_prompt_size_is_the_median_of_its_rows(profile):
    rows = _rows(model="llama2-70b", hardware="h100-80gb", tensor_parallel="4", batch_size="1", prompt_size="2048")
    assert len(rows) == 5
    expected_ms = statistics.median(float(r["prompt_time"]) for r in rows)
    assert profile.prefill_seconds(2048) == pytest.approx(expected_ms / 1000)
    assert profile.prefill_seconds(2048) == pytest.approx(0.2007, abs=5e-4)  # read by eye: 200.68 ms


def test_prefill_interpolates_between_and_extends_beyond_measured_sizes(profile):
    at_1024, at_2048 = profile.prefill_seconds(1024), profile.prefill_seconds(2048)
    assert profile.prefill_seconds(1536) == pytest.approx((at_1024 + at_2048) / 2)
    # Below the smallest measured prompt the step keeps its fixed cost.
    assert profile.prefill_seconds(1) == profile.prefill_seconds(128)
    at_4096, at_8192 = profile.prefill_seconds(4096), profile.prefill_seconds(8192)
    assert profile.prefill_seconds(12288) == pytest.approx(at_8192 + (at_8192 - at_4096))


def test_batched_prefill_costs_about_one_prompt_of_the_same_total_length():
    # The documented reason for summing prompt tokens: 8 x 512-token prompts vs 1 x 4096.
    batched = _rows(model="llama2-70b", hardware="h100-80gb", tensor_parallel="4", batch_size="8", prompt_size="512")
    measured_s = statistics.median(float(r["prompt_time"]) for r in batched) / 1000
    single_s = PerfProfile.load("llama2-70b", "h100-80gb", 4).prefill_seconds(8 * 512)
    assert measured_s == pytest.approx(single_s, rel=0.1)


def test_decode_step_follows_token_time_over_batch_size(profile):
    rows = _rows(
        model="llama2-70b",
        hardware="h100-80gb",
        tensor_parallel="4",
        prompt_size="512",
        token_size="128",
        batch_size="16",
    )
    assert profile.decode_step_seconds(16) == pytest.approx(
        statistics.median(float(r["token_time"]) for r in rows) / 1000
    )
    assert profile.decode_step_seconds(1) == pytest.approx(0.02972, abs=1e-4)  # 29.72 ms by eye
    assert profile.decode_step_seconds(24) == pytest.approx(
        (profile.decode_step_seconds(16) + profile.decode_step_seconds(32)) / 2
    )
    assert profile.decode_step_seconds(128) > profile.decode_step_seconds(64)


def test_power_ratio_falls_back_to_the_a100_readings_for_h100(profile):
    assert profile.power_source_hardware == "a100-80gb"
    a100 = _rows(
        model="llama2-70b",
        hardware="a100-80gb",
        tensor_parallel="4",
        prompt_size="512",
        token_size="128",
        batch_size="4",
    )
    assert profile.power_ratio(4) == pytest.approx(statistics.median(float(r["average_power"]) for r in a100))
    # Beyond the last reading (batch 16) the reading is kept, not extrapolated.
    assert profile.power_ratio(64) == profile.power_ratio(16)
    assert 0 < profile.power_ratio(1) <= 1.1


def test_a100_profile_uses_its_own_power_readings():
    a100 = PerfProfile.load("llama2-70b", "a100-80gb", 2)
    assert a100.power_source_hardware == "a100-80gb"
    assert a100.power_ratio(1) == pytest.approx(0.73599375)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"model": "gpt-5"}, "model"),
        ({"hardware": "tpu-v5"}, "hardware"),
        ({"tensor_parallel": 3}, "tensor_parallel"),
    ],
)
def test_unknown_choices_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PerfProfile.load(**kwargs)


def test_non_positive_work_is_rejected(profile):
    with pytest.raises(ValueError, match="prompt_tokens"):
        profile.prefill_seconds(0)
    with pytest.raises(ValueError, match="batch_size"):
        profile.decode_step_seconds(0)
