"""Fixtures of the analysis tests; the fault scenarios themselves live in ``fault_scenarios``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fault_scenarios import SCENARIOS, T0, WINDOW, request_rows


@pytest.fixture()
def scenario_rows() -> Callable[[str], tuple[list[dict], list[dict]]]:
    """name -> (current rows, baseline rows) as dicts, without a store."""

    def build(name: str) -> tuple[list[dict], list[dict]]:
        scenario = SCENARIOS[name]
        baseline = [vars(r) | {} for r in request_rows(scenario.baseline, T0, seed=1)]
        current = [vars(r) | {} for r in request_rows(scenario.current, T0 + WINDOW, seed=2)]
        return current, baseline

    return build
