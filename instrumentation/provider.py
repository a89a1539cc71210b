"""Process-wide tracing setup: one SDK tracer provider, one bounded batch processor.

Every span inferpath emits goes through the provider that :func:`configure` builds and
:func:`get_tracer` hands out. Choices, and why:

* **Global provider.** If the process has no global tracer provider yet, ours becomes the
  global one, so the application's own ``opentelemetry.trace.get_tracer`` spans land in the
  same traces and the same export. If the application already installed its own SDK
  provider, we leave it alone (its resource, sampler and exporters are the application's
  business) and keep a private provider for inferpath's spans; both share the W3C context,
  so parent/child links across the two still hold.
* **Reconfiguration.** Calling :func:`configure` again with different settings shuts the
  previous inferpath provider down (flushing with a bound) and builds a new one. The OTel
  API allows the global provider to be set only once, so after a reconfiguration the
  application's own spans keep going to the first provider; inferpath's spans always use
  the current one.
* **Fork.** ``service.instance.id`` is one id per process: after ``fork`` the child builds
  a fresh provider (new id, new export worker) on its first span.
* **Drops.** The batch queue is bounded (``max_queue_size``); a span that does not fit is
  dropped and counted in :func:`dropped_spans_total`, never blocking the request path.
* **OpenTelemetry's own configuration.** Each setting follows the SDK's precedence: an
  explicit argument, then the standard ``OTEL_*`` variable, then inferpath's default. The
  SDK reads the variables itself: the OTLP exporter built without an endpoint takes
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (used as is) or ``OTEL_EXPORTER_OTLP_ENDPOINT``
  (``/v1/traces`` appended, as the specification says for the generic variable) and
  ``OTEL_EXPORTER_OTLP_[TRACES_]HEADERS``; ``Resource.create`` takes ``OTEL_SERVICE_NAME``
  and ``OTEL_RESOURCE_ATTRIBUTES``; the provider built without a sampler takes
  ``OTEL_TRACES_SAMPLER`` / ``…_ARG`` and honours ``OTEL_SDK_DISABLED``. Only when neither
  endpoint variable is set does inferpath pass its own (``INFERPATH_OTLP_ENDPOINT``, else
  ``http://127.0.0.1:4318``). The export timeout stays inferpath's bounded one.
* **Export failures.** Spans whose export failed (collector down, timeout) are counted in
  :func:`export_failed_spans_total`; the failure is logged at most once per
  :data:`LOG_INTERVAL_SECONDS` (with the count since the last line), and the OTLP
  exporter's own per-batch warnings are rate-limited the same way, so an outage cannot
  flood the application's logs.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_SDK_DISABLED,
)
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from inferpath.ratelimited_log import RateLimitedLog, RateLimitFilter
from inferpath.vocabulary import ENDPOINT_CLASS, ENDPOINT_CLASSES

_logger = logging.getLogger(__name__)

INSTRUMENTATION_NAME = "inferpath"

# Export and flush timeouts above this are almost surely milliseconds passed as seconds
# (the OTel SDK's own parameters are in milliseconds, which makes the slip easy).
_MAX_TIMEOUT_SECONDS = 120.0
_MAX_SCHEDULE_DELAY_SECONDS = 60.0

#: The W3C Trace Context propagator used for every inject/extract inferpath does.
PROPAGATOR = TraceContextTextMapPropagator()


class _CountedBatchProcessor(SpanProcessor):
    """The SDK's ``BatchSpanProcessor`` behind an admission count, so that every dropped span
    is counted through public interfaces only.

    ``pending`` counts spans handed to the batch processor and not yet settled (exported or
    failed, reported by :class:`_FailureCountingExporter`). A span that would take
    ``pending`` to ``max_queue_size``, or arrives after shutdown, is dropped here and
    counted in :attr:`dropped_total`; the batch queue never fills, so the SDK drops none
    itself. (``pending`` includes the batch being exported, so this bound is at most one
    export batch tighter than the SDK's own queue.) Costs one lock per span."""

    def __init__(self, exporter: _FailureCountingExporter, *, max_queue_size: int, **options: Any) -> None:
        self._capacity = max_queue_size
        self._lock = threading.Lock()
        self._pending = 0
        self._closed = False
        self.dropped_total = 0
        exporter.on_settled = self._settled
        self.inner = BatchSpanProcessor(exporter, max_queue_size=max_queue_size, **options)

    def _settled(self, count: int) -> None:
        with self._lock:
            self._pending = max(0, self._pending - count)

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.inner.on_start(span, parent_context=parent_context)

    def on_end(self, span: Any) -> None:
        with self._lock:
            if self._closed or self._pending >= self._capacity:
                self.dropped_total += 1
                return
            self._pending += 1
        self.inner.on_end(span)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


#: At most one log line per this many seconds for each repeated export problem.
LOG_INTERVAL_SECONDS = 30.0
# Loggers of the OTel exporter and batch processor that log once per failed batch.
_RATE_LIMITED_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
)


