"""The collection agent: poll NVML and scrape exporters on a node, push OTLP metrics to a server.

The shape of a DaemonSet beside dcgm-exporter: every ``interval_seconds`` the agent polls
NVML (optional) and scrapes each target (dcgm-exporter, engine ``/metrics``) through the
same pipeline the server's own scrape loop uses, then POSTs one OTLP/HTTP protobuf
``ExportMetricsServiceRequest`` to ``{server_url}/v1/metrics``.

Delivery rules (the OTLP/HTTP specification's retry guidance):
- Batches wait in a bounded buffer (``max_buffered_samples``); when it is full the oldest
  batches are dropped and counted in ``samples_dropped_total``.
- 429, 502, 503 and 504 and connection errors are retried with exponential backoff
  (0.5 s doubling to 30 s); a ``Retry-After`` header (seconds) sets the wait instead.
- Any other 4xx cannot succeed later: that request's samples are dropped and counted.
- Collection continues while the server is away; nothing raises out of the loop.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from inferpath.collectors.otlp_export import build_request
from inferpath.config import ScrapeTarget
from inferpath.ratelimited_log import RateLimitedLog

if TYPE_CHECKING:
    from inferpath.collectors.nvml import NvmlPoller

logger = logging.getLogger(__name__)

_RETRYABLE = {429, 502, 503, 504}
_BACKOFF_START_SECONDS = 0.5
_BACKOFF_MAX_SECONDS = 30.0
_LOG_INTERVAL_SECONDS = 60.0


@dataclass
class AgentStats:
    """Counters of one agent run (all ``*_total`` are cumulative)."""

    ticks_total: int = 0
    samples_collected_total: int = 0
    samples_sent_total: int = 0
    samples_dropped_total: int = 0
    requests_total: int = 0
    export_failures_total: int = 0


def parse_scrape_targets(targets: Iterable[object]) -> list[tuple[str, str]]:
    """``"SOURCE=URL"`` or bare-URL strings, ``(source, url)`` pairs or objects with
    ``source``/``url`` -> ``[(source, url)]``, each read by the settings' parser
    (:meth:`inferpath.config.ScrapeTarget.parse`: the same sources and URLs as
    ``inferpath up --scrape``; a bare URL is vLLM). Raises ``ValueError`` naming the bad
    entry (unknown source, not an http(s) URL with a host)."""
    parsed = []
    for target in targets:
        if isinstance(target, str):
            text = target
        else:
            pair = target if isinstance(target, tuple) else (target.source, target.url)  # type: ignore[attr-defined]
            text = f"{pair[0]}={pair[1]}"
        scrape_target = ScrapeTarget.parse(text)
        parsed.append((scrape_target.source, scrape_target.url))
    return parsed


class _Exporter:
    """Bounded buffer + OTLP/HTTP sender with backoff; never raises."""

    def __init__(
        self,
        server_url: str,
        *,
        token: str | None,
        client: httpx.Client | None,
        max_buffered_samples: int,
        stats: AgentStats,
        resource_attributes: dict[str, str],
        timeout_seconds: float = 5.0,
    ) -> None:
        self.url = server_url.rstrip("/") + "/v1/metrics"
        self.headers = {"Content-Type": "application/x-protobuf"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.client = client or httpx.Client(timeout=timeout_seconds)
        self._owns_client = client is None
        self.max_buffered_samples = max_buffered_samples
        self.stats = stats
        self.resource_attributes = resource_attributes
        self.buffer: deque[tuple[str, list]] = deque()
        self.buffered_samples = 0
        self.next_attempt_s = 0.0
        self.backoff_seconds = _BACKOFF_START_SECONDS
        self._log = RateLimitedLog(logger, _LOG_INTERVAL_SECONDS)

    def add(self, source: str, samples: list) -> None:
        self.stats.samples_collected_total += len(samples)
        if not samples:
            return
        self.buffer.append((source, samples))
        self.buffered_samples += len(samples)
        while self.buffered_samples > self.max_buffered_samples and self.buffer:
            _, dropped = self.buffer.popleft()
            self.buffered_samples -= len(dropped)
            self.stats.samples_dropped_total += len(dropped)

    def send(self, now_s: float, *, force: bool = False) -> None:
        if not self.buffer or (not force and now_s < self.next_attempt_s):
            return
        batches = list(self.buffer)
        count = sum(len(samples) for _, samples in batches)
        body = build_request(batches, resource_attributes=self.resource_attributes).SerializeToString()
        self.stats.requests_total += 1
        try:
            response = self.client.post(self.url, content=body, headers=self.headers)
            status, retry_after = response.status_code, response.headers.get("Retry-After")
        except httpx.HTTPError as exc:
            status, retry_after = None, None
            self._log.warning("export to %s failed: %s", self.url, exc)
        if status is not None and 200 <= status < 300:
            self._take(len(batches))
            self.stats.samples_sent_total += count
            self.backoff_seconds = _BACKOFF_START_SECONDS
            self.next_attempt_s = now_s
            return
        self.stats.export_failures_total += 1
        if status is not None and status not in _RETRYABLE:
            # A rejected body will be rejected again: drop it rather than block the buffer.
            self._take(len(batches))
            self.stats.samples_dropped_total += count
            hint = (
                " (no OTLP metrics route there: is it an inferpath server? give --server the address "
                "`inferpath up` printed)"
                if status in (404, 405, 501)
                else ""
            )
            self._log.warning("export to %s rejected with HTTP %s; %d samples dropped%s", self.url, status, count, hint)
            return
        wait = retry_after_seconds(retry_after)
        if wait is None:
            wait = self.backoff_seconds
            self.backoff_seconds = min(self.backoff_seconds * 2, _BACKOFF_MAX_SECONDS)
        if status is not None:
            self._log.warning("export to %s: HTTP %s, retrying in %.1f s", self.url, status, wait)
        self.next_attempt_s = now_s + wait

    def _take(self, batches: int) -> None:
        for _ in range(batches):
            _, samples = self.buffer.popleft()
            self.buffered_samples -= len(samples)

    def close(self) -> None:
        if self._owns_client:
            self.client.close()


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (0 … 300), or ``None`` when absent or an HTTP date."""
    if value is None:
        return None
    try:
        return max(0.0, min(float(value), _BACKOFF_MAX_SECONDS * 10))
    except ValueError:
        return None  # an HTTP date: fall back to backoff rather than parse calendars here


