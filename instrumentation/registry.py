"""Registry of library integrations: name → module, imported lazily, each guarded.

An integration module exposes ``instrument_library(**options)`` and
``uninstrument_library()``. A library that is not installed, or older than the
integration's ``min_version``, is skipped with one log line; an integration that fails is
logged and skipped, so one broken integration cannot stop the others or the application.
Each is turned on at most once (``instrument_integrations`` twice does nothing more) and
``uninstrument_integrations`` unwraps everything that was turned on.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import re
import sys
from dataclasses import dataclass
from typing import Any

from inferpath.instrumentation import import_hooks

__all__ = ["Integration", "INTEGRATIONS", "instrument_integrations", "uninstrument_integrations", "active_integrations"]

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Integration:
    """``name``: how users and logs call it; ``module``: the inferpath module to import;
    ``requires``: the import name of the instrumented library; ``distribution`` and
    ``min_version``: its PyPI name and the oldest release the integration supports."""

    name: str
    module: str
    requires: str
    distribution: str | None = None
    min_version: tuple[int, ...] = ()
    deferred: bool = False  # heavy library: instrument when the application imports it


INTEGRATIONS: tuple[Integration, ...] = (
    Integration("fastapi", "inferpath.instrumentation.fastapi", "fastapi", "fastapi", (0, 100)),
    Integration("threads", "inferpath.instrumentation.threads", "concurrent.futures"),
    Integration("httpx", "inferpath.instrumentation.genai_http", "httpx", "httpx", (0, 23)),
    Integration("openai", "inferpath.instrumentation.openai_sdk", "openai", "openai", (1, 0)),
    Integration("tokenizers", "inferpath.instrumentation.tokenizers", "tokenizers", "tokenizers", (0, 13)),
    Integration(
        "transformers",
        "inferpath.instrumentation.transformers_tokenizers",
        "transformers",
        "transformers",
        (4, 30),
        deferred=True,
    ),
    Integration("tiktoken", "inferpath.instrumentation.tiktoken_tokens", "tiktoken", "tiktoken", (0, 4)),
    Integration("qdrant", "inferpath.instrumentation.qdrant", "qdrant_client", "qdrant-client", (1, 10), deferred=True),
)

_active: dict[str, Any] = {}


def active_integrations() -> list[str]:
    """Names of the integrations currently instrumented."""
    return list(_active)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _unsupported_version(integration: Integration) -> str | None:
    """The installed version if it is older than ``min_version``, else ``None``."""
    if integration.distribution is None or not integration.min_version:
        return None
    try:
        installed = importlib.metadata.version(integration.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None  # importable but not installed as a distribution: let it try
    return installed if _version_tuple(installed) < integration.min_version else None


def instrument_integrations(
    *, skip: tuple[str, ...] = (), only: tuple[str, ...] | None = None, **options: Any
) -> list[str]:
    """Instrument every registered integration whose library is installed, except ``skip``
    (or only those named in ``only``).

    ``options`` are passed to each ``instrument_library``. Returns the names now active.
    Never raises for a missing, too old or failing integration.
    """
    for integration in INTEGRATIONS:
        if integration.name in skip or integration.name in _active:
            continue
        if only is not None and integration.name not in only:
            continue
        try:
            if importlib.util.find_spec(integration.requires) is None:
                _logger.info("inferpath: %s not installed; its integration is skipped", integration.requires)
                continue
            too_old = _unsupported_version(integration)
            if too_old is not None:
                _logger.info(
                    "inferpath: %s %s is older than the supported %s; its integration is skipped",
                    integration.distribution,
                    too_old,
                    ".".join(map(str, integration.min_version)),
                )
                continue
            module = importlib.import_module(integration.module)
            if integration.deferred:
                # Importing transformers or qdrant_client costs seconds: wait until the
                # application imports it (at once if it already has).
                import_hooks.when_imported(integration.requires, _guarded(integration.name, module, options))
            else:
                module.instrument_library(**options)
            _active[integration.name] = module
        except Exception:
            _logger.warning("inferpath: integration %s failed and is skipped", integration.name, exc_info=True)
    return active_integrations()


def _guarded(name: str, module: Any, options: dict[str, Any]) -> Any:
    def instrument_now() -> None:
        try:
            module.instrument_library(**options)
        except Exception:
            _logger.warning("inferpath: integration %s failed and is skipped", name, exc_info=True)

    return instrument_now


def uninstrument_integrations() -> None:
    """Undo every active integration; failures are logged, never raised."""
    for name, module in list(_active.items()):
        integration = next((i for i in INTEGRATIONS if i.name == name), None)
        if integration is not None and integration.deferred:
            import_hooks.cancel(integration.requires)
            if integration.requires not in sys.modules:
                _active.pop(name, None)
                continue
        try:
            module.uninstrument_library()
        except Exception:
            _logger.warning("inferpath: could not uninstrument %s", name, exc_info=True)
        _active.pop(name, None)
