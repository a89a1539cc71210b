"""The background pass that keeps the request rollups and the hop rollup up to date.

It runs :func:`inferpath.storage.rollup.refresh` and then
:func:`inferpath.storage.hop_rollup.refresh_hops` with one pass time, so their horizons
agree; the hop rollup builds on the request rollup's module, and this pass on both.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime, timezone

from inferpath.storage.hop_rollup import refresh_hops
from inferpath.storage.periodic import PeriodicPasses
from inferpath.storage.rollup import DEFAULT_MARGIN_SECONDS, RefreshResult, refresh

__all__ = ["RollupRefresher"]


class RollupRefresher(PeriodicPasses):
    """A daemon thread calling :func:`~inferpath.storage.rollup.refresh` and then the hop
    rollup's :func:`~inferpath.storage.hop_rollup.refresh_hops` every ``interval_seconds``; a failed
    pass is logged (rate-limited to one line per failure streak) and retried next interval
    (each rollup keeps its own watermark, so a failure redoes only its own work).
    ``passes_total`` / ``failures_total`` / ``last_seconds`` are read by ``/metrics``."""

    thread_name = "inferpath-rollup"
    failure_message = "rollup refresh failed"

    def __init__(
        self, store, *, interval_seconds: float = 10.0, margin_seconds: float = DEFAULT_MARGIN_SECONDS
    ) -> None:
        super().__init__(interval_seconds)
        self.store = store
        self.margin_seconds = margin_seconds
        self.passes_total = 0
        self.last_seconds = 0.0
        self._lock = threading.Lock()

    def refresh_now(self) -> RefreshResult:
        """One pass now (request rollups, then hop rollup), serialized with the thread's
        passes; raises what the store raises."""
        with self._lock:
            # One pass time for both: their horizons (watermarks floored to the minute) then
            # agree, even when the hop pass starts in the next minute. Earlier than the hop
            # pass's own start, so its watermark is only more cautious.
            now = datetime.now(timezone.utc)
            result = refresh(self.store, now=now, margin_seconds=self.margin_seconds)
            hops = refresh_hops(self.store, now=now, margin_seconds=self.margin_seconds)
            result = replace(result, seconds=result.seconds + hops.seconds, hop_minutes=hops.minutes)
            self.passes_total += 1
            self.last_seconds = result.seconds
            return result

    def run_pass(self) -> None:
        """The thread's pass (:class:`PeriodicPasses`)."""
        self.refresh_now()
