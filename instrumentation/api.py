"""``inferpath.instrument()`` / ``inferpath.uninstrument()``: the one-line setup.

    import inferpath
    inferpath.instrument(app, service_name="gateway", endpoint_class="interactive")

``instrument`` configures the tracer provider the first time it runs (later calls reuse it;
call :func:`inferpath.instrumentation.provider.configure` to change it), adds the ASGI
middleware to ``app``, and, when called without an app, turns on every library integration
of the registry (every ``FastAPI()`` built afterwards, httpx/openai model calls,
tokenizers, tiktoken, qdrant, thread-pool context). With an app, only the app is traced
unless ``integrations`` says otherwise, so that other apps and clients in the same process
(an inferpath server run beside a demo gateway, say) are not traced by accident;
``integrations=True`` adds every integration except FastAPI's library mode.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from inferpath.instrumentation import content, provider, receipt, registry
from inferpath.vocabulary import ENDPOINT_CLASSES

__all__ = ["instrument", "uninstrument"]

_logger = logging.getLogger(__name__)
_lock = threading.Lock()


def instrument(
    app: Any = None,
    *,
    service_name: str | None = None,
    endpoint_class: str = "interactive",
    endpoint: str | None = None,
    otlp_endpoint: str | None = None,
    span_exporter: SpanExporter | None = None,
    integrations: bool | Iterable[str] | None = None,
    capture_content: bool = False,
    redact_content: Callable[[str], str | None] | None = None,
    kernel_receive_timestamps: bool = False,
) -> None:
    """Trace ``app`` (a FastAPI/Starlette application) or, with ``app=None``, every FastAPI
    app created afterwards. Idempotent: a second call adds nothing.

    ``service_name`` and ``endpoint_class`` (``interactive`` | ``bulk``) go on the resource
    (``service_name=None``: ``OTEL_SERVICE_NAME``, else ``service.name`` of
    ``OTEL_RESOURCE_ATTRIBUTES``, else the SDK's default);
    ``endpoint`` fixes the span attribute ``inferpath.endpoint`` (default: the matched route
    template); ``otlp_endpoint`` is the OTLP/HTTP base URL (default:
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT``, else
    ``INFERPATH_OTLP_ENDPOINT``; headers from ``OTEL_EXPORTER_OTLP_HEADERS``, the sampler
    from ``OTEL_TRACES_SAMPLER``: the SDK's precedence, explicit argument first);
    ``span_exporter`` replaces the OTLP exporter. With ``OTEL_SDK_DISABLED=true`` nothing
    is set up or traced (one log line).
    ``integrations``: ``None`` (default: all without an app, none with one), ``True`` /
    ``False``, or the registry names to turn on (``"httpx"``, ``"openai"``, ``"tiktoken"``,
    ...; see ``registry.INTEGRATIONS``). Prompt and completion text is never recorded
    unless ``capture_content=True``, and then after ``redact_content(text)`` (see
    ``content.py``).
    ``kernel_receive_timestamps=True`` (opt-in, Linux x86-64/arm64) stamps streamed model
    responses with the kernel's receive time instead of the moment httpx returns the bytes:
    tighter TTFT/ITL under load, at the price of changing the host (class swaps of each
    streamed connection's socket and anyio protocol, ``SO_TIMESTAMPNS``, one UDP socket held
    open; ``receipt.py``). Off by default, when nothing in the host is touched.

    Raises ``ValueError`` (bad service name, endpoint class, endpoint URL or integration
    name) or ``TypeError`` (``app`` is not a Starlette app, ``redact_content`` not
    callable): setup errors, raised before anything is traced.
    """
    if endpoint_class not in ENDPOINT_CLASSES:
        raise ValueError(f"endpoint_class must be one of {ENDPOINT_CLASSES}, got {endpoint_class!r}")
    known = {integration.name for integration in registry.INTEGRATIONS}
    if integrations is None:
        names: tuple[str, ...] | None = None if app is None else ()
    elif integrations is True:
        names = tuple(sorted(known)) if app is None else tuple(sorted(known - {"fastapi"}))
    elif integrations is False:
        names = ()
    else:
        names = tuple(integrations)
        unknown = sorted(set(names) - known)
        if unknown:
            raise ValueError(f"integrations: unknown name(s) {unknown}; known: {sorted(known)}")
    if provider.sdk_disabled():
        _logger.info("inferpath: OTEL_SDK_DISABLED is true; nothing is instrumented")
        return
    content.configure_content_capture(capture_content, redact_content)
    if kernel_receive_timestamps:
        receipt.enable(True)
    with _lock:
        if not provider.is_configured():
            provider.configure(
                service_name, endpoint_class=endpoint_class, otlp_endpoint=otlp_endpoint, span_exporter=span_exporter
            )
        elif service_name is not None and (not service_name or not isinstance(service_name, str)):
            raise ValueError("service_name must be a non-empty string")
        if app is not None:
            from inferpath.instrumentation.fastapi import instrument_app

            instrument_app(app, endpoint_class=endpoint_class, endpoint=endpoint)
        if names is None or names:
            registry.instrument_integrations(only=names, endpoint_class=endpoint_class, endpoint=endpoint)


def uninstrument(app: Any = None) -> None:
    """Reverse :func:`instrument`: remove the middleware from ``app``, or, with
    ``app=None``, from every app instrumented so far and turn the integrations off.

    The tracer provider stays (spans in flight still export); use
    :func:`inferpath.instrumentation.provider.shutdown` to stop it. Never raises.
    """
    from inferpath.instrumentation.fastapi import uninstrument_all_apps, uninstrument_app

    with _lock:
        try:
            if app is not None:
                uninstrument_app(app)
            else:
                registry.uninstrument_integrations()
                uninstrument_all_apps()
                receipt.enable(False)
        except Exception:
            _logger.warning("inferpath: could not uninstrument", exc_info=True)
