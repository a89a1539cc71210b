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
        row = {
            "timestamp": T0 + timedelta(seconds=t),
            "endpoint_class": "interactive",
            "replica": "r1",
            "input_tokens": rng.randint(50, 300),
            "output_tokens": out,
            "ttft_ns": 30_000_000,
            "e2e_ns": 30_000_000 + int(itl * (out - 1) * 1e9),
            "itl_ns": int(itl * 1e9),
        }
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
    with pytest.raises(ValueError, match="no KV-cache signal"):
        what_if(cal, Change(kv_blocks_factor=2.0))


def test_usable_blocks_is_the_common_denominator_of_kv_usage() -> None:
    assert usable_blocks([5 / 47, 12 / 47, 40 / 47, 1.0]) == 47
    assert usable_blocks([0.5]) is None


def test_the_kv_pool_comes_from_the_engines_cache_config_when_it_reports_one() -> None:
    window = dict(window_start=T0, window_end=T0 + timedelta(seconds=120))
    cal = calibrate(_rows(), {}, cache_configs=[{"num_gpu_blocks": "96", "block_size": "32", "engine": "0"}], **window)
    assert (cal.num_kv_blocks, cal.block_size_tokens) == (95, 32)  # one block is vLLM's null block
    assert "cache_config_info" in cal.sources["kv_blocks"]
    assert not any("unlimited" in note for note in cal.notes)
    # before the engine sized its pool the label reads "None": no pool, as without the metric
    unsized = calibrate(_rows(), {}, cache_configs=[{"num_gpu_blocks": "None", "block_size": "16"}], **window)
    assert unsized.num_kv_blocks is None and any("unlimited" in note for note in unsized.notes)
    two = calibrate(
        _rows(),
        {},
        cache_configs=[{"num_gpu_blocks": "96", "block_size": "32"}, {"num_gpu_blocks": "64", "block_size": "32"}],
        **window,
    )
    assert two.num_kv_blocks == 63 and any("different KV pools" in note for note in two.notes)


ENGINE_LAW = (0.008, 0.001, 0.00004)  # seconds per step, per sequence, per prompt token
ENGINE_POOL = {"num_gpu_blocks": "4097", "block_size": "16"}  # 4096 usable blocks, as cache_config_info says


def _engine_rows(seed: int = 7, seconds: float = 240.0) -> list[dict]:
    """A window whose spans are what an engine of a known step law did with a two-class load:
    interactive (short prompts and answers, 3/s) and bulk (prompts of several chunks, 1.2/s), on one replica."""
    from inferpath.analysis.whatif import EngineSettings
    from inferpath.analysis.whatif_engine import run_engine

    rng = random.Random(seed)
    arrivals: list[tuple[float, str, int, int]] = []
    for cls, rate, prompt, output in (
        ("interactive", 3.0, (50, 200), (20, 60)),
        ("bulk", 1.2, (3000, 6000), (100, 200)),
    ):
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= seconds:
                break
            arrivals.append((t, cls, rng.randint(*prompt), rng.randint(*output)))
    arrivals.sort()
    run = run_engine(
        [a for a, *_ in arrivals],
        [p for *_, p, _ in arrivals],
        [o for *_, o in arrivals],
        EngineSettings(4096, 16, 64, 2048),
        lambda seqs, tokens: ENGINE_LAW[0] + ENGINE_LAW[1] * seqs + ENGINE_LAW[2] * tokens,
    )
    rows = []
    for i, (at, cls, prompt, output) in enumerate(arrivals):
        scheduled, first, end = run.first_scheduled_s[i], run.first_token_s[i], run.finished_s[i]
        rows.append(
            {
                "timestamp": T0 + timedelta(seconds=at),
                "endpoint_class": cls,
                "replica": "r1",
                "input_tokens": prompt,
                "output_tokens": output,
                "ttft_ns": int((first - at) * 1e9),
                "e2e_ns": int((end - at) * 1e9),
                "queue_ns": int((scheduled - at) * 1e9),
                "prefill_ns": int((first - scheduled) * 1e9),
                "decode_ns": int((end - first) * 1e9),
                "itl_ns": int((end - first) / max(1, output - 1) * 1e9),
            }
        )
    return rows


def test_classes_on_engines_of_their_own_are_predicted_per_class() -> None:
    from inferpath.analysis.whatif import WhatIfRefused, parse_class_split

    cal = calibrate(
        _engine_rows(), {}, window_start=T0, window_end=T0 + timedelta(seconds=240), cache_configs=[ENGINE_POOL]
    )
    shared = what_if(cal, Change(replicas=2))
    split = what_if(cal, Change(split_classes=parse_class_split("interactive=1,bulk=1")))
    assert split.max_error <= 0.30, split.errors
    assert set(split.predicted) == {"interactive", "bulk", "all"}
    assert split.settings["replicas"] == 2 and split.settings["replicas_by_class"] == {"interactive": 1, "bulk": 1}
    # Alone, interactive requests no longer share steps with long prompt chunks; bulk ones lose half the engines.
    assert split.predicted["interactive"].ttft_p99_seconds < shared.predicted["interactive"].ttft_p99_seconds
    assert split.predicted["bulk"].ttft_p50_seconds > shared.predicted["bulk"].ttft_p50_seconds
    with pytest.raises(WhatIfRefused, match="also has bulk requests"):
        what_if(cal, Change(split_classes=(("interactive", 2),)))
    with pytest.raises(ValueError, match="^split_endpoint_classes: "):  # the input's name, as the API takes it
        parse_class_split("interactive=two")
    with pytest.raises(ValueError, match="not replicas as well"):
        Change(replicas=2, split_classes=(("interactive", 1),))


