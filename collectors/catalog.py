"""The signal catalog: which source metric means which canonical signal, and in what unit.

Every GPU or engine exporter names the same facts differently (dcgm-exporter reports memory
in MiB and clocks in MHz, vLLM renamed its KV-cache gauge, SGLang calls its queue
``num_queue_reqs``, Triton's TensorRT-LLM backend splits one gauge by a ``request_type``
label). This table maps each source's Prometheus sample name (and, where needed, a label
value) to one canonical signal whose name carries its unit, with the conversion to that
unit; it is the ONE place where units are converted.

Queue depth, running requests and KV-cache usage follow the cross-engine mapping of the
Kubernetes Gateway API Inference Extension's model-server protocol
(``docs/proposals/003-model-server-protocol``: TotalQueuedRequests, TotalRunningRequests,
KVCacheUtilization). Other sources: dcgm-exporter (``etc/default-counters.csv``, DCGM field
ids in ``dcgm_fields.h``), NVML (``nvml.h``), vLLM (``docs/design/metrics.md``, current and
deprecated V0 names), SGLang (``docs/references/production_metrics.md``), TGI
(``router/src/server.rs``), Triton (``docs/user_guide/metrics.md``, TensorRT-LLM backend
``nv_trt_llm_*``) and trtllm-serve (``tensorrt_llm/metrics/collector.py``, ``trtllm_*``).

The signals themselves (name, unit, kind, how series combine) and the sources are
defined in :mod:`inferpath.vocabulary`; this module maps onto them. A signal's ``combine``
says how series of one scrape (several engines or API-server processes of one pod) become
the pod's value: ``sum`` (requests waiting anywhere add up; histograms add bucket-wise),
``max`` (kept per engine, plus the pod maximum: the fullest engine is the one that
preempts) or ``device`` (one series per GPU, never combined).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from inferpath.vocabulary import (
    GPU_MEMORY_USED_BYTES,
    GPU_POWER_WATTS,
    GPU_UTILIZATION_RATIO,
    KV_CACHE_USAGE_RATIO,
    QUEUE_DEPTH,
    RUNNING_REQUESTS,
    SIGNALS,
    SOURCES,
    Signal,
)

MIB_BYTES = 1024 * 1024


def _identity(value: float) -> float:
    return value


def percent_to_ratio(value: float) -> float:
    """0-100 percent -> 0-1 ratio."""
    return value / 100.0


def mib_to_bytes(value: float) -> float:
    """MiB (dcgm-exporter's framebuffer unit) -> bytes."""
    return value * MIB_BYTES


def mhz_to_hertz(value: float) -> float:
    """MHz (dcgm-exporter's and NVML's clock unit) -> Hz."""
    return value * 1e6


def milliwatts_to_watts(value: float) -> float:
    """mW (NVML's power unit) -> W."""
    return value / 1000.0


def milliseconds_to_seconds(value: float) -> float:
    """ms (Triton's histogram unit) -> s."""
    return value / 1000.0


@dataclass(frozen=True)
class SourceMetric:
    """One row: ``metric`` (a Prometheus sample name, or a histogram's base name) of ``source``
    is ``signal`` after ``convert``.

    ``labels``: label values the series must carry to match (``request_type="waiting"``);
    those labels are removed from the stored attributes. ``deprecated``: an old name, used
    only when the current name is absent for the same series.
    """

    source: str
    metric: str
    signal: str
    convert: Callable[[float], float] = _identity
    deprecated: bool = False
    labels: tuple[tuple[str, str], ...] = ()


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


_R = SourceMetric

CATALOG: tuple[SourceMetric, ...] = (
    # dcgm-exporter: percent, MiB, W, degrees C, MHz; profiling fields are already 0-1.
    _R("dcgm", "DCGM_FI_DEV_GPU_UTIL", "gpu_utilization_ratio", percent_to_ratio),
    _R("dcgm", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gpu_graphics_engine_active_ratio"),
    _R("dcgm", "DCGM_FI_PROF_SM_ACTIVE", "gpu_sm_active_ratio"),
    _R("dcgm", "DCGM_FI_DEV_FB_USED", "gpu_memory_used_bytes", mib_to_bytes),
    _R("dcgm", "DCGM_FI_DEV_FB_FREE", "gpu_memory_free_bytes", mib_to_bytes),
    _R("dcgm", "DCGM_FI_DEV_POWER_USAGE", "gpu_power_watts"),
    _R("dcgm", "DCGM_FI_DEV_GPU_TEMP", "gpu_temperature_celsius"),
    _R("dcgm", "DCGM_FI_DEV_SM_CLOCK", "gpu_sm_clock_hertz", mhz_to_hertz),
    _R("dcgm", "DCGM_FI_DEV_MEM_CLOCK", "gpu_memory_clock_hertz", mhz_to_hertz),
    _R("dcgm", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gpu_clock_event_reasons"),
    _R("dcgm", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gpu_clock_event_reasons", deprecated=True),
    # vLLM: V1 names first; the V0 names still appear on older deployments.
    _R("vllm", "vllm:num_requests_waiting", "queue_depth"),
    _R("vllm", "vllm:num_requests_running", "running_requests"),
    _R("vllm", "vllm:kv_cache_usage_perc", "kv_cache_usage_ratio"),  # despite "perc", a 0-1 ratio
    _R("vllm", "vllm:gpu_cache_usage_perc", "kv_cache_usage_ratio", deprecated=True),
    _R("vllm", "vllm:num_preemptions_total", "preemptions_total"),
    _R("vllm", "vllm:num_preemptions", "preemptions_total", deprecated=True),
    _R("vllm", "vllm:time_to_first_token_seconds", "time_to_first_token_seconds"),
    _R("vllm", "vllm:e2e_request_latency_seconds", "e2e_request_latency_seconds"),
    _R("vllm", "vllm:request_queue_time_seconds", "request_queue_time_seconds"),
    # Prefix caching, in prompt tokens (V1; on by default): the what-if computes only the misses.
    _R("vllm", "vllm:prefix_cache_queries_total", "prefix_cache_queries_total"),
    _R("vllm", "vllm:prefix_cache_hits_total", "prefix_cache_hits_total"),
    # An info metric: value 1, the KV pool in its labels (num_gpu_blocks, block_size), kept as attributes.
    _R("vllm", "vllm:cache_config_info", "kv_cache_config_info"),
    # SGLang: token_usage is the fraction of KV token slots in use.
    _R("sglang", "sglang:num_queue_reqs", "queue_depth"),
    _R("sglang", "sglang:num_running_reqs", "running_requests"),
    _R("sglang", "sglang:token_usage", "kv_cache_usage_ratio"),
    _R("sglang", "sglang:time_to_first_token_seconds", "time_to_first_token_seconds"),
    _R("sglang", "sglang:e2e_request_latency_seconds", "e2e_request_latency_seconds"),
    _R("sglang", "sglang:queue_time_seconds", "request_queue_time_seconds"),
    # Hugging Face TGI (no KV-cache gauge is exported).
    _R("tgi", "tgi_queue_size", "queue_depth"),
    _R("tgi", "tgi_batch_current_size", "batch_size"),
    _R("tgi", "tgi_request_queue_duration", "request_queue_time_seconds"),
    _R("tgi", "tgi_request_duration", "e2e_request_latency_seconds"),
    # Triton Inference Server: utilization already 0-1, memory in bytes, power in W,
    # latency histograms in ms; its TensorRT-LLM backend splits gauges by a label.
    _R("triton", "nv_inference_pending_request_count", "queue_depth"),
    _R("triton", "nv_gpu_utilization", "gpu_utilization_ratio"),
    _R("triton", "nv_gpu_memory_used_bytes", "gpu_memory_used_bytes"),
    _R("triton", "nv_gpu_memory_total_bytes", "gpu_memory_total_bytes"),
    _R("triton", "nv_gpu_power_usage", "gpu_power_watts"),
    _R("triton", "nv_inference_first_response_histogram_ms", "time_to_first_token_seconds", milliseconds_to_seconds),
    _R("triton", "nv_trt_llm_request_metrics", "queue_depth", labels=(("request_type", "waiting"),)),
    _R("triton", "nv_trt_llm_request_metrics", "running_requests", labels=(("request_type", "scheduled"),)),
    _R(
        "triton",
        "nv_trt_llm_kv_cache_block_metrics",
        "kv_cache_usage_ratio",
        labels=(("kv_cache_block_type", "fraction"),),
    ),
    # trtllm-serve's own /metrics (MetricsCollector, prefix trtllm_).
    _R("trtllm", "trtllm_num_requests_waiting", "queue_depth"),
    _R("trtllm", "trtllm_num_requests_running", "running_requests"),
    _R("trtllm", "trtllm_kv_cache_utilization", "kv_cache_usage_ratio"),
    _R("trtllm", "trtllm_time_to_first_token_seconds", "time_to_first_token_seconds"),
    _R("trtllm", "trtllm_e2e_request_latency_seconds", "e2e_request_latency_seconds"),
    _R("trtllm", "trtllm_request_queue_time_seconds", "request_queue_time_seconds"),
    # The same TensorRT-LLM backend gauges reach a scrape configured as source "trtllm".
    _R("trtllm", "nv_trt_llm_request_metrics", "queue_depth", labels=(("request_type", "waiting"),)),
    _R("trtllm", "nv_trt_llm_request_metrics", "running_requests", labels=(("request_type", "scheduled"),)),
    _R(
        "trtllm",
        "nv_trt_llm_kv_cache_block_metrics",
        "kv_cache_usage_ratio",
        labels=(("kv_cache_block_type", "fraction"),),
    ),
)

# dcgm-exporter has no total; the framebuffer splits into used + free + reserved (the
# reserved part is exported by recent versions: L40S 0 + 45459 + 608 = 46067 MiB, what
# nvidia-smi shows as 46068 MiB).
DERIVED: tuple[DerivedMetric, ...] = (
    DerivedMetric(
        "dcgm",
        "gpu_memory_total_bytes",
        ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"),
        ("DCGM_FI_DEV_FB_RESERVED",),
        mib_to_bytes,
    ),
)

# NVML (nvidia-ml-py) readings and their units, as the poller converts them.
NVML_CONVERSIONS: dict[str, tuple[str, Callable[[float], float]]] = {
    "nvmlDeviceGetUtilizationRates.gpu": ("gpu_utilization_ratio", percent_to_ratio),
    "nvmlDeviceGetMemoryInfo.used": ("gpu_memory_used_bytes", _identity),
    "nvmlDeviceGetMemoryInfo.free": ("gpu_memory_free_bytes", _identity),
    "nvmlDeviceGetMemoryInfo.total": ("gpu_memory_total_bytes", _identity),
    "nvmlDeviceGetPowerUsage": ("gpu_power_watts", milliwatts_to_watts),
    "nvmlDeviceGetTemperature": ("gpu_temperature_celsius", _identity),
    "nvmlDeviceGetClockInfo.sm": ("gpu_sm_clock_hertz", mhz_to_hertz),
    "nvmlDeviceGetClockInfo.mem": ("gpu_memory_clock_hertz", mhz_to_hertz),
    "nvmlDeviceGetCurrentClocksEventReasons": ("gpu_clock_event_reasons", _identity),
    "nvmlDeviceGetComputeRunningProcesses.usedGpuMemory": ("gpu_process_memory_used_bytes", _identity),
}

# Signals whose absence from a scrape is reported as "missing" (the model-server protocol's
# three for engines; the core GPU gauges for dcgm-exporter).
_EXPECTED_ENGINE = (QUEUE_DEPTH, RUNNING_REQUESTS, KV_CACHE_USAGE_RATIO)
_EXPECTED_GPU = (GPU_UTILIZATION_RATIO, GPU_MEMORY_USED_BYTES, GPU_POWER_WATTS)

# Labels that tell engines (or data-parallel ranks) of one pod apart, and the label
# prometheus_client's multiprocess mode adds per process.
ENGINE_LABELS: frozenset[str] = frozenset({"engine", "dp_rank"})
PID_LABEL = "pid"

_BY_SOURCE: dict[str, dict[str, tuple[SourceMetric, ...]]] = {}
for _row in CATALOG:
    _rows = _BY_SOURCE.setdefault(_row.source, {})
    _rows[_row.metric] = (*_rows.get(_row.metric, ()), _row)


def metrics_for(source: str) -> dict[str, tuple[SourceMetric, ...]]:
    """Rows of ``source`` keyed by metric name (several rows when split by label values).

    Raises ``ValueError`` naming the known sources for an unknown one.
    """
    try:
        return _BY_SOURCE[source]
    except KeyError:
        raise ValueError(f"source: unknown {source!r}, expected one of {sorted(SOURCES)}") from None


def derived_for(source: str) -> tuple[DerivedMetric, ...]:
    """Derived signals of ``source`` (may be empty)."""
    return tuple(d for d in DERIVED if d.source == source)


def expected_signals(source: str) -> tuple[str, ...]:
    """Signals a scrape of ``source`` should carry; absent ones are reported as missing."""
    provided = {row.signal for rows in metrics_for(source).values() for row in rows}
    provided |= {d.signal for d in derived_for(source)}
    wanted = _EXPECTED_GPU if source == "dcgm" else _EXPECTED_ENGINE
    return tuple(s for s in wanted if s in provided)


def signal(name: str) -> Signal:
    """The canonical signal ``name``; raises ``KeyError`` for an unknown one."""
    return SIGNALS[name]
