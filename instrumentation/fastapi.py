"""FastAPI / Starlette integration: add or remove the inferpath ASGI middleware.

``instrument_app`` is idempotent (an app never gets the middleware twice) and works before
the app starts; on an app that already serves, the middleware stack is rebuilt on the next
request. ``instrument_library`` makes every ``FastAPI()`` created afterwards instrumented,
as OTel's FastAPI instrumentor does; ``uninstrument_library`` undoes it.

Recent FastAPI releases trace requests natively (``FastAPI(telemetry=...)``) as soon as a
global tracer provider exists, which inferpath's setup creates. Two SERVER spans for one
request would break the one-gateway-span-per-hop rule of the telemetry contract, so
``instrument_app`` turns the app's native tracing off (its metrics and logs are left as
they are) and ``uninstrument_app`` restores the previous setting. FastAPI offers no public
switch on an existing app (only ``FastAPI(telemetry={"tracing": False})`` at creation), so
this writes the app's private ``_telemetry`` dict; ``pyproject.toml`` pins FastAPI to the
versions where that was tested, and a test fails on any other. A FastAPI app mounted
inside an instrumented one is kept from tracing the request natively by the middleware
itself (see ``asgi.py``), so it makes no second SERVER span either, whenever it was mounted.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from inferpath.instrumentation.asgi import InferpathASGIMiddleware
from inferpath.instrumentation.patching import unwrap_methods, wrap_methods

__all__ = [
    "instrument_app",
    "uninstrument_app",
    "uninstrument_all_apps",
    "is_instrumented",
    "instrument_library",
    "uninstrument_library",
]

_logger = logging.getLogger(__name__)
_NATIVE_TRACING = "_inferpath_native_tracing"
# Every app given the middleware, so a global uninstrument can find them again.
_instrumented_apps: weakref.WeakSet[Any] = weakref.WeakSet()


def _disable_native_tracing(app: Any) -> None:
    config = getattr(app, "_telemetry", None)
    if isinstance(config, dict) and config.get("tracing"):
        # FastAPI keeps this dict by reference in its telemetry middleware, so the change
        # applies to the next request without rebuilding anything.
        setattr(app, _NATIVE_TRACING, config["tracing"])
        config["tracing"] = False
        _logger.info("inferpath: FastAPI native tracing turned off for this app; inferpath emits its server span")


def _restore_native_tracing(app: Any) -> None:
    config = getattr(app, "_telemetry", None)
    previous = app.__dict__.pop(_NATIVE_TRACING, None) if hasattr(app, "__dict__") else None
    if isinstance(config, dict) and previous is not None:
        config["tracing"] = previous


def is_instrumented(app: Any) -> bool:
    """True if ``app`` (a Starlette/FastAPI application) carries the inferpath middleware."""
    return any(getattr(m, "cls", None) is InferpathASGIMiddleware for m in getattr(app, "user_middleware", ()))


def instrument_app(app: Any, *, endpoint_class: str | None = None, endpoint: str | None = None) -> bool:
    """Add :class:`InferpathASGIMiddleware` as the outermost user middleware of ``app``.

    Returns ``True`` if it was added, ``False`` if it was already there. Raises
    ``TypeError`` if ``app`` is not a Starlette/FastAPI application (a setup error).
    """
    from starlette.middleware import Middleware

    if not hasattr(app, "user_middleware") or not hasattr(app, "middleware_stack"):
        raise TypeError(f"app must be a Starlette or FastAPI application, got {type(app)!r}")
    if is_instrumented(app):
        return False
    try:
        _disable_native_tracing(app)
    except Exception:
        _logger.warning("inferpath: could not turn FastAPI native tracing off", exc_info=True)
    app.user_middleware.insert(0, Middleware(InferpathASGIMiddleware, endpoint_class=endpoint_class, endpoint=endpoint))
    try:
        _instrumented_apps.add(app)
    except TypeError:  # pragma: no cover - an app class without weakref support
        pass
    if app.middleware_stack is not None:
        # Starlette builds the stack on the first request; dropping it makes the next
        # request rebuild it with our middleware (other middleware are re-instantiated).
        _logger.info("inferpath: app already started; its middleware stack will be rebuilt")
        app.middleware_stack = None
    return True


def uninstrument_app(app: Any) -> bool:
    """Remove the inferpath middleware from ``app``; ``True`` if there was one."""
    middleware = getattr(app, "user_middleware", None)
    _instrumented_apps.discard(app)
    if middleware is None:
        return False
    kept = [m for m in middleware if getattr(m, "cls", None) is not InferpathASGIMiddleware]
    if len(kept) == len(middleware):
        return False
    middleware[:] = kept
    app.middleware_stack = None
    try:
        _restore_native_tracing(app)
    except Exception:
        _logger.warning("inferpath: could not restore FastAPI native tracing", exc_info=True)
    return True


def uninstrument_all_apps() -> int:
    """Remove the middleware from every app this module instrumented; returns how many."""
    return sum(uninstrument_app(app) for app in list(_instrumented_apps))


def instrument_library(*, endpoint_class: str | None = None, endpoint: str | None = None) -> None:
    """Instrument every ``fastapi.FastAPI`` constructed from now on (idempotent)."""
    import fastapi

    def init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
        wrapped(*args, **kwargs)
        try:
            instrument_app(instance, endpoint_class=endpoint_class, endpoint=endpoint)
        except Exception:
            _logger.warning("inferpath: could not instrument a new FastAPI app", exc_info=True)

    wrap_methods(fastapi.FastAPI, {"__init__": init})


def uninstrument_library() -> None:
    """Stop instrumenting new ``FastAPI`` apps (see :func:`uninstrument_all_apps` for the
    apps already built)."""
    import fastapi

    unwrap_methods(fastapi.FastAPI)
