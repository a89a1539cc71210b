"""The alerts service the server runs (``inferpath up``), through the server's interface.

The server owns the store (embedded chDB locks its folder), so the evaluator runs in the
server's process, on the server's :class:`~inferpath.storage.store.Store`, with state
restored from ``inferpath_alerts``. The server does not import this module: the composition
that starts it (``inferpath/serve.py``) builds an :class:`AlertService` and registers it,
and the server knows it as an :class:`~inferpath.server.services.AlertsService`: started and
stopped with the server, its counters on ``/metrics``, its state and back-tests on the read
API (``GET /api/v1/alerts``, ``POST /api/v1/alerts/backtest``, which ``inferpath alerts
test`` uses).

Which rules: ``settings.alert_rules``: a rule-file path, ``default`` (the shipped pack) or
unset/``off`` (no evaluator; back-tests still answer).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from inferpath.alerts.evaluator import AlertEvaluator, backtest
from inferpath.alerts.history import AlertHistory
from inferpath.alerts.metrics import alert_metric_families
from inferpath.alerts.rules import RuleFile, load_rule_file, parse_rule_text

__all__ = ["AlertService", "MAX_REPLAY_EVALUATIONS", "MAX_REPLAY_SECONDS", "alert_rules_source", "replay_evaluations"]

logger = logging.getLogger("inferpath.alerts")

_OFF = {"", "off", "none", "false", "0"}
# A replay evaluates every rule once per step; each evaluation reads the store (tens of ms).
MAX_REPLAY_EVALUATIONS = 20_000
MAX_REPLAY_SECONDS = 3650 * 86_400  # the longest retention a table can have (ttl_days)


def alert_rules_source(settings: Any) -> str | None:
    """The configured rule source of ``settings.alert_rules`` (a path or ``default``), or
    ``None`` when alerts are off (unset, ``off``, ``none``, ``false``, ``0``)."""
    source = getattr(settings, "alert_rules", None)
    if source is None or str(source).strip().lower() in _OFF:
        return None
    return str(source).strip()


def replay_evaluations(window_seconds: float, step_seconds: float) -> int:
    """Evaluations a replay of ``window_seconds`` every ``step_seconds`` runs. Raises
    ``ValueError`` saying so when it is more than :data:`MAX_REPLAY_EVALUATIONS` or the window
    is longer than :data:`MAX_REPLAY_SECONDS`, or either is not a positive number."""
    if not (window_seconds > 0 and step_seconds > 0 and math.isfinite(window_seconds) and math.isfinite(step_seconds)):
        raise ValueError(f"window and step must be positive seconds, got {window_seconds!r} and {step_seconds!r}")
    evaluations = math.ceil(window_seconds / step_seconds)
    if window_seconds > MAX_REPLAY_SECONDS or evaluations > MAX_REPLAY_EVALUATIONS:
        raise ValueError(
            f"{evaluations} evaluations over {window_seconds / 86_400:g} days; at most "
            f"{MAX_REPLAY_EVALUATIONS} over {MAX_REPLAY_SECONDS // 86_400} days (the store's longest "
            "retention)"
        )
    return evaluations


class AlertService:
    """The alert evaluator as a server service (``name`` ``"alerts"``).

    ``rule_file``: the rules to evaluate (``None``: none; back-tests still answer);
    ``source``: where they came from (for the log). Build it with :meth:`from_settings`.
    """

    name = "alerts"

    def __init__(self, rule_file: RuleFile | None = None, source: str | None = None) -> None:
        self.rule_file = rule_file
        self.source = source
        self.evaluator: AlertEvaluator | None = None
        self._store: Any = None

    @classmethod
    def from_settings(cls, settings: Any) -> AlertService:
        """The service for ``settings.alert_rules`` (see :func:`alert_rules_source`).

        Raises :class:`~inferpath.alerts.rules.RuleFileError` for a bad rule file (a
        configuration error belongs at start-up, naming file, line and field).
        """
        source = alert_rules_source(settings)
        return cls(load_rule_file(source) if source is not None else None, source)

    def start(self, store: Any, settings: Any) -> None:
        """Start evaluating the rules on ``store`` (alerts restored from ``inferpath_alerts``);
        with no rules, only remember the store for back-tests."""
        self._store = store
        if self.rule_file is None:
            return
        self.evaluator = AlertEvaluator(
            self.rule_file, store, history=AlertHistory(store), generator_url=getattr(settings, "server_url", "") or ""
        )
        self.evaluator.start()
        logger.info(
            "alerts: evaluating %d rules every %.0f s from %s (%d alerts restored)",
            len(self.rule_file.rules),
            self.rule_file.evaluation_interval,
            self.source,
            len(self.evaluator.firing()) + len(self.evaluator.pending()),
        )

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Stop the evaluator (its notifiers deliver what they hold first)."""
        if self.evaluator is not None:
            self.evaluator.stop(timeout_seconds)

    def metric_families(self) -> Iterable[Any]:
        """``inferpath_alerts_*`` families of the evaluator (:mod:`inferpath.alerts.metrics`);
        none without rules."""
        return alert_metric_families(self.evaluator) if self.evaluator is not None else ()

    def snapshot(self) -> dict[str, Any] | None:
        """:meth:`AlertEvaluator.snapshot`, or ``None`` when no rules are evaluated."""
        return self.evaluator.snapshot() if self.evaluator is not None else None

    def backtest(
        self, rules_text: str, source: str, start: datetime, end: datetime, step_seconds: float | None
    ) -> list[dict[str, Any]]:
        """The transitions the rules of ``rules_text`` would have made over ``[start, end)``
        (:func:`~inferpath.alerts.evaluator.backtest`), as dicts ``{"at", "rule", "labels",
        "change", "value", "reason"}``. Raises ``ValueError``
        (:class:`~inferpath.alerts.rules.RuleFileError` naming ``source``, line and field) for
        an invalid file, and for a replay over :data:`MAX_REPLAY_EVALUATIONS`; ``RuntimeError``
        before :meth:`start`."""
        if self._store is None:
            raise RuntimeError("the alerts service is not started")
        rule_file = parse_rule_text(rules_text, source)
        replay_evaluations((end - start).total_seconds(), step_seconds or rule_file.evaluation_interval)
        return [
            {"at": t.at, "rule": t.rule, "labels": t.labels, "change": t.change, "value": t.value, "reason": t.reason}
            for t in backtest(rule_file, self._store, start, end, step_seconds)
        ]
