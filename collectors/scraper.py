"""Scrape one Prometheus-text endpoint into canonical samples, never raising into the caller's loop."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone

import httpx

from inferpath.collectors.catalog import metrics_for
from inferpath.collectors.identity import target_host
from inferpath.collectors.pipeline import ScrapeResult, parse_scrape
from inferpath.collectors.prometheus import HistogramSample, Sample

logger = logging.getLogger(__name__)

_LOG_INTERVAL_SECONDS = 60.0


class Scraper:
    """Fetches ``url`` and turns the scrape into combined samples of ``source`` (:mod:`.pipeline`).

    ``client``: an ``httpx.Client`` to use (it stays the caller's to close); without one the
    scraper makes and owns its own. ``timeout_seconds`` bounds each request.
    ``extra_attributes`` are added to every sample. ``clock`` gives the scrape timestamp
    (wall clock, UTC) and exists for tests.

    A ``localhost`` host label is attributed to the URL's host. :meth:`scrape` never raises
    for a failed or malformed scrape: it returns ``[]``, adds one to ``errors_total`` and
    logs at most one warning per minute (with the count suppressed). Expected signals
    absent from a scrape are counted in ``missing_total`` (signal -> scrapes) and logged
    at most once a minute; ``last_result`` holds the latest :class:`ScrapeResult`.
    Raises ``ValueError`` at construction for an unknown source or a non-HTTP URL.
    """

    def __init__(
        self,
        url: str,
        source: str,
        *,
        client: httpx.Client | None = None,
        timeout_seconds: float = 2.0,
        extra_attributes: Mapping[str, str] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        metrics_for(source)  # validates the source name
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url: expected an http(s) URL, got {url!r}")
        if timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds: must be > 0, got {timeout_seconds}")
        self.url = url
        self.source = source
        self.timeout_seconds = timeout_seconds
        self.extra_attributes = dict(extra_attributes or {})
        self._owns_client = client is None
        self._client = client or httpx.Client(timeout=timeout_seconds)
        self._clock = clock
        self.scrape_host = target_host(url)
        self.scrapes_total = 0
        self.errors_total = 0
        self.missing_total: dict[str, int] = {}
        self.last_result: ScrapeResult | None = None
        self._last_missing_log_s = float("-inf")
        self._last_log_s = float("-inf")
        self._suppressed = 0

    def scrape(self) -> list[Sample | HistogramSample]:
        """One scrape: the combined samples then histograms, or ``[]`` after a counted error."""
        self.scrapes_total += 1
        try:
            response = self._client.get(self.url, timeout=self.timeout_seconds)
            response.raise_for_status()
            result = parse_scrape(
                response.text,
                self.source,
                timestamp=self._clock(),
                scrape_host=self.scrape_host,
                extra_attributes=self.extra_attributes,
            )
        except Exception as exc:  # HTTP, parse or anything else: a collector never stops its loop
            self._failed(exc)
            return []
        self.last_result = result
        if result.missing:
            self._note_missing(result.missing)
        return result.all()

    def _note_missing(self, missing: tuple[str, ...]) -> None:
        for name in missing:
            self.missing_total[name] = self.missing_total.get(name, 0) + 1
        now = time.monotonic()
        if now - self._last_missing_log_s >= _LOG_INTERVAL_SECONDS:
            self._last_missing_log_s = now
            logger.warning(
                "scrape of %s (%s): metric missing for %s; no value stored", self.url, self.source, ", ".join(missing)
            )

    def _failed(self, exc: Exception) -> None:
        self.errors_total += 1
        now = time.monotonic()
        if now - self._last_log_s >= _LOG_INTERVAL_SECONDS:
            more = f" ({self._suppressed} similar errors suppressed)" if self._suppressed else ""
            logger.warning("scrape of %s (%s) failed: %s%s", self.url, self.source, exc, more)
            self._last_log_s, self._suppressed = now, 0
        else:
            self._suppressed += 1

    def close(self) -> None:
        """Close the HTTP client if this scraper created it."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> Scraper:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
