"""``inferpath.instrument()`` / ``inferpath.uninstrument()``: the one-line setup.

    import inferpath
    inferpath.instrument(app, service_name="gateway", endpoint_class="interactive")

``instrument`` configures the tracer provider the first time it runs (later calls reuse it;
call :func:`inferpath.instrumentation.provider.configure` to change it), adds the ASGI
middleware to ``app``, and, when called without an app, turns on the library integrations
of the registry (every ``FastAPI()`` built afterwards is instrumented). Integrations are
not turned on when an app is given, so that other apps in the same process (an inferpath
server run beside a demo gateway, say) are not traced by accident.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from inferpath.instrumentation import provider, registry

__all__ = ["instrument", "uninstrument"]

_logger = logging.getLogger(__name__)
_lock = threading.Lock()


def instrument(
    app: Any = None,
    *,
    service_name: str,
    endpoint_class: str = "interactive",
    endpoint: str | None = None,
    otlp_endpoint: str | None = None,
    span_exporter: SpanExporter | None = None,
) -> None:
    """Trace ``app`` (a FastAPI/Starlette application) or, with ``app=None``, every FastAPI
    app created afterwards. Idempotent: a second call adds nothing.

    ``service_name`` and ``endpoint_class`` (``interactive`` | ``bulk``) go on the resource;
    ``endpoint`` fixes the span attribute ``inferpath.endpoint`` (default: the matched route
    template); ``otlp_endpoint`` is the OTLP/HTTP base URL (default
    ``INFERPATH_OTLP_ENDPOINT``); ``span_exporter`` replaces the OTLP exporter.

    Raises ``ValueError`` (bad service name, endpoint class or endpoint URL) or ``TypeError``
    (``app`` is not a Starlette app): setup errors, raised before anything is traced.
    """
    if endpoint_class not in provider.ENDPOINT_CLASSES:
        raise ValueError(
            f"endpoint_class must be one of {provider.ENDPOINT_CLASSES}, got {endpoint_class!r}"
        )
    with _lock:
        if not provider.is_configured():
            provider.configure(service_name, endpoint_class=endpoint_class,
                               otlp_endpoint=otlp_endpoint, span_exporter=span_exporter)
        elif not service_name or not isinstance(service_name, str):
            raise ValueError("service_name must be a non-empty string")
        if app is not None:
            from inferpath.instrumentation.fastapi import instrument_app

            instrument_app(app, endpoint_class=endpoint_class, endpoint=endpoint)
        else:
            registry.instrument_integrations(endpoint_class=endpoint_class, endpoint=endpoint)


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
        except Exception:
            _logger.warning("inferpath: could not uninstrument", exc_info=True)
