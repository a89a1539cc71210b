"""``openai`` SDK integration: its calls become GenAI CLIENT spans.

The SDK (1.x and later) sends every request through an ``httpx`` client with httpx's own
transports, so the spans come from :mod:`inferpath.instrumentation.genai_http`; this module
checks that the installed SDK is one that does (older, ``requests``-based releases are
skipped with one log line) and claims the httpx wrap for itself, so turning the ``httpx``
integration off does not turn the SDK's spans off.

Sync and async clients, ``stream=True`` or not, ``with client.chat.completions.create(...)``
and ``client.chat.completions.stream(...)`` are all covered. A client built with a custom
``http_client`` whose transport is not httpx's (``httpx.MockTransport``, say) is not.
"""

from __future__ import annotations

from typing import Any

from inferpath.instrumentation import genai_http

__all__ = ["instrument_library", "uninstrument_library", "MIN_VERSION"]

#: The first SDK release built on httpx.
MIN_VERSION = (1, 0)


def instrument_library(**_options: Any) -> None:
    """Trace the SDK's model calls (idempotent). Raises ``RuntimeError`` for an SDK older
    than :data:`MIN_VERSION` (the registry logs it and skips the integration)."""
    import openai

    version = tuple(int(part) for part in openai.__version__.split(".")[:2] if part.isdigit())
    if version < MIN_VERSION:
        raise RuntimeError(f"openai {openai.__version__} is not supported (needs >= 1.0)")
    genai_http.instrument_library(owner="openai")


def uninstrument_library() -> None:
    """Stop tracing the SDK's calls (the httpx wrap stays while its own integration is on)."""
    genai_http.uninstrument_library(owner="openai")
