"""Request rows and engine/GPU samples in simulated time, written to a real store.

Latencies are drawn from seeded log-normal distributions (stage times are positive and
right-skewed); faults add exactly what the named fault adds on a real inference path.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from inferpath.storage.rows import GAUGE_COLUMNS, REQUEST_COLUMNS, SUM_COLUMNS, GaugeRow, RequestRow, SumRow

# Recent and on a minute boundary: readable times in failure messages.
T0 = (datetime.now(timezone.utc) - timedelta(hours=2)).replace(second=0, microsecond=0)
NS = 1_000_000_000

FAULT_START = T0 + timedelta(minutes=2)
FAULT_END = T0 + timedelta(minutes=8)

_counter = iter(range(1, 10**12))


def request(
    ts: datetime,
    ttft_seconds: float,
    *,
    endpoint_class: str = "interactive",
    replica: str = "a",
    status: str = "ok",
    itl_seconds: float | None = 0.02,
    endpoint: str = "/v1/chat/completions",
) -> RequestRow:
    """One stored request with the given TTFT (and ITL), 100 output tokens."""
    ttft_ns = int(ttft_seconds * NS)
    itl_ns = None if itl_seconds is None else int(itl_seconds * NS)
    return RequestRow(
        timestamp=ts,
        trace_id=f"{next(_counter):032x}",
        service_name="gateway",
        endpoint=endpoint,
        endpoint_class=endpoint_class,
        model="m",
        replica=replica,
        status=status,
        http_status_code=200 if status == "ok" else 500,
        output_tokens=100,
        ttft_ns=ttft_ns,
        itl_ns=itl_ns,
        e2e_ns=ttft_ns + 99 * (itl_ns or 0),
    )


def insert_requests(store: Any, rows: Iterable[RequestRow]) -> int:
    """Insert request rows; returns how many."""
    batch = [r.to_insert_row() for r in rows]
    return store.insert("inferpath_requests", batch, REQUEST_COLUMNS)


def traffic(
    start: datetime,
    seconds: float,
    per_second: float,
    ttft: Callable[[random.Random, float], float],
    seed: int = 1,
    **fields: Any,
) -> list[RequestRow]:
    """Evenly spaced requests over ``[start, start + seconds)``; ``ttft(rng, offset_seconds)``."""
    rng = random.Random(seed)
    count = int(seconds * per_second)
    rows = []
    for i in range(count):
        offset = i / per_second
        rows.append(
            request(
                start + timedelta(seconds=offset),
                ttft(rng, offset),
                itl_seconds=0.02 * rng.lognormvariate(0.0, 0.15),
                **fields,
            )
        )
    return rows


def healthy_ttft(rng: random.Random, offset: float) -> float:
    """A healthy interactive TTFT: ~150 ms median, 30% log-normal spread."""
    return 0.15 * rng.lognormvariate(0.0, 0.3)


def signal_rows(
    start: datetime,
    seconds: int,
    *,
    queue_depth: Callable[[float], float] = lambda t: 2.0,
    kv_cache_usage_ratio: float | None = 0.5,
    gpu_utilization_ratio: float | None = 0.6,
    preemptions_per_minute: float = 0.0,
    seed: int = 1,
    gpus: int = 2,
) -> tuple[list, list]:
    """Samples every second: per engine queue depth, KV usage, preemption counter; per GPU
    utilization (``None``: the device cannot report it, stored as NaN as NVML gives no value)
    and ``gpu_up`` 1."""
    rng = random.Random(seed)
    gauges, sums = [], []
    counter = 0.0
    resource = {"service.instance.id": "engine-0"}
    for second in range(seconds):
        ts = start + timedelta(seconds=second)
        gauges.append(
            GaugeRow(
                resource,
                "vllm",
                "queue_depth",
                "",
                "1",
                {"engine": "0"},
                None,
                ts,
                max(0.0, queue_depth(second) + rng.gauss(0, 0.3)),
            )
        )
        if kv_cache_usage_ratio is not None:
            gauges.append(
                GaugeRow(
                    resource,
                    "vllm",
                    "kv_cache_usage_ratio",
                    "",
                    "1",
                    {"engine": "0"},
                    None,
                    ts,
                    min(1.0, max(0.0, rng.gauss(kv_cache_usage_ratio, 0.01))),
                )
            )
        for gpu in range(gpus):
            value = (
                math.nan
                if gpu_utilization_ratio is None
                else min(1.0, max(0.0, rng.gauss(gpu_utilization_ratio, 0.02)))
            )
            gauges.append(
                GaugeRow(
                    {"host.name": "node-0"},
                    "dcgm",
                    "gpu_utilization_ratio",
                    "",
                    "1",
                    {"gpu": str(gpu)},
                    None,
                    ts,
                    value,
                )
            )
            gauges.append(
                GaugeRow(
                    {"host.name": "node-0"},
                    "nvml",
                    "gpu_up",
                    "",
                    "1",
                    {"host": "node-0", "UUID": f"GPU-{gpu:08d}", "gpu": str(gpu)},
                    None,
                    ts,
                    1.0,
                )
            )
        counter += preemptions_per_minute / 60.0
        sums.append(
            SumRow(resource, "vllm", "preemptions_total", "", "1", {"engine": "0"}, start, ts, float(int(counter)))
        )
    return gauges, sums


def insert_signals(store: Any, gauges: list, sums: list) -> None:
    """Insert gauge and sum rows. Gauges go in as they are (``checked``): a NaN value stays
    NaN, as another writer of the table (the Collector's ClickHouse exporter) may store it;
    inferpath's own writers refuse it (storage/values.py)."""
    if gauges:
        store.insert("otel_metrics_gauge", [g.to_insert_row() for g in gauges], GAUGE_COLUMNS, checked=True)
    if sums:
        store.insert("otel_metrics_sum", [s.to_insert_row() for s in sums], SUM_COLUMNS)


def simulate(evaluator: Any, start: datetime, seconds: float, step_seconds: float) -> list:
    """Evaluate at ``start, start + step, …`` (< ``start + seconds``); all transitions in order."""
    transitions = []
    now = start
    while now < start + timedelta(seconds=seconds):
        transitions.extend(evaluator.evaluate_once(now))
        now += timedelta(seconds=step_seconds)
    return transitions


def batch_window_traffic(t0=T0) -> list:
    """16 minutes of interactive traffic from ``t0 - 2 min``, the fault from ``t0 + 2 min`` to ``t0 + 8 min``."""
    # An oversized batch window: during the fault, a request arriving just after a batch
    # closed (every 33rd here, 3%) waits a whole 3 s window; the others do not.
    fault_start, fault_end = t0 + (FAULT_START - T0), t0 + (FAULT_END - T0)

    def ttft(rng, offset_seconds):
        base = healthy_ttft(rng, offset_seconds)
        ts = t0 - timedelta(minutes=2) + timedelta(seconds=offset_seconds)
        if fault_start <= ts < fault_end and int(offset_seconds * 5) % 33 == 0:
            return base + 3.0
        return base

    return traffic(t0 - timedelta(minutes=2), 16 * 60, 5.0, ttft, seed=7)
