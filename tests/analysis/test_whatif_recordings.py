"""The what-if against real engines: predict a change from one real vLLM run, compare with
the same trace slice run for real under that change.

Every recording is in ``tests/data/whatif_recordings/`` (README there: how each was made, on
which machine, under which load, and what the errors mean), made back to back with
``bench/vllm_record.py`` on the same trace slice and phases, one engine argument (or the
number of servers) changed; the five runs were made twice (:data:`SERIES`). Each pair is
used both ways where both runs had one server. The prediction's TTFT p50 and p99 are
compared with the engine spans of the real run, as the tool compares its replay (figures
both under 50 ms agree).

The target is ±25 %. Near saturation a 10 % error in engine speed moves TTFT by more than
that, and the two series' engines differed by that much, so the test holds what the tool
must do when it misses: never answer a wrong figure with confidence. A prediction off the
target must come with a warning that it extrapolates or that it is that sensitive, or from a
base the tool refuses (its replay off by more than 30 %). Where the p50 met the target it is
held there, and the direction of every effect must be right. Two servers on this two-core
machine ran each engine at about half the speed of one (asserted from the engines' own
counters): the what-if's replicas are machines of their own.
"""

from __future__ import annotations

import re
import statistics
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from inferpath.analysis.whatif import (
    MAX_CALIBRATION_ERROR,
    QUEUE_FLOOR_SECONDS,
    Change,
    observed_figures,
    predict,
    relative_error,
)
from inferpath.analysis.whatif_calibration import fetch_calibration
from inferpath.collectors.recording import choose_offset_ns, import_recording, open_recording
from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread

pytestmark = pytest.mark.e2e

