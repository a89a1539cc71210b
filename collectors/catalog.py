"""The signal catalog: which source metric means which canonical signal, and in what unit.

Every GPU or engine exporter names the same facts differently (dcgm-exporter reports memory
in MiB and utilization in percent, vLLM renamed its KV-cache gauge, SGLang calls its queue
``num_queue_reqs``). This table maps each source's Prometheus sample name to one canonical
signal whose name carries its unit, with the conversion to that unit; it is the ONE place
where units are converted.

Canonical signals (unit as the OTel/UCUM string stored with each sample):

| signal | unit | kind |
|---|---|---|
| gpu_utilization_ratio | ``1`` (0-1) | gauge |
| gpu_sm_active_ratio | ``1`` (0-1) | gauge |
| gpu_memory_used_bytes, gpu_memory_total_bytes | ``By`` | gauge |
| gpu_power_watts | ``W`` | gauge |
| queue_depth, running_requests | ``{request}`` | gauge |
| kv_cache_usage_ratio | ``1`` (0-1) | gauge |
| preemptions_total | ``{preemption}`` | sum (monotonic counter) |
| batch_size | ``{request}`` | gauge |

Sources and their metric names: dcgm-exporter (``DCGM_FI_DEV_*``, NVIDIA's
``dcgm-exporter/etc/default-counters.csv``), vLLM (V1 names and the deprecated V0
``vllm:gpu_cache_usage_perc``, ``docs/design/metrics.md``), SGLang (``docs/references/
production_metrics.md``), TGI (``router/src/server.rs`` metric names) and Triton
(``docs/user_guide/metrics.md``). Adding a source means adding rows here, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

MIB_BYTES = 1024 * 1024

Kind = Literal["gauge", "sum"]


@dataclass(frozen=True)
class Signal:
    """A canonical signal: its name (with unit), OTel unit string, kind and meaning."""

    name: str
    unit: str
    kind: Kind
    description: str


SIGNALS: dict[str, Signal] = {s.name: s for s in (
    Signal("gpu_utilization_ratio", "1", "gauge", "Fraction of time a kernel ran on the GPU, 0-1."),
    Signal("gpu_sm_active_ratio", "1", "gauge", "Fraction of time at least one warp was active on an SM, 0-1."),
    Signal("gpu_memory_used_bytes", "By", "gauge", "GPU framebuffer memory in use."),
    Signal("gpu_memory_total_bytes", "By", "gauge", "GPU framebuffer memory in total."),
    Signal("gpu_power_watts", "W", "gauge", "GPU power draw."),
    Signal("queue_depth", "{request}", "gauge", "Requests waiting to be scheduled by the engine."),
    Signal("running_requests", "{request}", "gauge", "Requests in the engine's running batch."),
    Signal("kv_cache_usage_ratio", "1", "gauge", "Fraction of KV-cache blocks (or token slots) in use, 0-1."),
    Signal("preemptions_total", "{preemption}", "sum", "Sequences preempted by the engine since start."),
    Signal("batch_size", "{request}", "gauge", "Size of the batch the engine is currently running."),
)}


def _identity(value: float) -> float:
    return value


def percent_to_ratio(value: float) -> float:
    """0-100 percent -> 0-1 ratio."""
    return value / 100.0


def mib_to_bytes(value: float) -> float:
    """MiB (dcgm-exporter's framebuffer unit) -> bytes."""
    return value * MIB_BYTES


@dataclass(frozen=True)
class SourceMetric:
    """One row: ``metric`` (a Prometheus sample name) of ``source`` is ``signal`` after ``convert``."""

    source: str
    metric: str
    signal: str
    convert: Callable[[float], float] = _identity
    deprecated: bool = False


@dataclass(frozen=True)
class DerivedMetric:
    """A signal computed from several samples of one series (same labels): the sum of ``inputs``.

    ``required`` inputs must all be present; optional ones are added when present.
    """

    source: str
    signal: str
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    convert: Callable[[float], float] = _identity


CATALOG: tuple[SourceMetric, ...] = (
    # dcgm-exporter: percent, MiB, W.
    SourceMetric("dcgm", "DCGM_FI_DEV_GPU_UTIL", "gpu_utilization_ratio", percent_to_ratio),
    SourceMetric("dcgm", "DCGM_FI_DEV_FB_USED", "gpu_memory_used_bytes", mib_to_bytes),
    SourceMetric("dcgm", "DCGM_FI_DEV_POWER_USAGE", "gpu_power_watts"),
    SourceMetric("dcgm", "DCGM_FI_PROF_SM_ACTIVE", "gpu_sm_active_ratio"),  # profiling field, already 0-1
    # vLLM: V1 names first; the V0 names still appear on older deployments.
    SourceMetric("vllm", "vllm:num_requests_waiting", "queue_depth"),
    SourceMetric("vllm", "vllm:num_requests_running", "running_requests"),
    SourceMetric("vllm", "vllm:kv_cache_usage_perc", "kv_cache_usage_ratio"),
    SourceMetric("vllm", "vllm:gpu_cache_usage_perc", "kv_cache_usage_ratio", deprecated=True),
    SourceMetric("vllm", "vllm:num_preemptions_total", "preemptions_total"),
    SourceMetric("vllm", "vllm:num_preemptions", "preemptions_total", deprecated=True),
    # SGLang: token_usage is the fraction of KV token slots in use.
    SourceMetric("sglang", "sglang:num_queue_reqs", "queue_depth"),
    SourceMetric("sglang", "sglang:num_running_reqs", "running_requests"),
    SourceMetric("sglang", "sglang:token_usage", "kv_cache_usage_ratio"),
    # Hugging Face TGI.
    SourceMetric("tgi", "tgi_queue_size", "queue_depth"),
    SourceMetric("tgi", "tgi_batch_current_size", "batch_size"),
    # Triton Inference Server: utilization already a 0-1 ratio, memory in bytes.
    SourceMetric("triton", "nv_inference_pending_request_count", "queue_depth"),
    SourceMetric("triton", "nv_gpu_utilization", "gpu_utilization_ratio"),
    SourceMetric("triton", "nv_gpu_memory_used_bytes", "gpu_memory_used_bytes"),
    SourceMetric("triton", "nv_gpu_memory_total_bytes", "gpu_memory_total_bytes"),
    SourceMetric("triton", "nv_gpu_power_usage", "gpu_power_watts"),
)

# dcgm-exporter has no total; the framebuffer splits into used + free + reserved (the
# reserved part is exported by recent versions: L40S 0 + 45459 + 608 = 46067 MiB, what
# nvidia-smi shows as 46068 MiB).
DERIVED: tuple[DerivedMetric, ...] = (
    DerivedMetric("dcgm", "gpu_memory_total_bytes", ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"),
                  ("DCGM_FI_DEV_FB_RESERVED",), mib_to_bytes),
)

SOURCES: frozenset[str] = frozenset(row.source for row in CATALOG)

_BY_SOURCE: dict[str, dict[str, SourceMetric]] = {}
for _row in CATALOG:
    _BY_SOURCE.setdefault(_row.source, {})[_row.metric] = _row


def metrics_for(source: str) -> dict[str, SourceMetric]:
    """Rows of ``source`` keyed by sample name; raises ``ValueError`` naming known sources."""
    try:
        return _BY_SOURCE[source]
    except KeyError:
        raise ValueError(f"source: unknown {source!r}, expected one of {sorted(SOURCES)}") from None


def derived_for(source: str) -> tuple[DerivedMetric, ...]:
    """Derived signals of ``source`` (may be empty)."""
    return tuple(d for d in DERIVED if d.source == source)


def signal(name: str) -> Signal:
    """The canonical signal ``name``; raises ``KeyError`` for an unknown one."""
    return SIGNALS[name]
