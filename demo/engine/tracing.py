"""vLLM-style ``llm_request`` spans for the emulated engine, with the plain OpenTelemetry SDK.

Like vLLM's ``--otlp-traces-endpoint`` tracing (``vllm/tracing.py``): a ``TracerProvider``
with a ``BatchSpanProcessor`` and the OTLP/HTTP protobuf exporter, the W3C ``traceparent``
of the incoming request as parent, and one SERVER span named ``llm_request`` per finished
request, starting at arrival and ending at the last token. Attribute names are the ones a
real vLLM 0.32 posted (``shared/data/vllm_live_capture/startup_otlp/*.pb``) plus
``gen_ai.response.model``, which earlier vLLM releases set.

Telemetry never breaks the engine: span creation errors are logged and counted, the
processor's queue is bounded (the SDK drops and counts when it is full), and shutdown waits
at most ``timeout_seconds`` for the last export.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from inferpath.demo.engine.scheduler import RequestMetrics

logger = logging.getLogger(__name__)

SPAN_NAME = "llm_request"
TRACER_NAME = "inferpath.demo.engine"
_EXPORT_TIMEOUT_SECONDS = 2.0
_PROPAGATOR = TraceContextTextMapPropagator()


def build_tracer_provider(
    service_name: str, otlp_endpoint: str | None = None, span_exporter: SpanExporter | None = None
) -> TracerProvider:
    """A provider whose resource has ``service.name`` = ``service_name``.

    ``otlp_endpoint`` (e.g. ``http://127.0.0.1:4318``) adds an OTLP/HTTP protobuf exporter
    posting to ``{otlp_endpoint}/v1/traces``; ``span_exporter`` adds any other exporter (tests
    pass an ``InMemorySpanExporter``). With neither, spans are created and dropped.
    """
    resource = Resource.create({"service.name": service_name, "service.instance.id": str(uuid.uuid4())})
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    if otlp_endpoint:
        exporter = OTLPSpanExporter(endpoint=f"{otlp_endpoint.rstrip('/')}/v1/traces", timeout=_EXPORT_TIMEOUT_SECONDS)
        provider.add_span_processor(BatchSpanProcessor(exporter))
    if span_exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(span_exporter))
    return provider


def extract_parent(headers: Mapping[str, str]) -> Context:
    """The W3C trace context of incoming request headers (an empty context if none or invalid)."""
    return _PROPAGATOR.extract(carrier=dict(headers))


class RequestSpanRecorder:
    """Emits one ``llm_request`` span per finished request; counts its own failures."""

    def __init__(self, provider: TracerProvider, model_name: str) -> None:
        self._tracer = provider.get_tracer(TRACER_NAME)
        self._model_name = model_name
        self.errors_total = 0

    def record(
        self,
        metrics: RequestMetrics,
        parent: Context | None,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        n: int = 1,
    ) -> None:
        """Emit the span for a finished request; never raises."""
        try:
            span = self._tracer.start_span(
                SPAN_NAME, context=parent, kind=SpanKind.SERVER, start_time=metrics.arrival_wall_ns
            )
            span.set_attributes(
                {
                    "gen_ai.response.model": self._model_name,
                    "gen_ai.request.id": metrics.request_id,
                    "gen_ai.request.temperature": float(temperature),
                    "gen_ai.request.top_p": float(top_p),
                    "gen_ai.request.max_tokens": metrics.max_tokens,
                    "gen_ai.request.n": n,
                    "gen_ai.usage.prompt_tokens": metrics.prompt_tokens,
                    "gen_ai.usage.completion_tokens": metrics.completion_tokens,
                    "gen_ai.latency.time_in_queue": metrics.queue_seconds,
                    "gen_ai.latency.time_to_first_token": metrics.ttft_seconds,
                    "gen_ai.latency.e2e": metrics.e2e_seconds,
                    "gen_ai.latency.time_in_model_prefill": metrics.prefill_seconds,
                    "gen_ai.latency.time_in_model_decode": metrics.decode_seconds,
                    "gen_ai.latency.time_in_model_inference": metrics.inference_seconds,
                }
            )
            span.end(end_time=metrics.finished_wall_ns)
        except Exception:  # telemetry must not fail the request
            self.errors_total += 1
            logger.warning("llm_request span for %s not recorded", metrics.request_id, exc_info=True)


STARTUP_PHASES: tuple[tuple[str, float], ...] = (
    ("Load weights", 0.55),
    ("Allocate KV cache", 0.10),
    ("Warmup", 0.35),
)
"""vLLM's start-up span names under ``Overall Loading`` and the emulator's split of the
loading time among them (a real 35 s CPU start-up in ``shared/data/vllm_live_capture``
spent about half loading and half warming up)."""


def record_startup_spans(provider: TracerProvider, start_wall_ns: int, end_wall_ns: int) -> bool:
    """Emit vLLM-style start-up spans: a root ``Overall Loading`` from ``start_wall_ns`` to
    ``end_wall_ns`` (wall clock, ns) with :data:`STARTUP_PHASES` back to back under it, all
    INTERNAL like vLLM's. Returns False (and logs) if the spans could not be made; never raises."""
    try:
        tracer = provider.get_tracer(TRACER_NAME)
        root = tracer.start_span("Overall Loading", start_time=start_wall_ns)
        context = set_span_in_context(root)
        at = start_wall_ns
        for name, share in STARTUP_PHASES:
            end = at + round((end_wall_ns - start_wall_ns) * share)
            tracer.start_span(name, context=context, start_time=at).end(end_time=end)
            at = end
        root.end(end_time=end_wall_ns)
        return True
    except Exception:  # telemetry must not stop the engine from starting
        logger.warning("start-up spans not recorded", exc_info=True)
        return False


def shutdown_tracer_provider(provider: TracerProvider, timeout_seconds: float = 2.0) -> bool:
    """Flush and shut down ``provider`` waiting at most ``timeout_seconds``; True if it finished.

    The SDK's own shutdown may wait far longer on a dead collector, so it runs on a daemon
    thread that is abandoned after the timeout.
    """
    worker = threading.Thread(target=provider.shutdown, name="engine-span-shutdown", daemon=True)
    worker.start()
    worker.join(timeout_seconds)
    if worker.is_alive():
        logger.warning("span export did not finish within %.1f s; remaining spans dropped", timeout_seconds)
        return False
    return True
