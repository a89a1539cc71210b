"""Context into thread pools: ``ThreadPoolExecutor.submit`` runs work in the submitter's
context, as ``asyncio.to_thread`` already does.

Without it, work handed to a pool (``executor.submit``, ``loop.run_in_executor``, which
calls ``submit``) starts with an empty context and its spans become new root spans, cut
off from the request. The wrapper costs one ``contextvars.copy_context()`` per submit.
``asyncio.gather`` tasks copy the context themselves and need nothing.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
import threading
from typing import Any, Callable

__all__ = ["instrument_library", "uninstrument_library", "is_instrumented"]

_ORIGINAL = "_inferpath_original_submit"
_lock = threading.Lock()


def is_instrumented() -> bool:
    """True while ``ThreadPoolExecutor.submit`` carries the submitter's context."""
    return _ORIGINAL in concurrent.futures.ThreadPoolExecutor.__dict__


def instrument_library(**_options: Any) -> None:
    """Wrap ``concurrent.futures.ThreadPoolExecutor.submit`` (idempotent)."""
    cls = concurrent.futures.ThreadPoolExecutor
    with _lock:
        if is_instrumented():
            return
        original = cls.submit

        @functools.wraps(original)
        def submit(self: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            return original(self, contextvars.copy_context().run, fn, *args, **kwargs)

        setattr(cls, _ORIGINAL, original)
        cls.submit = submit  # type: ignore[method-assign]


def uninstrument_library() -> None:
    """Restore the original ``submit``."""
    cls = concurrent.futures.ThreadPoolExecutor
    with _lock:
        original = cls.__dict__.get(_ORIGINAL)
        if original is not None:
            cls.submit = original  # type: ignore[method-assign]
            delattr(cls, _ORIGINAL)