DATA = Path(__file__).resolve().parents[1] / "data" / "whatif_recordings"
TARGET = 0.25
SERIES = ("", "_quiet")
"""The same five runs made twice: first beside other jobs (load average 10-14 on two cores),
then on a quiet machine (the runs' own load), each series back to back."""
# case: base, real run of the change, the change. What each error comes from: the README.
CASES = {
    "more_slots": ("slots4", "slots8", Change(max_num_seqs=8)),
    "fewer_slots": ("slots8", "slots4", Change(max_num_seqs=4)),
    "less_kv": ("kv96", "kv48", Change(kv_blocks=47)),
    "more_kv": ("kv48", "kv96", Change(kv_blocks=95)),
    "two_replicas": ("slots4", "replicas2", Change(replicas=2)),
}
# Predictions whose TTFT p50 met the target when the recordings were made: held there.
P50_MET = {("fewer_slots", ""), ("less_kv", ""), ("less_kv", "_quiet")}
REPEATS = ("slots4_quiet", "slots4_repeat", "slots4_repeat2")
"""One configuration and load (slots4's) recorded three times on the quiet machine: how far
two real runs of the same thing differ (README, "Two real runs of one configuration")."""
NAMES = sorted({n + series for case in CASES.values() for n in case[:2] for series in SERIES} | set(REPEATS))
# A per-step token budget: the same burst at vLLM's --max-num-batched-tokens 32 (a diagnosis
# fixture) and 2048 (its control run), prompts 92-98 % found in the prefix cache.
BUDGET_RUNS = {
    "token_budget_c": DATA.parent / "vllm_recordings" / "token_budget_c.tar.gz",
    "token_budget_control": DATA / "token_budget_control.tar.gz",
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("whatif")
    server = serve_in_thread(Settings(store_url=f"chdb://{root / 'store'}", assembly_settle_seconds=0.2), port=0)
    windows, roots = {}, {}
    try:
        with httpx.Client(base_url=server.url, timeout=120.0) as client:
            for name, path in [*((n, DATA / f"{n}.tar.gz") for n in NAMES), *BUDGET_RUNS.items()]:
                recording = open_recording(path, workdir=root / name)
                offset = choose_offset_ns(recording, ttl_days=server.runtime.settings.ttl_days, now_ns=time.time_ns())
                import_recording(recording, client, offset_ns=offset, flush=False)
                w = recording.ground_truth["window"]
                windows[name] = tuple(
                    datetime.fromtimestamp((w[k] + offset) / 1e9, tz=timezone.utc)
                    for k in ("start_unix_ns", "end_unix_ns")
                )
                roots[name] = recording.root
            assert client.post("/api/v1/flush", params={"timeout_seconds": 300}).json()["ok"]
        yield server, windows, roots
    finally:
        server.stop()


_SAMPLE = re.compile(r"^(vllm:iteration_tokens_total_count|vllm:num_requests_running)(\{[^}]*\})?\s+(\S+)", re.M)


def full_batch_step_seconds(root: Path, batch: int) -> float:
    """Median seconds per engine step over the scrape intervals an engine spent at ``batch``
    running sequences, from vLLM's own iteration counter in the raw scrapes (each engine's
    folder apart). The catalog does not keep the counter; it tells whether two runs had the
    same machine under them."""
    per_step: list[float] = []
    folders = sorted({p.parent for p in root.rglob("metrics_*.prom")})
    for folder in folders:
        scrapes = []
        for path in sorted(folder.glob("metrics_*.prom")):
            values = {}
            for name, _labels, value in _SAMPLE.findall(path.read_text()):
                values[name] = values.get(name, 0.0) + float(value)
            scrapes.append((int(path.stem.split("_")[1]), values))
        for (t0, a), (t1, b) in zip(scrapes, scrapes[1:]):
            steps = b.get("vllm:iteration_tokens_total_count", 0) - a.get("vllm:iteration_tokens_total_count", 0)
            if steps >= 20 and a.get("vllm:num_requests_running") == b.get("vllm:num_requests_running") == batch:
                per_step.append((t1 - t0) / 1e9 / steps)
    return statistics.median(per_step)


@pytest.mark.parametrize("series", SERIES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_prediction_against_the_real_run(imported, case: str, series: str) -> None:
    server, windows, _ = imported
    base, real, change = CASES[case][0] + series, CASES[case][1] + series, CASES[case][2]
    store = server.runtime.store
    # Refused bases (replay off by more than 30 %) are predicted anyway, to measure them.
    answer = predict(store, *windows[base], change, max_error=10.0)
    truth = observed_figures(fetch_calibration(store, *windows[real]))["all"]
    predicted, replayed = answer.predicted["all"], answer.replayed["all"]
    p50 = relative_error(predicted.ttft_p50_seconds, truth.ttft_p50_seconds, QUEUE_FLOOR_SECONDS)
    p99 = relative_error(predicted.ttft_p99_seconds, truth.ttft_p99_seconds, QUEUE_FLOOR_SECONDS)
    print(
        f"{case}{series}: replay error {answer.max_error:.0%}; TTFT p50 {predicted.ttft_p50_seconds:.2f} s vs real "
        f"{truth.ttft_p50_seconds:.2f} s ({p50:+.0%}), p99 {predicted.ttft_p99_seconds:.2f} s vs "
        f"{truth.ttft_p99_seconds:.2f} s ({p99:+.0%}); warnings {answer.warnings}"
    )
    assert p50 is not None and p99 is not None
    # The answer is never confidently wrong: a prediction off the target was refused (its
    # replay off by more than the default limit), or warned that it extrapolates or that a
    # 10 % error in engine speed moves it past the target.
    if abs(p50) > TARGET or abs(p99) > TARGET:
        warned = any(w.startswith(("extrapolates", "sensitive")) for w in answer.warnings)
        assert warned or answer.max_error > MAX_CALIBRATION_ERROR, answer.warnings
    if (case, series) in P50_MET:
        assert abs(p50) <= TARGET
    # Whatever the error, the direction of the effect must be right.
    if truth.ttft_p50_seconds < observed_figures(fetch_calibration(store, *windows[base]))["all"].ttft_p50_seconds:
        assert predicted.ttft_p50_seconds < replayed.ttft_p50_seconds
    else:
        assert predicted.ttft_p50_seconds > replayed.ttft_p50_seconds
    # The band is around the prediction, faster steps never give a longer TTFT.
    faster, slower = answer.sensitivity["all"]
    assert faster.ttft_p50_seconds <= predicted.ttft_p50_seconds <= slower.ttft_p50_seconds


def test_the_tail_of_fewer_slots_against_three_real_runs_of_it(imported) -> None:
    # slots8_quiet → max_num_seqs 4, against slots4's configuration run three times on the quiet
    # machine: the real runs' TTFT p50 spread 0.79-2.47 s and p99 4.1-6.7 s, more than the ±25 %
    # target, so one real run cannot be the truth; the middle one is the fairest.
    server, windows, _ = imported
    store = server.runtime.store
    answer = predict(store, *windows["slots8_quiet"], Change(max_num_seqs=4), max_error=10.0)
    predicted = answer.predicted["all"]
    real = sorted(
        (observed_figures(fetch_calibration(store, *windows[name]))["all"] for name in REPEATS),
        key=lambda figures: figures.ttft_p99_seconds,
    )
    p99s = [r.ttft_p99_seconds for r in real]
    print(f"predicted p99 {predicted.ttft_p99_seconds:.2f} s; real {', '.join(f'{v:.2f}' for v in p99s)} s")
    assert max(p99s) > (1 + TARGET) * min(p99s)  # the runs themselves differ by more than the target
    error = relative_error(predicted.ttft_p99_seconds, p99s[1], QUEUE_FLOOR_SECONDS)
    assert error is not None and abs(error) <= TARGET, error
    # The median is below every real run: the fitted steps at 4 sequences are faster than
    # those runs' engines stepped (README), and the answer says it is sensitive to that.
    assert predicted.ttft_p50_seconds < min(r.ttft_p50_seconds for r in real)
    assert any(w.startswith("sensitive") for w in answer.warnings), answer.warnings


@pytest.mark.parametrize("series", SERIES)
def test_two_servers_on_this_machine_ran_each_engine_at_half_the_speed_of_one(imported, series: str) -> None:
    # A prediction of more replicas assumes each new one as fast as the observed engine (its
    # own machine); here both engines shared two cores with their API servers and the load.
    _, _, roots = imported
    one = full_batch_step_seconds(roots["slots4" + series], 4)
    two = full_batch_step_seconds(roots["replicas2" + series], 4)
    print(f"engine step at batch 4: one server {one * 1e3:.1f} ms, each of two {two * 1e3:.1f} ms")
    assert two >= 1.5 * one


def test_the_read_api_answers_and_refuses(imported) -> None:
    server, windows, _ = imported
    start, end = windows["slots8"]
    params = {"start": start.isoformat(), "end": end.isoformat()}
    body = httpx.get(f"{server.url}/api/v1/whatif", params=params | {"max_num_seqs": 16}, timeout=120).json()
    assert body["settings"]["max_num_seqs"] == 16 and body["calibration"]["num_kv_blocks"] == 2047
    assert body["calibration"]["block_size_tokens"] == 32 and body["calibration"]["max_num_seqs"] == 8
    assert "cache_config_info" in body["calibration"]["sources"]["kv_blocks"]
    assert any("extrapolates" in w for w in body["warnings"])
    tight = httpx.get(f"{server.url}/api/v1/whatif", params=params | {"max_calibration_error": 0.01}, timeout=120)
    assert tight.status_code == 422 and "calibration off by" in tight.json()["detail"][0]["msg"]
    assert tight.json()["detail"][0]["msg"].endswith("read the prediction with it")  # whole, not cut
    bad = httpx.get(f"{server.url}/api/v1/whatif", params=params | {"kv_blocks": "lots"}, timeout=120)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "kv_blocks"]
    budget = httpx.get(f"{server.url}/api/v1/whatif", params=params | {"step_token_budget": 0}, timeout=120)
    assert budget.status_code == 422 and budget.json()["detail"][0]["loc"] == ["query", "step_token_budget"]
    split = httpx.get(
        f"{server.url}/api/v1/whatif", params=params | {"split_endpoint_classes": "interactive=1"}, timeout=120
    )
    assert split.status_code == 422 and "no endpoint class" in split.json()["detail"][0]["msg"]
    early = datetime(2020, 1, 1, tzinfo=timezone.utc)
    empty = httpx.get(
        f"{server.url}/api/v1/whatif",
        params={"start": early.isoformat(), "end": early.replace(hour=1).isoformat()},
        timeout=120,
    )
    assert empty.status_code == 422 and "insufficient data" in empty.json()["detail"][0]["msg"]


def test_kv_usage_is_compared_over_the_same_span_however_wide_the_window(imported) -> None:
    # `whatif --from -30m` around a load of two minutes: the observed mean is the load's own
    # scrapes, the replay's mean must cover the same span (it was averaged from the window's
    # start: 0.09 replayed against 0.74 observed on the demo's window).
    server, windows, _ = imported
    start, end = windows["kv48"]
    own = predict(server.runtime.store, start, end, Change(replicas=2), max_error=10.0)
    # Three minutes before: kv48's idle engine being scraped; the run before it ended 245 s earlier.
    wide = predict(server.runtime.store, start - timedelta(minutes=3), end, Change(replicas=2), max_error=10.0)
    for key in ("observed_mean_ratio", "replayed_mean_ratio"):
        assert own.kv[key] is not None and own.kv[key] > 0.5, own.kv
        assert wide.kv[key] == pytest.approx(own.kv[key], rel=0.1), (key, own.kv, wide.kv)
    assert wide.kv["replayed_mean_ratio"] == pytest.approx(wide.kv["observed_mean_ratio"], rel=0.3), wide.kv


def test_a_small_step_token_budget_is_replayed_with_the_prefix_cache_and_its_change_predicted(imported) -> None:
    server, windows, _ = imported
    store = server.runtime.store
    calibration = fetch_calibration(store, *windows["token_budget_c"])
    assert calibration.prefix_cache_hit_ratio > 0.9, calibration.sources
    assert "prefix_cache_hits_total" in calibration.sources["prefix_cache_hit_ratio"]
    # Every prompt token computed through 32 tokens a step, the replay was off by +83,000 %:
    # only the prefix cache's misses are computed, and the replay is accepted.
    answer = predict(store, *windows["token_budget_c"], Change(max_num_batched_tokens=2048), max_num_batched_tokens=32)
    assert answer.max_error <= MAX_CALIBRATION_ERROR
    assert answer.settings["max_num_batched_tokens"] == 2048 and answer.change.describe() == "step_token_budget 2048"
    truth = observed_figures(fetch_calibration(store, *windows["token_budget_control"]))["all"]
    predicted, replayed, observed = answer.predicted["all"], answer.replayed["all"], answer.observed["all"]
    p50 = relative_error(predicted.ttft_p50_seconds, truth.ttft_p50_seconds, QUEUE_FLOOR_SECONDS)
    p99 = relative_error(predicted.ttft_p99_seconds, truth.ttft_p99_seconds, QUEUE_FLOOR_SECONDS)
    print(
        f"step budget 32 -> 2048: replay error {answer.max_error:.0%}; TTFT p50 {predicted.ttft_p50_seconds:.3f} s vs "
        f"real {truth.ttft_p50_seconds:.3f} s ({p50:+.0%}), p99 {predicted.ttft_p99_seconds:.2f} s vs "
        f"{truth.ttft_p99_seconds:.2f} s ({p99:+.0%}); warnings {answer.warnings}"
    )
    assert p50 is not None and p99 is not None
    # The tail's direction is right: a larger budget shortened the real TTFT p99 (3.1 -> 2.1 s).
    assert truth.ttft_p99_seconds < observed.ttft_p99_seconds and predicted.ttft_p99_seconds < replayed.ttft_p99_seconds
    if abs(p50) > TARGET or abs(p99) > TARGET:
        assert any(w.startswith(("extrapolates", "sensitive")) for w in answer.warnings), answer.warnings
    assert not any("is assumed" in w for w in answer.warnings), answer.warnings
    # Without the engine's own budget, vLLM's 2048 is assumed and the change to 2048 is the
    # replay itself: said, not answered as "no effect" in silence.
    unsure = predict(store, *windows["token_budget_c"], Change(max_num_batched_tokens=2048), max_error=10.0)
    assert any(w.startswith("the observed engine's step-token budget is assumed (2048") for w in unsure.warnings)
