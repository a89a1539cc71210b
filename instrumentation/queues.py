"""Home-made batching queues: the wait from enqueue to dequeue as a ``queue`` stage span.

A request that waits in an application's own batcher (collect up to N prompts or T ms,
then call the model once) spends that wait in no library inferpath could see. Two ways to
record it:

    queue = TracedQueue(maxsize=1024)          # an asyncio.Queue with the same methods
    await queue.put(item)                      # in the request
    batch = await queue.get_batch(32, max_wait_seconds=0.005)   # in the batcher

    ticket = QueueTicket()                     # any other queue: carry a ticket with the item
    ...; ticket.dequeued(batch_size=len(batch))

Each item gets one INTERNAL span ``queue`` (``inferpath.stage=queue``) whose parent is the
span that was current at enqueue (the request), which starts at the enqueue and ends at
the dequeue, so the wait lands in the request's trace even though the batcher runs in
another task. Attributes: ``inferpath.queue.depth`` (items ahead at enqueue) and
``inferpath.queue.batch_size`` (items dequeued together). Clocks: wall clock for the span
start, monotonic for its duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Generic, TypeVar

from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind

from inferpath.instrumentation import provider
from inferpath.instrumentation import semconv as sc

__all__ = ["QueueTicket", "TracedQueue", "ATTR_QUEUE_DEPTH", "ATTR_BATCH_SIZE"]

_logger = logging.getLogger(__name__)
T = TypeVar("T")
ATTR_QUEUE_DEPTH = "inferpath.queue.depth"
ATTR_BATCH_SIZE = "inferpath.queue.batch_size"


class QueueTicket:
    """The enqueue moment and trace context of one item. Build it where the item is
    enqueued (the request's context is captured then); call :meth:`dequeued` once where it
    is taken out. ``depth``: items ahead of it (optional)."""

    __slots__ = ("context", "enqueued_wall_ns", "enqueued_perf_ns", "depth", "done")

    def __init__(self, depth: int | None = None) -> None:
        self.context = otel_context.get_current()
        self.enqueued_wall_ns = time.time_ns()
        self.enqueued_perf_ns = time.perf_counter_ns()
        self.depth = depth
        self.done = False

    def dequeued(self, batch_size: int | None = None) -> float:
        """Emit the ``queue`` span (once; later calls do nothing) and return the wait in
        seconds (monotonic clock). Never raises for telemetry failures."""
        wait_ns = time.perf_counter_ns() - self.enqueued_perf_ns
        if self.done:
            return wait_ns / 1e9
        self.done = True
        try:
            attributes: dict[str, Any] = {sc.STAGE: "queue"}
            if self.depth is not None:
                attributes[ATTR_QUEUE_DEPTH] = self.depth
            if batch_size is not None:
                attributes[ATTR_BATCH_SIZE] = batch_size
            span = provider.get_tracer().start_span(
                "queue",
                context=self.context,
                kind=SpanKind.INTERNAL,
                attributes=attributes,
                start_time=self.enqueued_wall_ns,
            )
            span.end(end_time=self.enqueued_wall_ns + wait_ns)
        except Exception:
            _logger.warning("inferpath: could not record a queue span", exc_info=True)
        return wait_ns / 1e9


class TracedQueue(Generic[T]):
    """``asyncio.Queue`` whose items carry a :class:`QueueTicket`; ``get``/``get_nowait``
    and :meth:`get_batch` emit each item's ``queue`` span. ``put``, ``put_nowait``,
    ``qsize``, ``empty``, ``full``, ``task_done``, ``join`` and ``maxsize`` behave as in
    ``asyncio.Queue`` (and raise its ``QueueFull``/``QueueEmpty``)."""

    def __init__(self, maxsize: int = 0) -> None:
        self._queue: asyncio.Queue[tuple[T, QueueTicket]] = asyncio.Queue(maxsize)

    @property
    def maxsize(self) -> int:
        return self._queue.maxsize

    def qsize(self) -> int:
        return self._queue.qsize()

    def empty(self) -> bool:
        return self._queue.empty()

    def full(self) -> bool:
        return self._queue.full()

    async def put(self, item: T) -> None:
        await self._queue.put((item, QueueTicket(self._queue.qsize())))

    def put_nowait(self, item: T) -> None:
        self._queue.put_nowait((item, QueueTicket(self._queue.qsize())))

    async def get(self) -> T:
        item, ticket = await self._queue.get()
        ticket.dequeued(1)
        return item

    def get_nowait(self) -> T:
        item, ticket = self._queue.get_nowait()
        ticket.dequeued(1)
        return item

    async def get_batch(self, max_items: int, max_wait_seconds: float) -> list[T]:
        """Wait for one item, then collect more until ``max_items`` or ``max_wait_seconds``
        (monotonic, counted from the first item) pass; returns 1..``max_items`` items.
        Raises ``ValueError`` for ``max_items`` < 1 or a negative wait."""
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items!r}")
        if max_wait_seconds < 0:
            raise ValueError(f"max_wait_seconds must be >= 0, got {max_wait_seconds!r}")
        entries = [await self._queue.get()]
        deadline = time.monotonic() + max_wait_seconds
        while len(entries) < max_items:
            try:
                entries.append(self._queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            # Not wait_for(get()): on 3.11 an item that arrives as the timeout fires can be
            # lost; a cancelled getter that already holds an item is kept here.
            getter = asyncio.ensure_future(self._queue.get())
            done, _ = await asyncio.wait({getter}, timeout=remaining)
            if getter not in done:
                getter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await getter
            if getter.cancelled():
                break
            entries.append(getter.result())
        for _, ticket in entries:
            ticket.dequeued(len(entries))
        return [item for item, _ in entries]

    def task_done(self) -> None:
        self._queue.task_done()

    async def join(self) -> None:
        await self._queue.join()
