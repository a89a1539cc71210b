"""A log that says a repeated problem at most once per interval, with the count it did not say."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """At most one line per ``interval_seconds`` (monotonic clock) on ``logger``; the next line
    after a quiet spell says how many were suppressed since the last one. Thread-safe: the
    lines are formatted and written outside the lock."""

    def __init__(self, logger: logging.Logger, interval_seconds: float = 10.0) -> None:
        if not interval_seconds >= 0:
            raise ValueError(f"interval_seconds must be >= 0, got {interval_seconds!r}")
        self._logger = logger
        self._interval_seconds = interval_seconds
        self._last = float("-inf")
        self._suppressed = 0
        self._lock = threading.Lock()

    def log(self, level: int, message: str, *args: Any) -> bool:
        """Log ``message % args`` at ``level`` unless a line went out less than the interval
        ago (then count it); True when it was logged."""
        now = time.monotonic()
        with self._lock:
            if now - self._last < self._interval_seconds:
                self._suppressed += 1
                return False
            suppressed, self._last, self._suppressed = self._suppressed, now, 0
        suffix = f" ({suppressed} similar message{'s' * (suppressed != 1)} suppressed)" if suppressed else ""
        self._logger.log(level, message + suffix, *args)
        return True

    def warning(self, message: str, *args: Any) -> bool:
        """:meth:`log` at ``WARNING``."""
        return self.log(logging.WARNING, message, *args)