_log_filter = RateLimitFilter(LOG_INTERVAL_SECONDS)
for _name in _RATE_LIMITED_LOGGERS:
    logging.getLogger(_name).addFilter(_log_filter)


class _FailureCountingExporter(SpanExporter):
    """Forwards to ``inner`` and counts the spans of every failed export (a FAILURE result
    or an exception, which is turned into FAILURE: export must never raise into the
    batch worker). Logs failures at most once per :data:`LOG_INTERVAL_SECONDS`."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.failed_total = 0
        self._unreported = 0
        self._failure_log = RateLimitedLog(_logger, LOG_INTERVAL_SECONDS)
        self.on_settled: Callable[[int], None] = lambda count: None
        """Called with each batch's span count once its export returned, whatever the result."""

    def export(self, spans: Any) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as error:
            result = SpanExportResult.FAILURE
            cause: str = f"{type(error).__name__}: {error}"
        else:
            cause = "the exporter reported failure"
        finally:
            self.on_settled(len(spans))
        if result is not SpanExportResult.SUCCESS:
            self.failed_total += len(spans)
            self._unreported += len(spans)
            if self._failure_log.warning(
                "inferpath: %d span(s) could not be exported (%s); %d failed in "
                "total; the next report comes in %.0f s at the earliest",
                self._unreported,
                cause,
                self.failed_total,
                LOG_INTERVAL_SECONDS,
            ):
                self._unreported = 0
        return result

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.inner.shutdown()


@dataclass
class _Settings:
    service_name: str | None
    endpoint_class: str
    otlp_endpoint: str | None
    span_exporter: SpanExporter | None
    schedule_delay_seconds: float
    max_queue_size: int
    export_timeout_seconds: float
    resource_attributes: dict[str, Any] = field(default_factory=dict)


@dataclass
class _State:
    settings: _Settings
    provider: TracerProvider
    processor: _CountedBatchProcessor
    exporter: _FailureCountingExporter
    pid: int
    tracer: trace.Tracer


_lock = threading.Lock()
_state: _State | None = None
_dropped_before_total = 0  # drops of providers that were shut down or left in a parent
_failed_before_total = 0  # export failures of providers that were shut down


def sdk_disabled() -> bool:
    """True when ``OTEL_SDK_DISABLED`` is ``true`` (any case), as the SDK reads it."""
    return os.environ.get(OTEL_SDK_DISABLED, "").strip().lower() == "true"


def traces_endpoint(otlp_endpoint: str | None) -> str | None:
    """The URL inferpath hands the OTLP exporter: ``{otlp_endpoint}/v1/traces`` for an
    explicit base URL; ``None`` when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (the SDK's exporter then reads them itself);
    else ``INFERPATH_OTLP_ENDPOINT`` (default ``http://127.0.0.1:4318``) + ``/v1/traces``."""
    base = otlp_endpoint
    if base is None:
        if (
            os.environ.get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "").strip()
            or os.environ.get(OTEL_EXPORTER_OTLP_ENDPOINT, "").strip()
        ):
            return None
        from inferpath.config import Settings

        base = Settings.from_env().otlp_endpoint
    return base.rstrip("/") + "/v1/traces"


