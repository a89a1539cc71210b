"""Carry the current trace context into worker threads.

``asyncio.to_thread`` and ``asyncio.gather`` already copy ``contextvars`` (and with them
the OTel context). ``loop.run_in_executor`` and ``ThreadPoolExecutor.submit`` do not: work
submitted there starts with an empty context, and its spans become new root spans. These
helpers run the callable inside a copy of the submitter's context.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
from typing import Any, Callable, TypeVar

__all__ = ["submit_in_context", "run_in_executor", "wrap_executor", "ContextExecutor"]

T = TypeVar("T")


def submit_in_context(executor: concurrent.futures.Executor, fn: Callable[..., T],
                      *args: Any, **kwargs: Any) -> "concurrent.futures.Future[T]":
    """``executor.submit(fn, *args, **kwargs)`` with the caller's context (current span
    included) active in the worker."""
    return executor.submit(contextvars.copy_context().run, fn, *args, **kwargs)


async def run_in_executor(executor: concurrent.futures.Executor | None, fn: Callable[..., T],
                          *args: Any) -> T:
    """``loop.run_in_executor(executor, fn, *args)`` with the caller's context active in
    the worker (``None``: the loop's default executor)."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await loop.run_in_executor(executor, call)


class ContextExecutor(concurrent.futures.Executor):
    """An executor that submits to ``inner`` with the submitter's context; usable with
    ``loop.run_in_executor`` and as a drop-in for code that calls ``submit``."""

    def __init__(self, inner: concurrent.futures.Executor) -> None:
        self.inner = inner

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> "concurrent.futures.Future[T]":
        return submit_in_context(self.inner, fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.inner.shutdown(wait=wait, cancel_futures=cancel_futures)


def wrap_executor(executor: concurrent.futures.Executor) -> ContextExecutor:
    """Wrap ``executor`` so every ``submit`` carries the submitter's context."""
    if isinstance(executor, ContextExecutor):
        return executor
    return ContextExecutor(executor)
