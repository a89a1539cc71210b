"""Registry of library integrations: name → module, imported lazily, each guarded.

An integration module exposes ``instrument_library(**options)`` and
``uninstrument_library()``. A library that is not installed is skipped with one log line;
an integration that fails is logged and skipped, so one broken integration cannot stop the
others or the application.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

__all__ = ["Integration", "INTEGRATIONS", "instrument_integrations", "uninstrument_integrations",
           "active_integrations"]

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Integration:
    """``name``: how users and logs call it; ``module``: the inferpath module to import;
    ``requires``: the import name of the instrumented library."""

    name: str
    module: str
    requires: str


INTEGRATIONS: tuple[Integration, ...] = (
    Integration("fastapi", "inferpath.instrumentation.fastapi", "fastapi"),
)

_active: dict[str, Any] = {}


def active_integrations() -> list[str]:
    """Names of the integrations currently instrumented."""
    return list(_active)


def instrument_integrations(*, skip: tuple[str, ...] = (), **options: Any) -> list[str]:
    """Instrument every registered integration whose library is installed, except ``skip``.

    ``options`` are passed to each ``instrument_library``. Returns the names now active.
    Never raises for a missing or failing integration.
    """
    for integration in INTEGRATIONS:
        if integration.name in skip or integration.name in _active:
            continue
        try:
            if importlib.util.find_spec(integration.requires) is None:
                _logger.info("inferpath: %s not installed; its integration is skipped",
                             integration.requires)
                continue
            module = importlib.import_module(integration.module)
            module.instrument_library(**options)
            _active[integration.name] = module
        except Exception:
            _logger.warning("inferpath: integration %s failed and is skipped",
                            integration.name, exc_info=True)
    return active_integrations()


def uninstrument_integrations() -> None:
    """Undo every active integration; failures are logged, never raised."""
    for name, module in list(_active.items()):
        try:
            module.uninstrument_library()
        except Exception:
            _logger.warning("inferpath: could not uninstrument %s", name, exc_info=True)
        _active.pop(name, None)
