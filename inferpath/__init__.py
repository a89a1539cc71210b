"""inferpath: trace the path of every inference request and name the bottleneck.

Public API (imported lazily so that ``import inferpath`` pulls in neither chDB, Streamlit
nor the demo's dependencies)::

    import inferpath
    inferpath.instrument(app, service_name="gateway", endpoint_class="interactive")
    with inferpath.stage("retrieval"):
        ...
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The component folders (``server/``, ``storage/``, …) sit at the repository root; in a
# checkout ``inferpath/<component>`` is a symbolic link to each, which the wheel build
# follows, so the installed package and the checkout have the same layout for the
# interpreter and for static tools alike.

_LAZY = {
    "instrument": "inferpath.instrumentation.api",
    "uninstrument": "inferpath.instrumentation.api",
    "stage": "inferpath.instrumentation.stages",
}

__all__ = ["instrument", "uninstrument", "stage", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from inferpath.instrumentation.api import instrument, uninstrument
    from inferpath.instrumentation.stages import stage


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'inferpath' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