def _validate(settings: _Settings) -> None:
    if settings.service_name is not None and (
        not isinstance(settings.service_name, str) or not settings.service_name.strip()
    ):
        raise ValueError("service_name must be a non-empty string (or None: OTEL_SERVICE_NAME, else the SDK's default)")
    if settings.endpoint_class not in ENDPOINT_CLASSES:
        raise ValueError(f"endpoint_class must be one of {ENDPOINT_CLASSES}, got {settings.endpoint_class!r}")
    if not 0 < settings.export_timeout_seconds <= _MAX_TIMEOUT_SECONDS:
        raise ValueError(
            "export_timeout_seconds is in seconds and must be in (0, "
            f"{_MAX_TIMEOUT_SECONDS:g}]; got {settings.export_timeout_seconds!r} "
            "(milliseconds passed by mistake?)"
        )
    if not 0 < settings.schedule_delay_seconds <= _MAX_SCHEDULE_DELAY_SECONDS:
        raise ValueError(
            "schedule_delay_seconds is in seconds and must be in (0, "
            f"{_MAX_SCHEDULE_DELAY_SECONDS:g}]; got {settings.schedule_delay_seconds!r} "
            "(milliseconds passed by mistake?)"
        )
    if not isinstance(settings.max_queue_size, int) or settings.max_queue_size < 1:
        raise ValueError(f"max_queue_size must be a positive int, got {settings.max_queue_size!r}")
    if settings.otlp_endpoint is not None and not settings.otlp_endpoint.startswith(("http://", "https://")):
        raise ValueError(f"otlp_endpoint must be an http(s):// URL, got {settings.otlp_endpoint!r}")


def _build(settings: _Settings) -> _State:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # Resource.create merges the SDK's defaults, OTEL_RESOURCE_ATTRIBUTES and
    # OTEL_SERVICE_NAME under the attributes given here, so only explicit settings and
    # what the environment lacks are given. (Not Resource.create({}) to look: recent SDKs
    # put a process-wide service.instance.id there, which a forked child would share.)
    from_environment = OTELResourceDetector().detect().attributes
    attributes: dict[str, Any] = {ENDPOINT_CLASS: settings.endpoint_class}
    if SERVICE_INSTANCE_ID not in from_environment:
        attributes[SERVICE_INSTANCE_ID] = str(uuid.uuid4())
    attributes.update(settings.resource_attributes)
    if settings.service_name is not None:
        attributes[SERVICE_NAME] = settings.service_name
    # Our own atexit hook (below) bounds the final flush; the SDK's would wait up to 30 s.
    # No sampler given: the SDK reads OTEL_TRACES_SAMPLER (default: parent-based, always on).
    provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
    exporter = settings.span_exporter
    if exporter is None:
        # Headers: the exporter reads OTEL_EXPORTER_OTLP_[TRACES_]HEADERS itself.
        exporter = OTLPSpanExporter(
            endpoint=traces_endpoint(settings.otlp_endpoint), timeout=settings.export_timeout_seconds
        )
    delay_ms = settings.schedule_delay_seconds * 1000.0
    exporter = _FailureCountingExporter(exporter)
    processor = _CountedBatchProcessor(
        exporter,
        max_queue_size=settings.max_queue_size,
        schedule_delay_millis=delay_ms,
        max_export_batch_size=min(512, settings.max_queue_size),
        export_timeout_millis=settings.export_timeout_seconds * 1000.0,
    )
    provider.add_span_processor(processor)
    return _State(
        settings=settings,
        provider=provider,
        processor=processor,
        exporter=exporter,
        pid=os.getpid(),
        tracer=provider.get_tracer(INSTRUMENTATION_NAME),
    )


