"""Benchmark: the diagnosis over one hour of data at 50 requests/s, against one raw query.

Builds a fresh embedded store holding one hour of request rows at ``--rate`` requests/s
(180,000 by default; the second half with a slow tokenizer, so the diagnosis has work to do)
and collector samples every ``--sample-seconds`` (six canonical gauges per engine and GPU
plus the preemption counter). Then, in the same run and on the same store, it times:

- the reference: one raw latency-summary query over the hour (``Reader.latency_summary``:
  count, mean and exact p50/p95/p99 of the 14 measures in ClickHouse);
- the diagnosis of the second half hour against the first (``analysis.diagnose``).

Each is run ``--repeat`` times; the best and median are printed with their ratio.
``python bench/diagnosis.py [--rate 50] [--hours 1] [--sample-seconds 2] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone

from inferpath.analysis import diagnose
from inferpath.storage.reader import Reader
from inferpath.storage.rows import GAUGE_COLUMNS, REQUEST_COLUMNS, SUM_COLUMNS, GaugeRow, RequestRow, SumRow
from inferpath.storage.store import Store

MS = 1_000_000
GAUGES = {
    "queue_depth": 2.0,
    "running_requests": 24.0,
    "kv_cache_usage_ratio": 0.5,
    "gpu_utilization_ratio": 0.55,
    "gpu_memory_used_bytes": 7e10,
    "gpu_power_watts": 420.0,
}


def build(store: Store, start: datetime, *, rate: float, hours: float, sample_seconds: float, seed: int = 1) -> int:
    """Insert the synthetic hour into ``store``; returns the number of request rows."""
    rng = random.Random(seed)
    total_seconds = hours * 3600
    count = int(total_seconds * rate)
    half = total_seconds / 2
    batch: list = []
    for i in range(count):
        offset = i / rate
        slow = offset >= half
        stages = {
            "gateway_ns": int(MS * rng.lognormvariate(0, 0.2)),
            "tokenize_ns": int((160 if slow else 4) * MS * rng.lognormvariate(0, 0.2)),
            "retrieval_ns": int(20 * MS * rng.lognormvariate(0, 0.2)),
            "network_ns": int(2 * MS * rng.lognormvariate(0, 0.2)),
            "queue_ns": int(5 * MS * rng.lognormvariate(0, 0.5)),
            "prefill_ns": int(40 * MS * rng.lognormvariate(0, 0.2)),
        }
        output_tokens = rng.randint(20, 200)
        itl = int(20 * MS * rng.lognormvariate(0, 0.1))
        ttft = sum(stages.values()) + MS
        batch.append(
            RequestRow(
                timestamp=start + timedelta(seconds=offset),
                trace_id=f"{seed:08x}{i:024x}",
                service_name="gateway",
                endpoint="/v1/chat/completions",
                endpoint_class="interactive",
                model="m",
                replica="engine-0",
                status="ok",
                http_status_code=200,
                input_tokens=512,
                output_tokens=output_tokens,
                ttft_ns=ttft,
                e2e_ns=ttft + itl * (output_tokens - 1),
                itl_ns=itl,
                decode_ns=itl * (output_tokens - 1),
                **stages,
            ).to_insert_row()
        )
        if len(batch) >= 50_000:
            store.insert("inferpath_requests", batch, REQUEST_COLUMNS)
            batch = []
    if batch:
        store.insert("inferpath_requests", batch, REQUEST_COLUMNS)
    gauges, sums = [], []
    resource = {"service.instance.id": "engine-0"}
    for step in range(int(total_seconds / sample_seconds)):
        ts = start + timedelta(seconds=step * sample_seconds)
        for name, mean in GAUGES.items():
            attributes = {"gpu": "0"} if name.startswith("gpu_") else {"engine": "0"}
            gauges.append(
                GaugeRow(
                    resource_attributes=resource,
                    service_name="engine",
                    metric_name=name,
                    description="",
                    unit="",
                    attributes=attributes,
                    start_time=None,
                    time=ts,
                    value=mean * rng.uniform(0.9, 1.1),
                ).to_insert_row()
            )
        sums.append(
            SumRow(
                resource_attributes=resource,
                service_name="engine",
                metric_name="preemptions_total",
                description="",
                unit="",
                attributes={"engine": "0"},
                start_time=start,
                time=ts,
                value=0.0,
            ).to_insert_row()
        )
    store.insert("otel_metrics_gauge", gauges, GAUGE_COLUMNS)
    store.insert("otel_metrics_sum", sums, SUM_COLUMNS)
    return count


def timed(call, repeat: int) -> list[float]:
    """Wall seconds of ``repeat`` calls (monotonic clock)."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second")
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--sample-seconds", type=float, default=2.0, help="collector sample interval")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--limit-seconds", type=float, default=2.0, help="fail (exit 1) above this")
    args = parser.parse_args(argv)
    start = (datetime.now(timezone.utc) - timedelta(hours=args.hours + 0.1)).replace(microsecond=0)
    end = start + timedelta(hours=args.hours)
    middle = start + (end - start) / 2
    with tempfile.TemporaryDirectory() as folder, Store.open(f"chdb://{folder}/store") as store:
        t0 = time.perf_counter()
        count = build(store, start, rate=args.rate, hours=args.hours, sample_seconds=args.sample_seconds)
        print(
            f"built {count} request rows and samples every {args.sample_seconds:g} s "
            f"in {time.perf_counter() - t0:.1f} s"
        )
        reader = Reader(store)
        reference = timed(lambda: reader.latency_summary(start, end), args.repeat)
        verdicts = []
        diagnosis = timed(
            lambda: verdicts.append(
                diagnose(store, window_start=middle, window_end=end, baseline_start=start, baseline_end=middle)
            ),
            args.repeat,
        )
    best_ref, best_diag = min(reference), min(diagnosis)
    print(
        f"reference  latency-summary query over {count} rows: best {best_ref:.3f} s, "
        f"median {statistics.median(reference):.3f} s"
    )
    print(
        f"diagnosis  half hour vs half hour, same rows:        best {best_diag:.3f} s, "
        f"median {statistics.median(diagnosis):.3f} s"
    )
    print(f"ratio diagnosis / reference (best): {best_diag / best_ref:.1f}x; top cause {verdicts[-1].top_cause}")
    ok = best_diag <= args.limit_seconds and verdicts[-1].top_cause == "tokenization"
    print("within the limit" if ok else f"OVER the {args.limit_seconds:g} s limit or wrong cause")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
