"""Benchmark: a what-if prediction over one hour of traffic at 50 requests/s, against the
engine model's core loop alone.

The window: the Azure code trace shipped with the demo (``demo/assets/traces``, or
``--trace``), its arrivals compressed to ``--rate`` requests/s and repeated to fill
``--hours``, its prompt and output lengths kept; the spans of every request are what the
engine model (:func:`inferpath.analysis.whatif_engine.run_engine`, vLLM V1's scheduling)
did with it on ``--replicas`` engines of a known step law, KV pool and batch limit. Then, in
the same run, it times:

- the reference: the core loop, one replay of the whole window on the observed replicas
  (requests and simulated steps per second);
- the prediction: what ``inferpath whatif --replicas N+1`` does once the rows are read:
  calibrate from the rows (the step law by robust least squares), replay the observed
  configuration until its level fits, check it, replay the change.

Wall and CPU seconds are printed (the machine may be shared: CPU seconds are what the
prediction itself costs), with the ratio to the 10 s target.
``python bench/whatif_speed.py [--rate 50] [--hours 1] [--replicas 4] [--repeat 2]``
"""

from __future__ import annotations

import argparse
import csv
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from inferpath.analysis.whatif import Change, EngineSettings, what_if
from inferpath.analysis.whatif_calibration import calibrate
from inferpath.analysis.whatif_engine import run_engine

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "demo" / "assets" / "traces" / "azure2023_AzureLLMInferenceTrace_code.csv"
TARGET_SECONDS = 10.0
LAW = (0.010, 0.0001, 0.000012)  # s per step, per sequence, per prompt token (an 8B model on one GPU, roughly)
POOL = EngineSettings(num_kv_blocks=16_384, block_size_tokens=16, max_num_seqs=256, max_num_batched_tokens=2048)
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def step_seconds(num_seqs: int, prefill_tokens: int) -> float:
    return LAW[0] + LAW[1] * num_seqs + LAW[2] * prefill_tokens


def load_trace(path: Path) -> list[tuple[float, int, int]]:
    """``(arrival seconds from the first, prompt tokens, output tokens)`` of an Azure 2023 CSV."""
    out = []
    with open(path) as f:
        for row in csv.DictReader(f):
            stamp = datetime.strptime(row["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f").timestamp()
            out.append((stamp, max(1, int(row["ContextTokens"])), max(1, int(row["GeneratedTokens"]))))
    first = out[0][0]
    return [(t - first, p, o) for t, p, o in out]


def window(trace: list[tuple[float, int, int]], rate: float, seconds: float) -> list[tuple[float, int, int]]:
    """The trace's pattern at ``rate`` requests/s, repeated until ``seconds`` are full."""
    span = trace[-1][0] or 1.0
    factor = rate / (len(trace) / span)
    length = span / factor
    out, copy = [], 0
    while copy * length < seconds:
        out += [(copy * length + t / factor, p, o) for t, p, o in trace if copy * length + t / factor < seconds]
        copy += 1
    return sorted(out)


def observed_rows(requests: list[tuple[float, int, int]], replicas: int) -> list[dict]:
    """Request rows as the engines of the known law would have produced them (round robin)."""
    rows: list[dict] = []
    for k in range(replicas):
        mine = requests[k::replicas]
        run = run_engine(
            [a for a, _, _ in mine], [min(p, 16_000) for _, p, _ in mine], [o for _, _, o in mine], POOL, step_seconds
        )
        for j, (at, prompt, output) in enumerate(mine):
            scheduled, first, end = run.first_scheduled_s[j], run.first_token_s[j], run.finished_s[j]
            if first is None or end is None or scheduled is None:
                continue
            rows.append(
                {
                    "timestamp": T0 + timedelta(seconds=at),
                    "endpoint_class": "interactive",
                    "replica": f"engine-{k}",
                    "input_tokens": min(prompt, 16_000),
                    "output_tokens": output,
                    "ttft_ns": int((first - at) * 1e9),
                    "e2e_ns": int((end - at) * 1e9),
                    "queue_ns": int((scheduled - at) * 1e9),
                    "prefill_ns": int((first - scheduled) * 1e9),
                    "decode_ns": int((end - first) * 1e9),
                    "itl_ns": None,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second")
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--replicas", type=int, default=4, help="engines of the observed window")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    seconds = args.hours * 3600
    requests = window(load_trace(Path(args.trace)), args.rate, seconds)
    began = time.perf_counter()
    rows = observed_rows(requests, args.replicas)
    print(
        f"window: {len(rows)} requests over {seconds:.0f} s ({len(rows) / seconds:.1f}/s) on {args.replicas} "
        f"engines, built in {time.perf_counter() - began:.1f} s"
    )

    # Reference: the core loop over the whole window, once.
    wall, cpu = time.perf_counter(), time.process_time()
    steps = 0
    for k in range(args.replicas):
        mine = requests[k :: args.replicas]
        steps += run_engine(
            [a for a, _, _ in mine], [min(p, 16_000) for _, p, _ in mine], [o for _, _, o in mine], POOL, step_seconds
        ).steps
    loop_wall, loop_cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(
        f"reference, core loop (one replay): {loop_wall:.2f} s wall, {loop_cpu:.2f} s CPU; "
        f"{len(requests) / loop_cpu:,.0f} requests/s and {steps / loop_cpu:,.0f} simulated steps/s of CPU"
    )

    cache = [{"num_gpu_blocks": str(POOL.num_kv_blocks + 1), "block_size": str(POOL.block_size_tokens)}]
    change = Change(replicas=args.replicas + 1)
    results = []
    for _ in range(args.repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        cal = calibrate(rows, {}, window_start=T0, window_end=T0 + timedelta(seconds=seconds), cache_configs=cache)
        answer = what_if(cal, change)
        results.append((time.perf_counter() - wall, time.process_time() - cpu, answer))
    best_wall = min(r[0] for r in results)
    best_cpu = min(r[1] for r in results)
    answer = results[-1][2]
    print(
        f"prediction ({change.describe()}): best {best_wall:.2f} s wall, {best_cpu:.2f} s CPU over {args.repeat} "
        f"runs; {answer.simulated_steps:,} simulated steps; replay within {answer.max_error:.1%}; "
        f"predicted TTFT p50 {answer.predicted['all'].ttft_p50_seconds:.3f} s, "
        f"p99 {answer.predicted['all'].ttft_p99_seconds:.3f} s"
    )
    print(f"ratio prediction / core loop: {best_cpu / loop_cpu:.1f}x CPU")
    print(
        f"target: <= {TARGET_SECONDS:.0f} s; ratio to target {best_wall / TARGET_SECONDS:.2f} wall, "
        f"{best_cpu / TARGET_SECONDS:.2f} CPU -> {'met' if best_wall <= TARGET_SECONDS else 'missed'} (wall)"
    )


if __name__ == "__main__":
    main()
