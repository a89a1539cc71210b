"""The what-if's calibration and simulator on rows built in memory (no store)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from inferpath.analysis.whatif import Change, what_if
from inferpath.analysis.whatif_calibration import InsufficientSignalsError, calibrate, usable_blocks

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _rows(n: int = 200, *, engine_spans: bool = True) -> list[dict]:
    rng = random.Random(3)
    rows, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(2.0)
        out = rng.randint(20, 60)
        itl = 0.01
        row = {"timestamp": T0 + timedelta(seconds=t), "endpoint_class": "interactive", "replica": "r1",
               "input_tokens": rng.randint(50, 300), "output_tokens": out, "ttft_ns": 30_000_000,
               "e2e_ns": 30_000_000 + int(itl * (out - 1) * 1e9), "itl_ns": int(itl * 1e9)}
        if engine_spans:
            row |= {"queue_ns": 1_000_000, "prefill_ns": 20_000_000, "decode_ns": int(itl * (out - 1) * 1e9)}
        else:
            row |= {"queue_ns": None, "prefill_ns": None, "decode_ns": None}
        rows.append(row)
    return rows


def test_a_window_without_engine_spans_is_refused_naming_them() -> None:
    with pytest.raises(InsufficientSignalsError, match="no engine spans"):
        calibrate(_rows(engine_spans=False), {}, window_start=T0, window_end=T0 + timedelta(seconds=120))


def test_without_kv_gauge_the_prediction_names_it_and_refuses_kv_changes() -> None:
    cal = calibrate(_rows(), {}, window_start=T0, window_end=T0 + timedelta(seconds=120))
    answer = what_if(cal, Change(rate_factor=10.0))
    assert answer.max_error <= 0.30, answer.errors
    assert any("kv_cache_usage_ratio" in note for note in answer.notes)
    assert any("extrapolates" in w for w in answer.warnings)
    with pytest.raises(ValueError, match="no KV-cache usage signal"):
        what_if(cal, Change(kv_blocks_factor=2.0))


def test_usable_blocks_is_the_common_denominator_of_kv_usage() -> None:
    assert usable_blocks([5 / 47, 12 / 47, 40 / 47, 1.0]) == 47
    assert usable_blocks([0.5]) is None