def test_the_step_law_of_an_engine_is_recovered_from_its_spans() -> None:
    # The window's spans come from the engine model itself with a known law, KV pressure
    # (long prompts fill the 4096 blocks) and prompts chunked over several steps.
    cal = calibrate(
        _engine_rows(), {}, window_start=T0, window_end=T0 + timedelta(seconds=240), cache_configs=[ENGINE_POOL]
    )
    law = cal.step_time
    fitted = (law.base_seconds, law.per_sequence_seconds, law.per_prefill_token_seconds)
    for got, true in zip(fitted, ENGINE_LAW):
        assert got == pytest.approx(true, rel=0.05), (fitted, ENGINE_LAW)
    # A law 2-3 % off moves the p99 TTFT of the KV-bound class about five times as much (11 % when
    # this was written); the replay stays well inside the tool's own 30 % limit.
    answer = what_if(cal, Change())
    assert answer.max_error <= 0.15, answer.errors


def test_a_prediction_that_turns_on_engine_speed_says_so_with_its_range() -> None:
    from inferpath.analysis.whatif import STEP_TIME_SENSITIVITY

    cal = calibrate(
        _engine_rows(), {}, window_start=T0, window_end=T0 + timedelta(seconds=240), cache_configs=[ENGINE_POOL]
    )
    # Twice the engines: far from saturation, 10 % of engine speed moves TTFT by about as much.
    calm = what_if(cal, Change(replicas=2))
    faster, slower = calm.sensitivity["all"]
    assert faster.ttft_p99_seconds < calm.predicted["all"].ttft_p99_seconds < slower.ttft_p99_seconds
    assert not any(w.startswith("sensitive") for w in calm.warnings), calm.warnings
    # 1.9x the traffic on one engine: at the edge of saturation the band spans far more.
    edge = what_if(cal, Change(rate_factor=1.9))
    faster, slower = edge.sensitivity["all"]
    assert slower.ttft_p50_seconds > 1.25 * edge.predicted["all"].ttft_p50_seconds
    warning = next(w for w in edge.warnings if w.startswith("sensitive:"))  # all classes
    assert f"{STEP_TIME_SENSITIVITY:.0%} faster or slower" in warning and "TTFT p50" in warning
    assert f"{faster.ttft_p50_seconds:.2f}-{slower.ttft_p50_seconds:.2f} s" in warning
    assert not what_if(cal, Change()).sensitivity  # the replay itself has no band


def test_the_cli_names_a_bad_change_by_its_option_before_reading_anything(tmp_path) -> None:
    from typer.testing import CliRunner

    from inferpath.cli import app

    store = f"chdb://{tmp_path / 'never-opened'}"
    for args, said in (
        (["--rate", "banana"], "--rate: expected a factor above 0 like x2, got 'banana'"),
        (["--rate", "0"], "--rate: expected a factor above 0"),
        (["--kv-blocks", "x0"], "--kv-blocks: expected a count of at least 1 like 96 or a factor above 0"),
        (["--kv-blocks", "-5"], "--kv-blocks: expected a count of at least 1"),
    ):
        result = CliRunner().invoke(app, ["whatif", "--from", "-30m", "--store", store, *args])
        assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
    assert not (tmp_path / "never-opened").exists()


def test_the_clients_hop_is_observed_and_carried_into_every_prediction() -> None:
    """Where the caller is instrumented the what-if observes and predicts the client's TTFT
    (as the diagnosis and the views read it): the hop before the engine is kept per request,
    so an engine change moves the engine's part only."""
    rows = _rows()
    for row in rows:
        row |= {"client_ttft_ns": row["ttft_ns"] + 500_000_000, "client_e2e_ns": row["e2e_ns"] + 500_000_000}
    window = {"window_start": T0, "window_end": T0 + timedelta(seconds=120)}
    answer = what_if(calibrate(rows, {}, **window), Change(max_num_seqs=2))
    bare = what_if(calibrate(_rows(), {}, **window), Change(max_num_seqs=2))
    for name in ("observed", "replayed", "predicted"):
        with_hop, without = getattr(answer, name)["all"], getattr(bare, name)["all"]
        assert with_hop.ttft_p50_seconds == pytest.approx(without.ttft_p50_seconds + 0.5, abs=0.005), name
    assert answer.observed["all"].ttft_p50_seconds == pytest.approx(0.53, abs=0.001)


def test_a_replay_whose_kv_usage_is_far_from_the_observed_says_so() -> None:
    """The refusal reads TTFT and queue time; a replay whose KV usage is far off the engine's
    (a pool or per-request tokens not the engine's) is answered with that warning."""
    from dataclasses import replace

    window = {"window_start": T0, "window_end": T0 + timedelta(seconds=120)}
    cal = calibrate(_rows(), {}, cache_configs=[{"num_gpu_blocks": "32", "block_size": "32", "engine": "0"}], **window)
    replayed = what_if(cal, Change(kv_blocks_factor=2.0)).kv["replayed_mean_ratio"]
    assert replayed is not None and replayed > 0.15
    close = what_if(replace(cal, observed_kv_mean_ratio=replayed * 1.1), Change(kv_blocks_factor=2.0))
    assert not any(w.startswith("KV replay off") for w in close.warnings), close.warnings
    far = what_if(replace(cal, observed_kv_mean_ratio=min(1.0, replayed * 3 + 0.1)), Change(kv_blocks_factor=2.0))
    (warning,) = [w for w in far.warnings if w.startswith("KV replay off")]
    assert f"the replay's mean KV usage is {replayed:.2f} against" in warning
