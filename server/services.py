"""Services the server runs beside its own loops, known to it only through these interfaces.

The server does not import the parts it runs for others. Whoever starts it (``inferpath up``,
``python -m inferpath.serve``: the composition in ``inferpath/serve.py``) builds the services
and hands them to :class:`~inferpath.server.runtime.ServerRuntime`, which starts them after
its own loops (the store open and migrated), stops them before it closes the store, and
reports their metrics on ``/metrics``. The alert evaluator (``inferpath/alerts/service.py``)
is one: registered under :data:`ALERTS`, it also answers the read API's ``/alerts`` routes
through :class:`AlertsService`.

Errors: ``start`` may raise (a configuration error belongs at start-up: the server then does
not start); ``stop`` and ``metric_families`` must not.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from prometheus_client.core import Metric

    from inferpath.config import Settings
    from inferpath.storage.store import Store

__all__ = ["ALERTS", "AlertsService", "BackgroundService"]

ALERTS = "alerts"
"""The name the alerts service registers under; the read API's ``/alerts`` routes ask for it."""


@runtime_checkable
class BackgroundService(Protocol):
    """A part the server runs: ``name`` (unique per server), ``start`` once on the server's
    store and settings, ``stop`` once (bounded by ``timeout_seconds``), and
    ``metric_families`` read at every scrape of ``/metrics`` (cheap, never raising)."""

    name: str

    def start(self, store: Store, settings: Settings) -> None: ...

    def stop(self, timeout_seconds: float) -> None: ...

    def metric_families(self) -> Iterable[Metric]: ...


@runtime_checkable
class AlertsService(BackgroundService, Protocol):
    """What the read API needs of the alerts service.

    ``snapshot()``: the alerts firing and pending now and the rules' last outcome (a JSON-able
    dict), or ``None`` when no rules are evaluated. ``backtest(rules_text, source, start,
    end, step_seconds)``: what the rules of the YAML ``rules_text`` (``source`` names it in
    errors) would have done over ``[start, end)`` (aware datetimes) on the server's store,
    evaluated every ``step_seconds`` (``None``: the file's interval); a list of transitions
    ``{"at", "rule", "labels", "change", "value", "reason"}``, oldest first. Raises
    ``ValueError`` naming the problem for an invalid rule file or a replay too long to run.
    """

    def snapshot(self) -> dict[str, Any] | None: ...

    def backtest(
        self, rules_text: str, source: str, start: datetime, end: datetime, step_seconds: float | None
    ) -> list[dict[str, Any]]: ...
