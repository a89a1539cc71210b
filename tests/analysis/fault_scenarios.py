"""Request rows and engine/GPU samples shaped like each fault the demo can inject.

Every scenario has a baseline window and a current window of the same length; the current
window changes exactly what the named fault changes on a real inference path, and nothing
else. Values are drawn from a seeded generator so each run sees the same data.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from inferpath.storage.rows import GAUGE_COLUMNS, REQUEST_COLUMNS, SUM_COLUMNS, GaugeRow, RequestRow, SumRow

MS = 1_000_000
# Recent, because every table has a TTL and expired rows are dropped at insert.
T0 = (datetime.now(timezone.utc) - timedelta(hours=1)).replace(second=0, microsecond=0)
WINDOW = timedelta(minutes=10)


@dataclass
class Profile:
    """Typical per-stage times (ms) and engine state of one window."""

    tokenize_ms: float = 4.0
    retrieval_ms: float = 20.0
    gateway_ms: float = 1.0
    network_ms: float = 2.0
    queue_ms: float = 5.0
    prefill_ms: float = 40.0
    itl_ms: float = 20.0
    queue_tail_ms: float = 0.0  # extra queue time for 10% of requests (bursts)
    queue_depth: float = 1.0
    running_requests: float = 8.0
    kv_cache_usage_ratio: float = 0.45
    gpu_utilization_ratio: float = 0.55
    preemptions_per_minute: float = 0.0
    replica: str = "engine-0"
    cold_replica: str | None = None  # a replica that starts at the window's start
    cold_extra_ms: float = 0.0


@dataclass
class Scenario:
    baseline: Profile = field(default_factory=Profile)
    current: Profile = field(default_factory=Profile)


SCENARIOS: dict[str, Scenario] = {
    "healthy": Scenario(),
    "slow_tokenizer": Scenario(current=Profile(tokenize_ms=160.0)),
    "slow_retrieval": Scenario(current=Profile(retrieval_ms=400.0)),
    "extra_network_hop": Scenario(current=Profile(network_ms=90.0)),
    "oversized_batch": Scenario(current=Profile(itl_ms=48.0, running_requests=40.0, gpu_utilization_ratio=0.8)),
    "kv_cache_pressure": Scenario(
        current=Profile(
            queue_ms=60.0,
            queue_tail_ms=900.0,
            queue_depth=24.0,
            kv_cache_usage_ratio=0.95,
            preemptions_per_minute=12.0,
            gpu_utilization_ratio=0.7,
            itl_ms=24.0,
        )
    ),
    "gpu_saturation": Scenario(
        current=Profile(
            queue_ms=80.0,
            queue_tail_ms=700.0,
            queue_depth=20.0,
            prefill_ms=55.0,
            gpu_utilization_ratio=0.99,
            kv_cache_usage_ratio=0.6,
        )
    ),
    "cold_start": Scenario(current=Profile(cold_replica="engine-1", cold_extra_ms=4000.0)),
}


def _jitter(rng: random.Random, value_ms: float) -> int:
    # Log-normal spread with a ~20% sigma: stage times are positive and right-skewed.
    return int(value_ms * MS * rng.lognormvariate(0.0, 0.2))


def request_rows(profile: Profile, start: datetime, seed: int, per_second: float = 1.0) -> list[RequestRow]:
    """One request every ``1 / per_second`` seconds over :data:`WINDOW`."""
    rng = random.Random(seed)
    rows = []
    count = int(WINDOW.total_seconds() * per_second)
    for i in range(count):
        ts = start + timedelta(seconds=i / per_second)
        replica = profile.replica
        extra = 0
        if profile.cold_replica and i % 2 == 1:
            replica = profile.cold_replica
            if ts - start <= timedelta(seconds=50):
                extra = _jitter(rng, profile.cold_extra_ms)
        output_tokens = rng.randint(50, 150)
        stages = {
            "gateway_ns": _jitter(rng, profile.gateway_ms),
            "tokenize_ns": _jitter(rng, profile.tokenize_ms),
            "retrieval_ns": _jitter(rng, profile.retrieval_ms),
            "network_ns": _jitter(rng, profile.network_ms),
            "queue_ns": _jitter(rng, profile.queue_ms)
            + (_jitter(rng, profile.queue_tail_ms) if rng.random() < 0.1 else 0),
            "prefill_ns": _jitter(rng, profile.prefill_ms),
        }
        itl_ns = _jitter(rng, profile.itl_ms)
        decode_ns = itl_ns * (output_tokens - 1)
        ttft_ns = sum(stages.values()) + MS + extra  # 1 ms nobody instruments, plus a cold start
        rows.append(
            RequestRow(
                timestamp=ts,
                trace_id=f"{seed:08x}{i:024x}",
                service_name="gateway",
                endpoint="/v1/chat/completions",
                endpoint_class="interactive",
                model="m",
                replica=replica,
                status="ok",
                http_status_code=200,
                input_tokens=512,
                output_tokens=output_tokens,
                ttft_ns=ttft_ns,
                e2e_ns=ttft_ns + decode_ns,
                itl_ns=itl_ns,
                decode_ns=decode_ns,
                model_ns=stages["queue_ns"] + stages["prefill_ns"] + decode_ns,
                **stages,
            )
        )
    return rows


def signal_rows(profile: Profile, start: datetime, seed: int, preemptions_before: float) -> tuple[list, list, float]:
    """Gauge samples every second per engine and a cumulative preemption counter."""
    rng = random.Random(seed + 1)
    gauges, sums = [], []
    counter = preemptions_before
    for second in range(int(WINDOW.total_seconds())):
        ts = start + timedelta(seconds=second)
        values = {
            "queue_depth": max(0.0, rng.gauss(profile.queue_depth, profile.queue_depth * 0.2)),
            "running_requests": max(0.0, rng.gauss(profile.running_requests, 1.0)),
            "kv_cache_usage_ratio": min(1.0, max(0.0, rng.gauss(profile.kv_cache_usage_ratio, 0.02))),
            "gpu_utilization_ratio": min(1.0, max(0.0, rng.gauss(profile.gpu_utilization_ratio, 0.02))),
            "gpu_memory_used_bytes": 70e9,
            "gpu_power_watts": 300 + 400 * profile.gpu_utilization_ratio,
        }
        for name, value in values.items():
            attributes = {"gpu": "0"} if name.startswith("gpu_") else {"engine": "0"}
            gauges.append(
                GaugeRow(
                    resource_attributes={"service.instance.id": "engine-0"},
                    service_name="engine",
                    metric_name=name,
                    description="",
                    unit="",
                    attributes=attributes,
                    start_time=None,
                    time=ts,
                    value=value,
                )
            )
        counter += profile.preemptions_per_minute / 60.0
        sums.append(
            SumRow(
                resource_attributes={"service.instance.id": "engine-0"},
                service_name="engine",
                metric_name="preemptions_total",
                description="",
                unit="",
                attributes={"engine": "0"},
                start_time=T0,
                time=ts,
                value=float(int(counter)),
            )
        )
    return gauges, sums, counter


def load_scenario(store: Any, scenario: Scenario) -> dict[str, datetime]:
    """Insert both windows of ``scenario`` into ``store``; return the window bounds."""
    baseline_start, current_start = T0, T0 + WINDOW
    requests = request_rows(scenario.baseline, baseline_start, seed=1) + request_rows(
        scenario.current, current_start, seed=2
    )
    gauges_b, sums_b, counter = signal_rows(scenario.baseline, baseline_start, seed=1, preemptions_before=0.0)
    gauges_c, sums_c, _ = signal_rows(scenario.current, current_start, seed=2, preemptions_before=counter)
    store.insert("inferpath_requests", [r.to_insert_row() for r in requests], REQUEST_COLUMNS)
    store.insert("otel_metrics_gauge", [g.to_insert_row() for g in gauges_b + gauges_c], GAUGE_COLUMNS)
    store.insert("otel_metrics_sum", [s.to_insert_row() for s in sums_b + sums_c], SUM_COLUMNS)
    return {
        "baseline_start": baseline_start,
        "baseline_end": current_start,
        "window_start": current_start,
        "window_end": current_start + WINDOW,
    }


def budget_rows(count: int, tokenize_ms: float, retrieval_ms: float, prefill_ms: float) -> list[dict]:
    """The guidance's worked example as request rows: an interactive endpoint whose TTFT is
    gateway 8 ms + tokenize + retrieval + queue 20 ms + prefill + network 2 ms + 10 ms
    nobody instruments (each ±3%), then 400 ms of decode."""
    rng = random.Random(3)
    rows = []
    for i in range(count):
        stages = {
            "gateway_ns": 8 * MS,
            "tokenize_ns": int(tokenize_ms * MS * rng.uniform(0.97, 1.03)),
            "retrieval_ns": int(retrieval_ms * MS * rng.uniform(0.97, 1.03)),
            "queue_ns": 20 * MS,
            "prefill_ns": int(prefill_ms * MS * rng.uniform(0.97, 1.03)),
            "network_ns": 2 * MS,
        }
        ttft = sum(stages.values()) + 10 * MS
        rows.append(
            {
                "timestamp": T0 + timedelta(seconds=i),
                "trace_id": f"{i:032x}",
                "replica": "r",
                "endpoint_class": "interactive",
                "ttft_ns": ttft,
                "e2e_ns": ttft + 400 * MS,
                "decode_ns": 400 * MS,
                **stages,
            }
        )
    return rows
