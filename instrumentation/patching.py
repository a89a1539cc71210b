"""Wrapping and restoring methods of a library's class: the one mechanism the library-wide
integrations (tokenizers, transformers, tiktoken, qdrant) share.

The originals are kept on the class itself, under :data:`ORIGINALS_ATTRIBUTE`, so patching is
idempotent (a class that holds them is already patched) and restoring needs no state here.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

ORIGINALS_ATTRIBUTE = "_inferpath_originals"


def patch_methods(cls: type, names: Iterable[str], wrap: Callable[[str, Any], Any], *,
                  inherited: bool = False) -> bool:
    """Replace each method ``name`` of ``cls`` by ``wrap(name, original)``.

    Only methods defined on ``cls`` itself are wrapped, unless ``inherited`` (then any
    attribute ``getattr`` finds). Returns ``False`` if ``cls`` was already patched. If a
    ``setattr`` fails (an immutable extension type raises ``TypeError``), everything
    wrapped so far is restored and the error re-raised.
    """
    if ORIGINALS_ATTRIBUTE in cls.__dict__:
        return False
    if inherited:
        originals = {name: getattr(cls, name) for name in names if hasattr(cls, name)}
    else:
        originals = {name: cls.__dict__[name] for name in names if name in cls.__dict__}
    setattr(cls, ORIGINALS_ATTRIBUTE, originals)
    try:
        for name, original in originals.items():
            setattr(cls, name, wrap(name, original))
    except Exception:
        restore_methods(cls)
        raise
    return True


def restore_methods(cls: type) -> None:
    """Put back the methods :func:`patch_methods` replaced on ``cls`` (no-op if unpatched)."""
    originals = cls.__dict__.get(ORIGINALS_ATTRIBUTE)
    if originals is None:
        return
    for name, original in originals.items():
        setattr(cls, name, original)
    delattr(cls, ORIGINALS_ATTRIBUTE)
