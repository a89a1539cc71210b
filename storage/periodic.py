"""A daemon thread that runs one pass of some work every interval, for the server's
background loops (rollup refresh, memory release).

A failed pass is counted (``failures_total``), logged once per failure streak (the store may
be away for a while; one line, not one per interval) and retried next interval: nothing
raises out of the thread.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["PeriodicPasses"]


class PeriodicPasses:
    """Subclasses implement :meth:`run_pass` and name ``thread_name`` and ``failure_message``
    (logged as ``"<failure_message> (retrying every N s): <error>"`` on their module's logger).
    Raises ``ValueError`` for an ``interval_seconds`` that is not > 0."""

    thread_name = "inferpath-periodic"
    failure_message = "periodic pass failed"

    def __init__(self, interval_seconds: float) -> None:
        if not interval_seconds > 0:
            raise ValueError(f"interval_seconds must be > 0, got {interval_seconds!r}")
        self.interval_seconds = interval_seconds
        self.failures_total = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_pass(self) -> None:
        """One pass of the work; may raise (counted and logged by the thread)."""
        raise NotImplementedError

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Stop the thread; a pass in progress finishes first (bounded by ``timeout_seconds``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_seconds)

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self.interval_seconds):
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