def _install_global(provider: TracerProvider) -> None:
    current = trace.get_tracer_provider()
    if isinstance(current, trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)


def configure(
    service_name: str | None,
    *,
    endpoint_class: str = "interactive",
    otlp_endpoint: str | None = None,
    span_exporter: SpanExporter | None = None,
    schedule_delay_seconds: float = 0.5,
    max_queue_size: int = 8192,
    export_timeout_seconds: float = 2.0,
    resource_attributes: dict[str, Any] | None = None,
) -> TracerProvider:
    """Build (or return the already built) inferpath tracer provider.

    ``otlp_endpoint`` is the base URL of an OTLP/HTTP receiver; spans are posted as
    protobuf to ``{otlp_endpoint}/v1/traces`` (default: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
    else ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``, else ``INFERPATH_OTLP_ENDPOINT``,
    see :func:`traces_endpoint`). ``service_name`` ``None``: ``OTEL_SERVICE_NAME`` or
    ``service.name`` of ``OTEL_RESOURCE_ATTRIBUTES``, else the SDK's ``unknown_service``. ``span_exporter`` replaces the OTLP exporter
    (tests pass the SDK's ``InMemorySpanExporter``). Spans are batched every
    ``schedule_delay_seconds``; at most ``max_queue_size`` wait, the rest are dropped and
    counted (:func:`dropped_spans_total`). The resource carries ``service.name``,
    ``service.instance.id`` (uuid4 per process unless ``OTEL_RESOURCE_ATTRIBUTES`` names one)
    and ``inferpath.endpoint_class``, plus ``resource_attributes`` and those of
    ``OTEL_RESOURCE_ATTRIBUTES`` (explicit ones win). The sampler is ``OTEL_TRACES_SAMPLER``'s.

    Calling again with the same arguments returns the same provider; with different ones
    the old provider is flushed, shut down and replaced (see the module docstring).

    Raises ``ValueError`` naming the field for an empty service name, an unknown endpoint
    class, a non-HTTP endpoint, a non-positive queue, or a timeout or delay outside its
    range in seconds (a value such as ``2000`` is reported as likely milliseconds).
    """
    global _state
    settings = _Settings(
        service_name=service_name,
        endpoint_class=endpoint_class,
        otlp_endpoint=otlp_endpoint,
        span_exporter=span_exporter,
        schedule_delay_seconds=float(schedule_delay_seconds),
        max_queue_size=max_queue_size,
        export_timeout_seconds=float(export_timeout_seconds),
        resource_attributes=dict(resource_attributes or {}),
    )
    _validate(settings)
    with _lock:
        previous = _state
        if previous is not None and previous.settings == settings and previous.pid == os.getpid():
            return previous.provider
        _state = _build(settings)
        _install_global(_state.provider)
    if previous is not None:
        _retire(previous, settings.export_timeout_seconds)
    return _state.provider


def _retire(state: _State, timeout_seconds: float) -> None:
    """Flush and shut ``state``'s provider down, waiting at most ``timeout_seconds``.

    The SDK's flush ignores its timeout argument and blocks on the exporter, so the work
    runs on a daemon thread and we stop waiting at the bound; a hung collector cannot
    hold the caller (or interpreter exit) hostage.
    """
    global _dropped_before_total, _failed_before_total

    def flush_and_stop() -> None:
        try:
            state.provider.force_flush(int(timeout_seconds * 1000))
            state.provider.shutdown()
        except Exception:  # telemetry teardown must not fail the caller
            _logger.warning("inferpath: shutting down a tracer provider failed", exc_info=True)

    if state.pid == os.getpid():
        worker = threading.Thread(target=flush_and_stop, name="inferpath-shutdown", daemon=True)
        worker.start()
        worker.join(timeout_seconds)
        if worker.is_alive():
            _logger.warning(
                "inferpath: span flush did not finish within %.1f s; remaining spans may be lost", timeout_seconds
            )
    _dropped_before_total += state.processor.dropped_total
    _failed_before_total += state.exporter.failed_total


