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
import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# In a source checkout (editable install) the component folders sit beside this package
# rather than inside it; the wheel maps them to ``inferpath/<component>``. Extending
# ``__path__`` only when the sibling layout is present keeps both layouts importable.
_here = os.path.dirname(os.path.abspath(__file__))
_root = os.path.dirname(_here)
if not os.path.isdir(os.path.join(_here, "storage")) and os.path.isfile(
    os.path.join(_root, "storage", "__init__.py")
) and os.path.isfile(os.path.join(_root, "pyproject.toml")):
    __path__.append(_root)  # type: ignore[name-defined]

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
