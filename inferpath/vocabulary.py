"""inferpath's vocabulary: the names of stages, measures, causes, signals, sources and units, once.

Every part draws these names from here: the instrumentation's stage attribute
(:mod:`inferpath.instrumentation.semconv`), the settings (:mod:`inferpath.config`), the
collectors' catalog (which maps each source's metric names onto the signals below and
converts their units, the one place that does), the stored request columns and rollups
(:mod:`inferpath.storage`), the analysis, the read API, the alert rules and the dashboard.
A name added here is known to all of them; a name restated elsewhere is a bug.

This module imports nothing of inferpath and nothing outside the standard library, so any
part (the instrumentation inside a user's app included) may import it. The definitions
follow DESIGN.md §3.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# ----------------------------------------------------------------------------- units
# OTel / UCUM unit strings of the canonical signals (the ``Unit`` column of the metric
# tables). A signal's name ends in its unit (``_ratio``, ``_bytes``, ``_watts``, ...).
UNIT_RATIO = "1"
UNIT_BYTES = "By"
UNIT_WATTS = "W"
UNIT_CELSIUS = "Cel"
UNIT_HERTZ = "Hz"
UNIT_SECONDS = "s"
UNIT_REQUESTS = "{request}"
UNIT_PREEMPTIONS = "{preemption}"
UNIT_INFO = "{info}"
UNIT_TOKENS = "{token}"

NS_PER_SECOND = 1_000_000_000
"""Durations are nanoseconds in storage (``*_ns`` columns), seconds in OTel attributes and
in every answer of the read API."""

# ----------------------------------------------------------------------------- span attributes
# The names of docs/telemetry-contract.md that the instrumentation writes and the server
# reads: OTel GenAI / HTTP semantic-convention names where one exists, ``inferpath.*``
# otherwise; and vLLM's engine TTFT, which the server reads beside them.
STAGE = "inferpath.stage"
ENDPOINT = "inferpath.endpoint"
ENDPOINT_CLASS = "inferpath.endpoint_class"
ITL_SECONDS = "inferpath.itl_seconds"
STREAM_CHUNKS = "inferpath.stream.chunks"
STREAM_STATUS = "inferpath.stream.status"
STREAM_INCOMPLETE_REASON = "inferpath.stream.incomplete_reason"
RETRIEVAL_DOCUMENTS = "inferpath.retrieval.documents"

GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"

HTTP_REQUEST_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
URL_PATH = "url.path"
URL_SCHEME = "url.scheme"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
GEN_AI_LATENCY_TTFT = "gen_ai.latency.time_to_first_token"

# ----------------------------------------------------------------------------- stages
STAGES: tuple[str, ...] = (
    "gateway",
    "tokenize",
    "retrieval",
    "queue",
    "prefill",
    "decode",
    "model",
    "network",
    "postprocess",
    "other",
)
"""Values of the span attribute ``inferpath.stage``. ``model``: a whole model call seen from
the caller (it contains the engine's queue, prefill and decode); ``network``: derived, a
caller's client span minus its callee's server span; ``other``: anything else."""

BREAKDOWN_STAGES: tuple[str, ...] = ("gateway", "tokenize", "retrieval", "queue", "prefill", "decode", "network")
"""The stages that add up to a request's E2E latency, in path order; each is the
``<stage>_ns`` column of ``inferpath_requests``. ``model`` is left out (it overlaps queue,
prefill and decode), as are ``postprocess`` and ``other`` (the breakdown's ``rest``)."""

TTFT_STAGES: tuple[str, ...] = tuple(s for s in BREAKDOWN_STAGES if s != "decode")
"""The stages that add up to TTFT: all but ``decode``, which comes after the first token."""

# ----------------------------------------------------------------------------- measures
REQUEST_MEASURES: tuple[str, ...] = (
    "client_ttft",
    "client_e2e",
    "ttft",
    "e2e",
    "itl",
    "gateway",
    "tokenize",
    "retrieval",
    "queue",
    "prefill",
    "decode",
    "model",
    "network",
    "postprocess",
)
"""Per-request durations (AIPerf definitions, DESIGN.md §3), each stored in nanoseconds as
the ``<measure>_ns`` column of ``inferpath_requests`` (:func:`measure_column`). ``ttft`` and
``e2e`` are measured at the gateway; ``client_*`` by the calling client when it is
instrumented; ``itl`` = (E2E − TTFT) / (output tokens − 1)."""

MEASURE_TITLES: dict[str, str] = {
    "client_ttft": "TTFT (client)",
    "client_e2e": "E2E (client)",
    "ttft": "TTFT (server)",
    "e2e": "E2E (server)",
    "itl": "ITL",
    "gateway": "gateway (self time)",
    "tokenize": "tokenize",
    "retrieval": "retrieval",
    "queue": "queue",
    "prefill": "prefill",
    "decode": "decode",
    "model": "model call",
    "network": "network",
    "postprocess": "postprocess",
}
"""A few words per measure of :data:`REQUEST_MEASURES` for a table or a chart."""

TTFT_PHASE_COLUMNS: dict[str, str] = {"gateway": "gateway_ttft_ns", "network": "network_ttft_ns"}
"""Stages whose part before the first token has its own column (schema 012): stage → column."""

ENGINE_SEND_COLUMN = "engine_send_ns"
"""The trip out of the hop into the engine (schema 016, docs/telemetry-contract.md): its
caller's start to the engine span's start, ns. Not a stage: it lies inside ``network``."""

REQUEST_DURATION_COLUMNS: tuple[str, ...] = (
    *(f"{m}_ns" for m in REQUEST_MEASURES),
    *TTFT_PHASE_COLUMNS.values(),
    ENGINE_SEND_COLUMN,
)
"""Every duration column of ``inferpath_requests`` (nanoseconds)."""

OBJECTIVE_MEASURES: tuple[str, ...] = ("ttft", "itl", "e2e")
"""Measures a latency objective may bound (analysis/objectives.py)."""

BREAKDOWN_MEASURES: tuple[str, ...] = ("ttft", "e2e")
"""Measures broken down into stages (:data:`TTFT_STAGES`, :data:`BREAKDOWN_STAGES`)."""


CLIENT_FIRST_SQL: dict[str, str] = {
    "ttft": "coalesce(client_ttft_ns, ttft_ns)",
    "e2e": "coalesce(client_e2e_ns, e2e_ns)",
}
"""A request's TTFT and E2E as inferpath shows, breaks down and judges them (SQL over an
``inferpath_requests`` row, ns): the calling client's own measure when it has one, else the
server's (the gateway's, else the engine's). What the end user waited for is what an
objective bounds; the hop from the client to the first server is then one of its stages
(``network_ttft_ns``, ``network_ns``). docs/interop.md, "TTFT every reader shows"."""


def client_first_ns(row: Mapping[str, Any], measure: str) -> Any:
    """:data:`CLIENT_FIRST_SQL` over a row held in Python: ``row["client_<measure>_ns"]`` when
    not ``None``, else ``row["<measure>_ns"]`` (a missing key counts as ``None``).
    ``ValueError`` for a measure not in :data:`CLIENT_FIRST_SQL`."""
    if measure not in CLIENT_FIRST_SQL:
        raise ValueError(f"measure: {measure!r} has no client side, expected one of {', '.join(CLIENT_FIRST_SQL)}")
    value = row.get(f"client_{measure}_ns")
    return value if value is not None else row.get(f"{measure}_ns")


def measure_column(measure: str) -> str:
    """``"ttft"`` → ``"ttft_ns"``: the ``inferpath_requests`` column of a measure of
    :data:`REQUEST_MEASURES`. Raises ``ValueError`` naming the known ones otherwise."""
    if measure not in REQUEST_MEASURES:
        raise ValueError(f"measure: unknown {measure!r}, expected one of {', '.join(REQUEST_MEASURES)}")
    return f"{measure}_ns"


ENDPOINT_CLASSES: tuple[str, ...] = ("interactive", "bulk")
"""Endpoint classes (resource attribute ``inferpath.endpoint_class``); objectives and alert
rules are per class."""
DEFAULT_ENDPOINT_CLASS = "interactive"
"""The class that requests without one are judged as: its objectives (the diagnosis) and its
alert rules (a rule of this class also reads the unclassified rows) apply to them. A plain
vLLM exporting its own spans names no class."""
UNCLASSIFIED = "unclassified"
"""What requests without an endpoint class (an engine's own spans, a caller that set none)
are called wherever a class is shown."""

# ----------------------------------------------------------------------------- causes
CAUSES: tuple[str, ...] = (
    "tokenization",
    "retrieval",
    "queueing",
    "batching",
    "network_hop",
    "gpu_compute",
    "gpu_memory",
    "cold_start",
    "unexplained",
)
"""Cause names a diagnosis may name (``analysis.verdict.Cause``). ``retrieval`` is a CPU
stage of its own (a slow retriever is not a tokenizer problem); ``unexplained`` is time that
no stage span covers."""

# ----------------------------------------------------------------------------- signals
SOURCE_METRIC_ATTRIBUTE = "inferpath.source_metric"
"""Attribute of every stored sample naming the source metric it came from (e.g.
``vllm:num_requests_waiting``); the other attributes are the source's own labels, so two
signals of one engine differ only in this one."""

Kind = Literal["gauge", "sum", "histogram"]
Combine = Literal["sum", "max", "device"]
Across = Literal["sum", "max", "mean"]


@dataclass(frozen=True)
class Signal:
    """A canonical signal: ``name`` (with its unit), OTel/UCUM ``unit``, ``kind`` (stored in
    ``otel_metrics_gauge``, ``_sum`` or ``_histogram``), ``description``, ``title`` (a few
    words for a chart or a table).

    ``combine``: how series of one scrape (several engines or processes of one pod) become
    the pod's value: ``sum``, ``max`` (kept per engine plus the pod maximum) or ``device``
    (one series per GPU, never combined). ``across``: how the stored series of several
    engines or GPUs combine into one value of the fleet (analysis, read API views): ``sum``
    (requests waiting anywhere add up; memory and power over GPUs), ``max`` (the fullest
    engine is the one that preempts) or ``mean`` ("would more GPUs help" is a fleet-wide
    question).
    """

    name: str
    unit: str
    kind: Kind
    combine: Combine
    across: Across
    description: str
    title: str


# Names of the signals read by name somewhere outside the catalog.
GPU_UTILIZATION_RATIO = "gpu_utilization_ratio"
GPU_GRAPHICS_ENGINE_ACTIVE_RATIO = "gpu_graphics_engine_active_ratio"
GPU_SM_ACTIVE_RATIO = "gpu_sm_active_ratio"
GPU_MEMORY_USED_BYTES = "gpu_memory_used_bytes"
GPU_MEMORY_FREE_BYTES = "gpu_memory_free_bytes"
GPU_MEMORY_TOTAL_BYTES = "gpu_memory_total_bytes"
GPU_POWER_WATTS = "gpu_power_watts"
GPU_UP = "gpu_up"
QUEUE_DEPTH = "queue_depth"
RUNNING_REQUESTS = "running_requests"
KV_CACHE_USAGE_RATIO = "kv_cache_usage_ratio"
PREEMPTIONS_TOTAL = "preemptions_total"
BATCH_SIZE = "batch_size"
KV_CACHE_CONFIG_INFO = "kv_cache_config_info"
PREFIX_CACHE_QUERIES_TOTAL = "prefix_cache_queries_total"
PREFIX_CACHE_HITS_TOTAL = "prefix_cache_hits_total"
TIME_TO_FIRST_TOKEN_SECONDS = "time_to_first_token_seconds"
E2E_REQUEST_LATENCY_SECONDS = "e2e_request_latency_seconds"
REQUEST_QUEUE_TIME_SECONDS = "request_queue_time_seconds"

_S = Signal
SIGNALS: dict[str, Signal] = {
    s.name: s
    for s in (
        # GPU state: one series per device (host + GPU UUID, + MIG instance).
        _S(
            GPU_UTILIZATION_RATIO,
            UNIT_RATIO,
            "gauge",
            "device",
            "mean",
            "Fraction of time a kernel ran on the GPU, 0-1.",
            "GPU utilization",
        ),
        _S(
            GPU_GRAPHICS_ENGINE_ACTIVE_RATIO,
            UNIT_RATIO,
            "gauge",
            "device",
            "mean",
            "Fraction of time the graphics/compute engine was active (DCGM profiling), 0-1.",
            "GPU engine active",
        ),
        _S(
            GPU_SM_ACTIVE_RATIO,
            UNIT_RATIO,
            "gauge",
            "device",
            "mean",
            "Fraction of time at least one warp was active on an SM, 0-1.",
            "SM active",
        ),
        _S(
            GPU_MEMORY_USED_BYTES,
            UNIT_BYTES,
            "gauge",
            "device",
            "sum",
            "GPU framebuffer memory in use.",
            "GPU memory used",
        ),
        _S(
            GPU_MEMORY_FREE_BYTES,
            UNIT_BYTES,
            "gauge",
            "device",
            "sum",
            "GPU framebuffer memory free.",
            "GPU memory free",
        ),
        _S(
            GPU_MEMORY_TOTAL_BYTES,
            UNIT_BYTES,
            "gauge",
            "device",
            "sum",
            "GPU framebuffer memory in total.",
            "GPU memory total",
        ),
        _S(GPU_POWER_WATTS, UNIT_WATTS, "gauge", "device", "sum", "GPU power draw.", "GPU power"),
        _S(
            "gpu_temperature_celsius",
            UNIT_CELSIUS,
            "gauge",
            "device",
            "max",
            "GPU core temperature.",
            "GPU temperature",
        ),
        _S("gpu_sm_clock_hertz", UNIT_HERTZ, "gauge", "device", "mean", "Current SM clock.", "SM clock"),
        _S("gpu_memory_clock_hertz", UNIT_HERTZ, "gauge", "device", "mean", "Current memory clock.", "Memory clock"),
        _S(
            "gpu_clock_event_reasons",
            UNIT_RATIO,
            "gauge",
            "device",
            "max",
            "Bitmask of active clock-event (throttle) reasons, nvmlClocksEventReason* bits.",
            "Clock-event reasons",
        ),
        _S(
            "gpu_process_memory_used_bytes",
            UNIT_BYTES,
            "gauge",
            "device",
            "sum",
            "GPU memory used by one process (process.pid).",
            "GPU memory per process",
        ),
        _S(
            GPU_UP,
            UNIT_RATIO,
            "gauge",
            "device",
            "mean",
            "1 while the GPU answers, 0 once it is lost or cannot be read (also while the driver is gone).",
            "GPU up",
        ),
        # Engine state.
        _S(
            QUEUE_DEPTH,
            UNIT_REQUESTS,
            "gauge",
            "sum",
            "sum",
            "Requests waiting to be scheduled by the engine.",
            "Queue depth",
        ),
        _S(
            RUNNING_REQUESTS,
            UNIT_REQUESTS,
            "gauge",
            "sum",
            "sum",
            "Requests in the engine's running batch.",
            "Running requests",
        ),
        _S(
            KV_CACHE_USAGE_RATIO,
            UNIT_RATIO,
            "gauge",
            "max",
            "max",
            "Fraction of KV-cache blocks (or token slots) in use, 0-1.",
            "KV-cache usage",
        ),
        _S(
            PREEMPTIONS_TOTAL,
            UNIT_PREEMPTIONS,
            "sum",
            "sum",
            "sum",
            "Sequences preempted by the engine since start.",
            "Preemptions",
        ),
        _S(
            BATCH_SIZE,
            UNIT_REQUESTS,
            "gauge",
            "sum",
            "sum",
            "Size of the batch the engine is currently running.",
            "Batch size",
        ),
        _S(
            KV_CACHE_CONFIG_INFO,
            UNIT_INFO,
            "gauge",
            "max",
            "max",
            "Always 1, one series per engine; its attributes are the engine's KV-cache configuration "
            "(vLLM's cache_config_info labels: num_gpu_blocks, block_size, ...).",
            "KV-cache configuration",
        ),
        _S(
            PREFIX_CACHE_QUERIES_TOTAL,
            UNIT_TOKENS,
            "sum",
            "sum",
            "sum",
            "Prompt tokens looked up in the engine's prefix cache since start.",
            "Prefix-cache lookups",
        ),
        _S(
            PREFIX_CACHE_HITS_TOTAL,
            UNIT_TOKENS,
            "sum",
            "sum",
            "sum",
            "Prompt tokens found in the engine's prefix cache (not computed again) since start.",
            "Prefix-cache hits",
        ),
        # Engine latency histograms: kept as buckets, never as quantiles.
        _S(
            TIME_TO_FIRST_TOKEN_SECONDS,
            UNIT_SECONDS,
            "histogram",
            "sum",
            "sum",
            "Time to first token, per request.",
            "Engine TTFT",
        ),
        _S(
            E2E_REQUEST_LATENCY_SECONDS,
            UNIT_SECONDS,
            "histogram",
            "sum",
            "sum",
            "End-to-end request latency, per request.",
            "Engine E2E latency",
        ),
        _S(
            REQUEST_QUEUE_TIME_SECONDS,
            UNIT_SECONDS,
            "histogram",
            "sum",
            "sum",
            "Time a request waited in the queue.",
            "Engine queue time",
        ),
    )
}
"""Every canonical signal by name (DESIGN.md §3)."""

ENGINE_STATE_SIGNALS: tuple[str, ...] = (
    QUEUE_DEPTH,
    RUNNING_REQUESTS,
    KV_CACHE_USAGE_RATIO,
    PREEMPTIONS_TOTAL,
    BATCH_SIZE,
)
"""The engine's own state, one series per engine."""

SATURATION_GAUGES: tuple[str, ...] = (
    QUEUE_DEPTH,
    RUNNING_REQUESTS,
    KV_CACHE_USAGE_RATIO,
    GPU_UTILIZATION_RATIO,
    GPU_MEMORY_USED_BYTES,
    GPU_POWER_WATTS,
)
"""The gauges a diagnosis reads over a window: the engine's saturation and the GPUs'."""

# ----------------------------------------------------------------------------- sources
SOURCES: tuple[str, ...] = ("vllm", "sglang", "tgi", "triton", "trtllm", "dcgm")
"""Scrape sources: Prometheus endpoints whose metric names the collectors' catalog maps
(five engines, and dcgm-exporter for GPUs). NVML is polled, not scraped, and is no source."""

DEFAULT_SCRAPE_SOURCE = "vllm"
"""The source of a scrape target given as a bare URL."""


def share_basis(basis: str | None, source: str | None = "spans") -> str:
    """What a cause's share is of, in words, for a verdict's ``basis`` and ``source``:
    ``"increase"``, ``"slow requests' time"`` or ``"mean request's time"``."""
    if basis == "baseline":
        return "increase"
    return "mean request's time" if source == "histograms" else "slow requests' time"


__all__ = [
    "STAGE",
    "ENDPOINT",
    "ENDPOINT_CLASS",
    "ITL_SECONDS",
    "STREAM_CHUNKS",
    "STREAM_STATUS",
    "STREAM_INCOMPLETE_REASON",
    "RETRIEVAL_DOCUMENTS",
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_REQUEST_MODEL",
    "GEN_AI_REQUEST_MAX_TOKENS",
    "GEN_AI_RESPONSE_MODEL",
    "GEN_AI_RESPONSE_FINISH_REASONS",
    "GEN_AI_TIME_TO_FIRST_CHUNK",
    "GEN_AI_USAGE_INPUT_TOKENS",
    "GEN_AI_USAGE_OUTPUT_TOKENS",
    "HTTP_REQUEST_METHOD",
    "HTTP_ROUTE",
    "HTTP_RESPONSE_STATUS_CODE",
    "URL_PATH",
    "URL_SCHEME",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "ERROR_TYPE",
    "GEN_AI_LATENCY_TTFT",
    "CAUSES",
    "BATCH_SIZE",
    "BREAKDOWN_MEASURES",
    "BREAKDOWN_STAGES",
    "DEFAULT_SCRAPE_SOURCE",
    "E2E_REQUEST_LATENCY_SECONDS",
    "ENDPOINT_CLASSES",
    "ENGINE_STATE_SIGNALS",
    "GPU_GRAPHICS_ENGINE_ACTIVE_RATIO",
    "GPU_MEMORY_FREE_BYTES",
    "GPU_MEMORY_TOTAL_BYTES",
    "GPU_MEMORY_USED_BYTES",
    "GPU_POWER_WATTS",
    "GPU_SM_ACTIVE_RATIO",
    "GPU_UP",
    "GPU_UTILIZATION_RATIO",
    "KV_CACHE_CONFIG_INFO",
    "KV_CACHE_USAGE_RATIO",
    "MEASURE_TITLES",
    "NS_PER_SECOND",
    "OBJECTIVE_MEASURES",
    "PREEMPTIONS_TOTAL",
    "PREFIX_CACHE_HITS_TOTAL",
    "PREFIX_CACHE_QUERIES_TOTAL",
    "QUEUE_DEPTH",
    "REQUEST_DURATION_COLUMNS",
    "ENGINE_SEND_COLUMN",
    "REQUEST_MEASURES",
    "REQUEST_QUEUE_TIME_SECONDS",
    "RUNNING_REQUESTS",
    "SATURATION_GAUGES",
    "SIGNALS",
    "SOURCES",
    "STAGES",
    "Signal",
    "TIME_TO_FIRST_TOKEN_SECONDS",
    "TTFT_PHASE_COLUMNS",
    "TTFT_STAGES",
    "UNIT_BYTES",
    "UNIT_CELSIUS",
    "UNIT_HERTZ",
    "UNIT_INFO",
    "UNIT_PREEMPTIONS",
    "UNIT_RATIO",
    "UNIT_REQUESTS",
    "UNIT_SECONDS",
    "UNIT_TOKENS",
    "UNIT_WATTS",
    "measure_column",
    "share_basis",
]