def _after_fork_in_child() -> None:
    # Only mark; the rebuild (threads, exporter) happens lazily on the first span so a
    # child that never traces pays nothing.
    global _forked
    _forked = True


_forked = False
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _shutdown_at_exit() -> None:
    try:
        shutdown(2.0)
    except Exception:  # pragma: no cover - interpreter teardown
        pass


atexit.register(_shutdown_at_exit)


def get_tracer() -> trace.Tracer:
    """The tracer every inferpath span is started from.

    Before :func:`configure` it is the global API tracer (a no-op unless the application
    configured OTel itself). In a forked child it first rebuilds the provider so the
    child's spans carry their own ``service.instance.id``.
    """
    global _state, _forked
    state = _state
    if state is None:
        return trace.get_tracer(INSTRUMENTATION_NAME)
    if _forked and state.pid != os.getpid():
        with _lock:
            if _state is not None and _state.pid != os.getpid():
                _state = _build(_state.settings)
            _forked = False
            state = _state
    return state.tracer if state is not None else trace.get_tracer(INSTRUMENTATION_NAME)


def current_provider() -> TracerProvider | None:
    """The inferpath tracer provider, or ``None`` before :func:`configure`."""
    return None if _state is None else _state.provider


def current_endpoint_class() -> str | None:
    """The configured endpoint class (``interactive`` or ``bulk``), or ``None``."""
    return None if _state is None else _state.settings.endpoint_class


def is_configured() -> bool:
    """True once :func:`configure` has built a provider (and it was not shut down)."""
    return _state is not None


def dropped_spans_total() -> int:
    """Spans dropped by inferpath's batch processors in this process (queue full or
    emitted after shutdown), summed over every provider built since start."""
    state = _state
    current = state.processor.dropped_total if state is not None else 0
    return _dropped_before_total + current


def export_failed_spans_total() -> int:
    """Spans whose export failed (collector unreachable, error status, timeout) in this
    process, summed over every provider built since start."""
    state = _state
    return _failed_before_total + (state.exporter.failed_total if state is not None else 0)


def suppressed_log_records_total() -> int:
    """Repeated exporter log lines held back by the rate limit (see the module docstring)."""
    return _log_filter.suppressed_total


def force_flush(timeout_seconds: float = 2.0) -> bool:
    """Export every queued span now, waiting at most ``timeout_seconds`` (the SDK's own
    flush ignores its timeout, so it runs on a daemon thread that is waited for with a
    bound). ``False`` if nothing is configured, the flush failed or it timed out."""
    state = _state
    if state is None:
        return False
    outcome: list[bool] = []

    def flush() -> None:
        try:
            outcome.append(bool(state.provider.force_flush(int(timeout_seconds * 1000))))
        except Exception:
            _logger.warning("inferpath: flushing spans failed", exc_info=True)

    worker = threading.Thread(target=flush, name="inferpath-flush", daemon=True)
    worker.start()
    worker.join(timeout_seconds)
    return bool(outcome) and outcome[0]


def shutdown(timeout_seconds: float = 2.0) -> None:
    """Flush queued spans (bounded by ``timeout_seconds``) and stop the export worker.

    Safe to call twice or before :func:`configure`. Raises ``ValueError`` for a timeout
    outside (0, 120] seconds.
    """
    global _state
    if not 0 < timeout_seconds <= _MAX_TIMEOUT_SECONDS:
        raise ValueError(
            f"timeout_seconds is in seconds and must be in (0, {_MAX_TIMEOUT_SECONDS:g}]; "
            f"got {timeout_seconds!r} (milliseconds passed by mistake?)"
        )
    with _lock:
        state, _state = _state, None
    if state is not None:
        _retire(state, timeout_seconds)
