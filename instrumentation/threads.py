"""Trace context into worker threads: work handed to a thread pool runs in the submitter's
context, as ``asyncio.to_thread`` already does.

Without it, work handed to a pool (``executor.submit``, ``loop.run_in_executor``, which
calls ``submit``) starts with an empty context and its spans become new root spans, cut
off from the request. Two ways, one mechanism (``contextvars.copy_context().run``, one
copy per submit): the ``threads`` integration wraps ``ThreadPoolExecutor.submit`` for the
whole process; :func:`wrap_executor` wraps one executor, for code that does not turn the
integration on (or uses another ``Executor``). ``asyncio.gather`` tasks copy the context
themselves and need nothing.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
from collections.abc import Callable
from typing import Any, TypeVar

from inferpath.instrumentation.patching import is_wrapped, unwrap_methods, wrap_methods

__all__ = ["instrument_library", "uninstrument_library", "is_instrumented", "wrap_executor", "ContextExecutor"]

T = TypeVar("T")


def _submit_in_context(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    # submit(fn, /, *args, **kwargs): fn runs inside a copy of the submitter's context.
    return wrapped(contextvars.copy_context().run, *args, **kwargs)


def is_instrumented() -> bool:
    """True while ``ThreadPoolExecutor.submit`` carries the submitter's context."""
    return is_wrapped(concurrent.futures.ThreadPoolExecutor, "submit")


def instrument_library(**_options: Any) -> None:
    """Wrap ``concurrent.futures.ThreadPoolExecutor.submit`` (idempotent)."""
    wrap_methods(concurrent.futures.ThreadPoolExecutor, {"submit": _submit_in_context})


def uninstrument_library() -> None:
    """Restore the original ``submit``."""
    unwrap_methods(concurrent.futures.ThreadPoolExecutor)


class ContextExecutor(concurrent.futures.Executor):
    """An executor that submits to ``inner`` with the submitter's context; usable with
    ``loop.run_in_executor`` and as a drop-in for code that calls ``submit``."""

    def __init__(self, inner: concurrent.futures.Executor) -> None:
        self.inner = inner

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        return self.inner.submit(contextvars.copy_context().run, fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.inner.shutdown(wait=wait, cancel_futures=cancel_futures)


def wrap_executor(executor: concurrent.futures.Executor) -> ContextExecutor:
    """``executor`` wrapped so that every ``submit`` (and ``loop.run_in_executor(wrapped,
    fn)``) runs ``fn`` in the submitter's context, current span included. Idempotent."""
    if isinstance(executor, ContextExecutor):
        return executor
    return ContextExecutor(executor)
