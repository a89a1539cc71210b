"""The emulated engine's Prometheus exposition: vLLM's ``/metrics`` and dcgm-exporter's.

Names, labels, help texts and histogram buckets are vLLM V1's as served by vLLM 0.32
(compare ``shared/data/vllm_live_capture/metrics_*.prom``): every series carries
``model_name`` and ``engine="0"``. Gauges and counters are read from the engine at collect
time (prometheus/client_python's custom-collector pattern), so a scrape always sees the
live state; latency histograms are observed once per finished request by
:meth:`EngineMetrics.observe_finished`.

The GPU exposition copies dcgm-exporter's field names and labels (compare
``shared/data/dcgm_exporter_metrics/*.prom``): one series per GPU of the tensor-parallel
group, all alike, values from :class:`~.scheduler.EngineStats`.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferpath.demo.engine.scheduler import Engine, RequestMetrics
from inferpath.demo.engine.specs import MIB_BYTES

# vLLM V1's buckets (vllm/v1/metrics/loggers.py), identical to the recorded capture.
TTFT_BUCKETS_SECONDS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
REQUEST_LATENCY_BUCKETS_SECONDS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITL_BUCKETS_SECONDS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)

ENGINE_INDEX = "0"


class _VllmStateCollector(Collector):
    """vLLM's scheduler gauges and counters, read from the engine at every scrape."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self._engine = engine
        self._labels = {"engine": ENGINE_INDEX, "model_name": model_name}

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=list(self._labels))
        family.add_metric(list(self._labels.values()), value)
        return family

    def _counter(self, name: str, doc: str, value: float, **extra: str) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=[*self._labels, *extra])
        family.add_metric([*self._labels.values(), *extra.values()], value)
        return family

    def collect(self) -> Iterable[Metric]:
        stats = self._engine.stats()
        config = self._engine.config
        yield self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", stats.num_requests_running
        )
        yield self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", stats.num_requests_waiting
        )
        yield self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.kv_cache_usage_perc
        )
        yield self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", stats.num_preemptions_total
        )
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens_total)
        yield self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", stats.generation_tokens_total
        )
        yield self._counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            stats.num_requests_finished_total,
            finished_reason="length",
        )
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "engine", "num_gpu_blocks"],
        )
        info.add_metric([str(config.block_size_tokens), ENGINE_INDEX, str(config.num_kv_blocks)], 1.0)
        yield info


class EngineMetrics:
    """The ``/metrics`` registry of one emulated engine.

    ``registry`` holds vLLM's gauges, counters and histograms for ``model_name``; call
    :meth:`observe_finished` once per finished request.
    """

    def __init__(self, engine: Engine, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_VllmStateCollector(engine, model_name))
        labels = ["model_name", "engine"]

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry).labels(
                model_name, ENGINE_INDEX
            )

        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS_SECONDS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS_SECONDS
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS_SECONDS,
        )
        self.queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS_SECONDS,
        )
        self.inference = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS_SECONDS,
        )
        self.prefill = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS_SECONDS,
        )
        self.decode = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS_SECONDS,
        )

    def observe_finished(self, metrics: RequestMetrics, inter_token_seconds: Iterable[float] = ()) -> None:
        """Record one finished request's intervals (seconds) and its inter-token gaps."""
        self.ttft.observe(metrics.ttft_seconds)
        self.e2e.observe(metrics.e2e_seconds)
        self.queue.observe(metrics.queue_seconds)
        self.inference.observe(metrics.inference_seconds)
        self.prefill.observe(metrics.prefill_seconds)
        self.decode.observe(metrics.decode_seconds)
        for gap in inter_token_seconds:
            self.itl.observe(gap)


class DcgmCollector(Collector):
    """dcgm-exporter's GPU gauges for each GPU of the emulated tensor-parallel group.

    Units as dcgm-exporter's: utilization in percent, framebuffer in MiB, power in W. The
    ``UUID`` (real ``GPU-<uuid>`` form, derived from host name and GPU index so it is stable
    across restarts) and ``pci_bus_id`` are synthetic.
    """

    _LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"]

    def __init__(self, engine: Engine, hostname: str | None = None) -> None:
        self._engine = engine
        self._hostname = hostname or socket.gethostname()
        self._gpus = []
        for index in range(engine.config.tensor_parallel):
            gpu_uuid = uuid.uuid5(uuid.NAMESPACE_DNS, f"{self._hostname}.gpu{index}.inferpath-demo")
            self._gpus.append(
                [
                    str(index),
                    f"GPU-{gpu_uuid}",
                    f"00000000:{0x18 + index:02X}:00.0",
                    f"nvidia{index}",
                    engine.gpu.model_name,
                    self._hostname,
                ]
            )

    def collect(self) -> Iterable[Metric]:
        stats = self._engine.stats()
        used_mib = stats.gpu_memory_used_bytes // MIB_BYTES
        free_mib = max(0, stats.gpu_memory_total_bytes // MIB_BYTES - used_mib)
        for name, doc, value in (
            ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", round(stats.gpu_utilization_ratio * 100)),
            ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", free_mib),
            ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", used_mib),
            ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", round(stats.gpu_power_watts, 3)),
        ):
            family = GaugeMetricFamily(name, doc, labels=self._LABELS)
            for labels in self._gpus:
                family.add_metric(labels, value)
            yield family


def gpu_registry(engine: Engine, hostname: str | None = None) -> CollectorRegistry:
    """A registry exposing :class:`DcgmCollector` for ``engine`` (served at ``/gpu/metrics``)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(DcgmCollector(engine, hostname))
    return registry
