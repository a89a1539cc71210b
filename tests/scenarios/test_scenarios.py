"""The scenario suite: each fault injected into the real path, the diagnosis must name it first.

Every scenario runs the real processes (server on embedded chDB, emulated engine, instrumented
gateway, and the proxy or second replica its fault needs), plays a baseline phase then a fault
phase, and reads ``/api/v1/diagnosis``. The last test prints the confusion table.
"""

from __future__ import annotations

import pytest

from inferpath.demo.scenarios import SCENARIOS, ScenarioOutcome, confusion_table

pytestmark = pytest.mark.e2e

SCENARIO_SECONDS_MAX = 180.0
"""A guard against a hung phase, not a speed target: a quiet run takes ~27 s, one beside a
CPU-burning neighbour up to about twice that."""
_outcomes: dict[str, ScenarioOutcome] = {}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_diagnosis_names_the_injected_fault(name: str, scenario_runs) -> None:
    # One run per scenario per session, shared with the browser and alert tests (tests/conftest.py);
    # a misdiagnosed run is run again once there.
    outcome = scenario_runs.outcome(name)
    _outcomes[name] = outcome
    total_seconds = sum(outcome.timings_seconds.values())
    assert total_seconds <= SCENARIO_SECONDS_MAX, outcome.timings_seconds
    assert all(r.error is None for r in outcome.results), [r.error for r in outcome.results if r.error][:3]
    verdict = outcome.verdict
    assert verdict["baseline_requests"] >= 40 and verdict["current_requests"] >= 40
    assert outcome.diagnosed_cause == (outcome.scenario.cause or "healthy"), verdict["summary"]
    if outcome.scenario.cause is not None:
        top = verdict["causes"][0]
        assert top["evidence"] and top["would_help"], top
    if name == "cold-start":
        texts = " ".join(e["text"] for e in verdict["causes"][0]["evidence"])
        assert "loaded in" in texts and "slowed by its start" in texts, texts


@pytest.mark.xdist_group("scenarios")  # on the worker that ran them (tests/conftest.py)
def test_confusion_table(request: pytest.FixtureRequest) -> None:
    collected = [
        i for i in request.session.items if getattr(i, "originalname", "") == "test_diagnosis_names_the_injected_fault"
    ]
    if len(collected) < len(SCENARIOS):
        pytest.skip("runs after the whole suite")
    # Every scenario test was collected, so each ran before this one on this worker.
    assert len(_outcomes) == len(SCENARIOS), f"scenario runs split across workers: {sorted(_outcomes)} here"
    table = confusion_table([_outcomes[name] for name in SCENARIOS])
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("\n" + table)
    assert all(_outcomes[name].correct for name in SCENARIOS), table
