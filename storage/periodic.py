"""A daemon thread that runs one pass of some work every interval: the one background-loop
idiom of the server (request assembly, engine scrapes, rollup refresh) and of the alert
evaluator.

Passes start at a fixed rate on the monotonic clock: a pass that overruns its interval makes
the next one start at once and the missed ticks are skipped, never piled up. A failed pass is
counted (``failures_total``), logged once per failure streak (the store may be away for a
while; one line, not one per interval) and retried next interval: nothing raises out of the
thread.
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["PeriodicPasses"]


class PeriodicPasses:
    """Subclasses implement :meth:`run_pass` and name ``thread_name`` and ``failure_message``
    (logged as ``"<failure_message> (retrying every N s): <error>"`` on their module's logger).
    ``first_pass_at_start``: run the first pass as the thread starts instead of one interval
    later. Raises ``ValueError`` for an ``interval_seconds`` that is not > 0."""

    thread_name = "inferpath-periodic"
    failure_message = "periodic pass failed"
    first_pass_at_start = False

    def __init__(self, interval_seconds: float) -> None:
        if not interval_seconds > 0:
            raise ValueError(f"interval_seconds must be > 0, got {interval_seconds!r}")
        self.interval_seconds = float(interval_seconds)
        self.failures_total = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_pass(self) -> None:
        """One pass of the work; may raise (counted and logged by the thread)."""
        raise NotImplementedError

    @property
    def running(self) -> bool:
        """The thread is alive (started and not yet stopped)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread; idempotent, and starts again after :meth:`stop`."""
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Stop the thread; a pass in progress finishes first (bounded by ``timeout_seconds``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_seconds)
            if not self._thread.is_alive():
                self._thread = None

    def _run(self) -> None:
        failing = False
        next_tick = time.monotonic() + (0.0 if self.first_pass_at_start else self.interval_seconds)
        while not self._stop.wait(max(0.0, next_tick - time.monotonic())):
            try:
                self.run_pass()
                failing = False
            except Exception as exc:  # noqa: BLE001 - the store may be away; the next pass retries
                self.failures_total += 1
                if not failing:
                    logging.getLogger(type(self).__module__).warning(
                        "%s (retrying every %g s): %s", self.failure_message, self.interval_seconds, exc
                    )
                failing = True
            next_tick += self.interval_seconds
            now = time.monotonic()
            if next_tick < now:  # overran: start the next pass now, skip the missed ticks
                next_tick = now
