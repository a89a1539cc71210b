"""Notifiers: Alertmanager API v2, a generic JSON webhook, and the log.

Delivery never blocks the evaluator: each HTTP receiver has a bounded queue and one worker
thread that posts with a per-attempt timeout and retries with exponential backoff (connect
errors, timeouts, 429 and 5xx; other 4xx cannot succeed later and are dropped at once).
A full queue or exhausted retries drop the notification and count it. A receiver's URL may
carry a secret (Slack-style paths, tokens in the query, user:password): logs and ``repr``
show only ``scheme://host:port``.

Payloads:

- ``alertmanager``: ``POST {url}/api/v2/alerts`` with a JSON list of
  ``{labels, annotations, startsAt, endsAt, generatorURL}`` (Alertmanager's OpenAPI
  ``postableAlerts``). Firing alerts carry ``endsAt`` ahead of now and are re-sent every
  ``resend_interval`` (Prometheus does the same), resolved ones ``endsAt`` = resolution time.
- ``webhook``: ``POST {url}`` with Alertmanager's webhook-receiver shape
  ``{version, receiver, status, alerts: [{status, labels, annotations, startsAt, endsAt,
  fingerprint, generatorURL}], commonLabels}``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

__all__ = [
    "Notification",
    "Delivery",
    "LogNotifier",
    "build_notifiers",
    "redact_url",
    "alertmanager_payload",
    "webhook_payload",
]

logger = logging.getLogger("inferpath.alerts")

_QUEUE_SIZE = 1000
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


def redact_url(url: str | None) -> str:
    """``scheme://host[:port]`` of ``url`` (path, query and credentials removed), safe to log."""
    if not url:
        return "(none)"
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(unparsable url)"
    shown_host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{shown_host}{port}" + ("/…" if parts.path not in ("", "/") or parts.query else "")


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Notification:
    """One alert as sent: ``status`` firing or resolved; ``starts_at`` = when it fired;
    ``ends_at`` = resolution time (resolved) or ``None`` (firing: each receiver decides)."""

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    ends_at: datetime | None
    fingerprint: str
    generator_url: str = ""
    sent_at: datetime | None = None


def alertmanager_payload(notifications: list[Notification], valid_for_seconds: float) -> list[dict[str, Any]]:
    """Alertmanager ``POST /api/v2/alerts`` body. Firing alerts get ``endsAt`` =
    ``sent_at + valid_for_seconds`` so Alertmanager keeps them until the next resend."""
    from datetime import timedelta

    out = []
    for n in notifications:
        ends_at = n.ends_at
        if n.status == "firing":
            ends_at = (n.sent_at or n.starts_at) + timedelta(seconds=valid_for_seconds)
        out.append(
            {
                "labels": n.labels,
                "annotations": n.annotations,
                "startsAt": _iso(n.starts_at),
                "endsAt": _iso(ends_at),
                "generatorURL": n.generator_url,
            }
        )
    return out


def webhook_payload(notifications: list[Notification], receiver: str) -> dict[str, Any]:
    """Generic webhook body, shaped like Alertmanager's webhook-receiver payload."""
    alerts = [
        {
            "status": n.status,
            "labels": n.labels,
            "annotations": n.annotations,
            "startsAt": _iso(n.starts_at),
            "endsAt": _iso(n.ends_at) or "0001-01-01T00:00:00Z",
            "fingerprint": n.fingerprint,
            "generatorURL": n.generator_url,
        }
        for n in notifications
    ]
    common = dict(notifications[0].labels) if notifications else {}
    for n in notifications[1:]:
        common = {k: v for k, v in common.items() if n.labels.get(k) == v}
    status = "firing" if any(n.status == "firing" for n in notifications) else "resolved"
    return {
        "version": "4",
        "receiver": receiver,
        "status": status,
        "alerts": alerts,
        "groupLabels": {},
        "commonLabels": common,
        "commonAnnotations": {},
    }


class LogNotifier:
    """Writes each notification to the ``inferpath.alerts`` logger (firing: WARNING,
    resolved: INFO). Never raises."""

    kind = "log"
    resend_interval_seconds: float | None = None

    def __init__(self, name: str = "log") -> None:
        self.name = name
        self.sent_total = 0

    def submit(self, notifications: list[Notification]) -> bool:
        for n in notifications:
            level = logging.WARNING if n.status == "firing" else logging.INFO
            logger.log(
                level,
                "alert %s %s %s: %s",
                n.labels.get("alertname", "?"),
                n.status,
                {k: v for k, v in n.labels.items() if k != "alertname"},
                n.annotations.get("summary", ""),
            )
            self.sent_total += 1
        return True

    def close(self, timeout_seconds: float = 5.0) -> None:
        """Nothing to flush."""


