"""Latency objectives: defaults, the YAML file, flags, and the tail-divergence rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferpath.analysis.objectives import (
    DEFAULT_OBJECTIVES,
    Objective,
    load_objectives,
    objectives_from_mapping,
    tail_diverges,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "objectives.yaml"


def test_the_shipped_file_states_the_defaults() -> None:
    assert load_objectives(DEPLOY) == DEFAULT_OBJECTIVES
    assert load_objectives(None) is DEFAULT_OBJECTIVES


def test_a_class_in_the_file_replaces_what_it_names_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "objectives.yaml"
    path.write_text("interactive: {ttft_p99_seconds: 0.6, e2e_p90_seconds: 5}\nbatch-jobs: {ttft_p99_seconds: 60}\n")
    objectives = load_objectives(path)
    interactive = {o.name: o.limit_seconds for o in objectives.for_class("interactive")}
    assert interactive == {"itl_p99": 0.1, "ttft_p99": 0.6, "e2e_p90": 5}
    assert [o.limit_seconds for o in objectives.for_class("batch-jobs")] == [60]
    assert objectives.for_class("") == objectives.for_class("interactive")  # unclassified rows
    assert {o.limit_seconds for o in objectives.with_limit("ttft", 2.0).for_class("bulk") if o.measure == "ttft"} == {
        2.0
    }


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("interactive: {ttft: 1}", "interactive.ttft: unknown objective"),
        ("interactive: {ttft_pxx_seconds: 1}", "the percentile 'pxx' is not a number"),
        ("interactive: {ttft_p99_seconds: -1}", "positive number of seconds"),
        ("interactive: {ttft_p99_seconds: fast}", "positive number of seconds"),
        ("interactive: 3", "expected a mapping"),
        ("[1, 2]", "expected a mapping of endpoint class"),
        ("interactive: {ttft_p99_seconds: [1", "not valid YAML"),
        ("", "holds no objectives"),  # a file given and empty is not a wish for the defaults
        ("# interactive: {ttft_p99_seconds: 1.0}\n", "holds no objectives"),
        ("{}", "holds no objectives"),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_the_key(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "objectives.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match="objectives file") as refused:
        load_objectives(path)
    assert words in str(refused.value)
    with pytest.raises(ValueError, match="cannot be read"):
        load_objectives(tmp_path / "absent.yaml")


def test_objective_values_are_validated() -> None:
    with pytest.raises(ValueError, match="measure"):
        Objective("latency", 1.0)
    with pytest.raises(ValueError, match="quantile"):
        Objective("ttft", 1.0, quantile=1.5)
    with pytest.raises(ValueError, match="mapping"):
        objectives_from_mapping({"interactive": [1]})


def test_the_tail_diverges_only_when_it_is_both_far_from_the_mean_and_near_the_objective() -> None:
    assert tail_diverges(p99_ns=800e6, mean_ns=100e6, limit_ns=1e9)  # 8x the mean, 80% of the objective
    assert not tail_diverges(p99_ns=300e6, mean_ns=100e6, limit_ns=1e9)  # 3x: ordinary spread
    assert not tail_diverges(p99_ns=40e6, mean_ns=5e6, limit_ns=1e9)  # 8x, but far under the objective
    assert tail_diverges(p99_ns=40e6, mean_ns=5e6, limit_ns=None)
