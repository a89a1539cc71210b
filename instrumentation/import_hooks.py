"""Run a callback right after a module is first imported (a post-import hook).

``instrument()`` must not import heavy libraries (``transformers`` takes seconds) just
because they are installed; their integrations wait here until the application imports
them. :func:`when_imported` calls the callback at once if the module is already loaded.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["when_imported", "cancel"]

_logger = logging.getLogger(__name__)
_lock = threading.Lock()
_pending: dict[str, Callable[[], Any]] = {}


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader, then runs the pending callback."""

    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        with _lock:
            callback = _pending.pop(self._name, None)
        if callback is not None:
            try:
                callback()
            except Exception:  # an integration must never break the application's import
                _logger.warning("inferpath: post-import hook for %s failed", self._name, exc_info=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


_finder = _Finder()


def when_imported(module_name: str, callback: Callable[[], Any]) -> bool:
    """Call ``callback()`` now if ``module_name`` is imported, else right after its first
    import. Returns True if it ran now. Only one pending callback per module (a later
    one replaces it)."""
    if module_name in sys.modules:
        callback()
        return True
    with _lock:
        _pending[module_name] = callback
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
    return False


def cancel(module_name: str) -> None:
    """Drop the pending callback of ``module_name`` (no-op if none)."""
    with _lock:
        _pending.pop(module_name, None)
