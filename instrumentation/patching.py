"""The one patching mechanism of the integrations: ``wrapt`` function wrappers on a class.

Every library-wide integration (``FastAPI.__init__``, ``ThreadPoolExecutor.submit``, the
httpx/httpx2 transports, tokenizers, transformers, tiktoken, qdrant) wraps with
:func:`wrap_methods` and unwraps with :func:`unwrap_methods`, as OpenTelemetry's contrib
instrumentors do: the wrapper is a transparent proxy (name, signature, ``inspect``'s
answers, method binding, ``__wrapped__``), and unwrapping puts back exactly what the class
held (or removes the wrapper of an inherited method). A wrapper has wrapt's signature
``wrapper(wrapped, instance, args, kwargs)``; ``wrapped`` is already bound to ``instance``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import wrapt

__all__ = ["wrap_methods", "unwrap_methods", "is_wrapped"]

Wrapper = Callable[[Any, Any, tuple, dict], Any]

_lock = threading.Lock()
# (class, method name) -> what the class itself held before wrapping (_INHERITED: nothing).
_originals: dict[tuple[type, str], Any] = {}
_INHERITED = object()


def is_wrapped(cls: type, name: str) -> bool:
    """True while :func:`wrap_methods` has ``cls.name`` wrapped."""
    return (cls, name) in _originals


def wrap_methods(cls: type, wrappers: Mapping[str, Wrapper], *, inherited: bool = False) -> bool:
    """Wrap each method of ``cls`` named in ``wrappers`` with its wrapper.

    Only methods defined on ``cls`` itself are wrapped, unless ``inherited`` (then any
    attribute ``getattr`` finds; the wrapper goes on ``cls``). Returns ``False`` if ``cls``
    already has one of them wrapped (idempotent). If a wrap fails (an immutable extension
    type raises ``TypeError``), everything wrapped so far is unwrapped and the error
    re-raised.
    """
    with _lock:
        if any((cls, name) in _originals for name in wrappers):
            return False
        done: list[str] = []
        try:
            for name, wrapper in wrappers.items():
                own = cls.__dict__.get(name, _INHERITED)
                if own is _INHERITED and not (inherited and hasattr(cls, name)):
                    continue
                wrapt.wrap_function_wrapper(cls, name, wrapper)
                _originals[(cls, name)] = own
                done.append(name)
        except Exception:
            _unwrap(cls, done)
            raise
        return True


def unwrap_methods(cls: type, names: Any = None) -> None:
    """Undo :func:`wrap_methods` on ``cls`` (``names``: only those; no-op where unwrapped)."""
    with _lock:
        _unwrap(cls, [name for (owner, name) in list(_originals) if owner is cls and (names is None or name in names)])


def _unwrap(cls: type, names: list[str]) -> None:
    for name in names:
        own = _originals.pop((cls, name))
        if own is _INHERITED:
            delattr(cls, name)
        else:
            setattr(cls, name, own)