class Delivery:
    """An HTTP receiver with its queue and worker thread.

    ``kind``: ``alertmanager`` or ``webhook``. The HTTP call goes straight to an httpx
    transport: httpx's client logs every request URL at INFO, which would print secrets.
    Counters: ``sent_total`` (notifications delivered), ``failed_total`` (dropped after the
    last attempt or a non-retryable answer), ``dropped_total`` (queue full or closed),
    ``attempts_total``, ``retries_total``. :meth:`submit` never blocks and never raises.
    """

    def __init__(
        self,
        *,
        name: str,
        kind: Literal["alertmanager", "webhook"],
        url: str,
        timeout_seconds: float = 5.0,
        max_attempts: int = 5,
        backoff_initial_seconds: float = 0.5,
        backoff_max_seconds: float = 30.0,
        resend_interval_seconds: float = 60.0,
        headers: dict[str, str] | None = None,
        queue_size: int = _QUEUE_SIZE,
    ) -> None:
        self.name = name
        self.kind = kind
        self._url = url.rstrip("/") + "/api/v2/alerts" if kind == "alertmanager" else url
        self._headers = dict(headers or {})
        self.timeout_seconds = timeout_seconds
        self.max_attempts = max_attempts
        self.backoff_initial_seconds = backoff_initial_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.resend_interval_seconds: float | None = resend_interval_seconds if kind == "alertmanager" else None
        self.sent_total = 0
        self.failed_total = 0
        self.dropped_total = 0
        self.attempts_total = 0
        self.retries_total = 0
        self.backoff_delays_seconds: list[float] = []  # most recent 100, to see the backoff
        self._queue: queue.Queue[list[Notification]] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._transport = httpx.HTTPTransport(retries=0)
        self._thread = threading.Thread(target=self._run, name=f"inferpath-alerts-{name}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"Delivery(name={self.name!r}, kind={self.kind!r}, url={redact_url(self._url)!r})"

    def submit(self, notifications: list[Notification]) -> bool:
        """Queue one batch; False (and counted) when the queue is full or delivery closed."""
        if not notifications:
            return True
        if self._stop.is_set():
            self.dropped_total += len(notifications)
            return False
        try:
            self._queue.put_nowait(list(notifications))
        except queue.Full:
            self.dropped_total += len(notifications)
            logger.warning(
                "alert receiver %s (%s): queue full, %d notifications dropped",
                self.name,
                redact_url(self._url),
                len(notifications),
            )
            return False
        return True

    def _body(self, batch: list[Notification]) -> Any:
        if self.kind == "alertmanager":
            return alertmanager_payload(batch, 4 * (self.resend_interval_seconds or 60.0))
        return webhook_payload(batch, self.name)

    def _attempt(self, batch: list[Notification]) -> Literal["ok", "retry", "fail"]:
        self.attempts_total += 1
        request = httpx.Request(
            "POST",
            self._url,
            json=self._body(batch),
            headers=self._headers,
            extensions={"timeout": httpx.Timeout(self.timeout_seconds).as_dict()},
        )
        try:
            response = self._transport.handle_request(request)
            try:
                response.read()
            finally:
                response.close()
        except httpx.HTTPError as exc:
            # The exception text may hold the URL; log its class only.
            logger.info("alert receiver %s (%s): %s", self.name, redact_url(self._url), type(exc).__name__)
            return "retry"
        if 200 <= response.status_code < 300:
            return "ok"
        logger.info("alert receiver %s (%s): HTTP %d", self.name, redact_url(self._url), response.status_code)
        return "retry" if response.status_code in _RETRY_STATUS else "fail"

    def _deliver(self, batch: list[Notification]) -> None:
        delay = self.backoff_initial_seconds
        for attempt in range(1, self.max_attempts + 1):
            outcome = self._attempt(batch)
            if outcome == "ok":
                self.sent_total += len(batch)
                return
            if outcome == "fail" or attempt == self.max_attempts:
                break
            self.retries_total += 1
            self.backoff_delays_seconds = (self.backoff_delays_seconds + [delay])[-100:]
            if self._stop.wait(delay):
                break
            delay = min(delay * 2, self.backoff_max_seconds)
        self.failed_total += len(batch)
        logger.warning(
            "alert receiver %s (%s): %d notifications dropped after %d attempts",
            self.name,
            redact_url(self._url),
            len(batch),
            attempt,
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                self._deliver(batch)
            except Exception:  # noqa: BLE001 - the worker must survive any receiver
                self.failed_total += len(batch)
                logger.exception("alert receiver %s: delivery failed", self.name)
            finally:
                self._queue.task_done()

    def flush(self, timeout_seconds: float = 10.0) -> bool:
        """Wait until the queue is empty and the current batch is done; False on timeout."""
        deadline = time.monotonic() + timeout_seconds
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout_seconds: float = 5.0) -> None:
        """Try to deliver what is queued within ``timeout_seconds``, then stop the worker."""
        self.flush(timeout_seconds)
        self._stop.set()
        self._thread.join(timeout_seconds)
        self._transport.close()


Notifier = Any  # LogNotifier | Delivery: submit(list[Notification]) -> bool, close(), name, kind


def build_notifiers(receivers: list[Any], factory: Callable[..., Delivery] = Delivery) -> list[Notifier]:
    """One notifier per :class:`~inferpath.alerts.rules.Receiver`; a log notifier when none."""
    out: list[Notifier] = []
    for receiver in receivers:
        if receiver.type == "log":
            out.append(LogNotifier(receiver.name))
        else:
            out.append(
                factory(
                    name=receiver.name,
                    kind=receiver.type,
                    url=receiver.url,
                    timeout_seconds=receiver.timeout,
                    max_attempts=receiver.max_attempts,
                    backoff_initial_seconds=receiver.backoff_initial,
                    backoff_max_seconds=receiver.backoff_max,
                    resend_interval_seconds=receiver.resend_interval,
                    headers=receiver.headers,
                )
            )
    return out or [LogNotifier()]