def run_agent(
    server_url: str,
    *,
    nvml: bool,
    scrape_targets: Sequence[object],
    interval_seconds: float = 1.0,
    token: str | None = None,
    stop_event: threading.Event | None = None,
    max_buffered_samples: int = 100_000,
    nvml_poller: NvmlPoller | None = None,
    client: httpx.Client | None = None,
    host: str | None = None,
    max_ticks: int | None = None,
) -> AgentStats:
    """Collect and push until ``stop_event`` is set (or ``max_ticks`` ticks); returns the counters.

    ``server_url``: the inferpath server (``http://host:4318``); ``nvml``: poll local GPUs
    (without a driver the poller logs one message and stays off); ``scrape_targets``: see
    :func:`parse_scrape_targets`; ``interval_seconds``: tick period (monotonic clock);
    ``token``: bearer token of the server; ``nvml_poller``: a ready poller (tests pass one
    over a fake NVML); ``client``: an ``httpx.Client`` to send with; ``host``: the
    ``host.name`` resource attribute (default: this machine's name). On stop, one last
    export of what is buffered is attempted. Raises ``ValueError`` for bad arguments only.
    """
    from inferpath.collectors.nvml import NvmlPoller
    from inferpath.collectors.scraper import Scraper

    if interval_seconds <= 0:
        raise ValueError(f"interval_seconds: must be > 0, got {interval_seconds}")
    if not server_url.startswith(("http://", "https://")):
        raise ValueError(f"server_url: expected an http(s) URL, got {server_url!r}")
    targets = parse_scrape_targets(scrape_targets)
    stop_event = stop_event or threading.Event()
    stats = AgentStats()
    host = host or socket.gethostname()
    poller = nvml_poller if nvml_poller is not None else (NvmlPoller.from_system(host=host) if nvml else None)
    scrapers = [(source, Scraper(url, source)) for source, url in targets]
    exporter = _Exporter(
        server_url,
        token=token,
        client=client,
        max_buffered_samples=max_buffered_samples,
        stats=stats,
        resource_attributes={"host.name": host},
    )
    next_tick = time.monotonic()
    try:
        while not stop_event.is_set():
            if poller is not None:
                exporter.add("nvml", _safe(poller.poll))
            for source, scraper in scrapers:
                exporter.add(source, scraper.scrape())  # Scraper.scrape never raises
            stats.ticks_total += 1
            exporter.send(time.monotonic())
            if max_ticks is not None and stats.ticks_total >= max_ticks:
                break
            # Fixed-rate ticks; a slow tick skips ahead instead of piling up.
            next_tick += interval_seconds
            now = time.monotonic()
            if next_tick < now:
                next_tick = now + interval_seconds
            stop_event.wait(next_tick - now)
        exporter.send(time.monotonic(), force=True)
    finally:
        exporter.close()
        for _, scraper in scrapers:
            scraper.close()
        if poller is not None and nvml_poller is None:
            poller.close()
    return stats


def _safe(poll) -> list:
    try:
        return poll()
    except Exception:  # noqa: BLE001 - the poller already never raises; belt and braces
        logger.exception("NVML poll failed")
        return []
