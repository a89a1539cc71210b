"""Running the evaluator inside the inferpath server (``inferpath up``).

The server owns the store (embedded chDB locks its folder), so the evaluator runs in the
server's process, on the server's :class:`~inferpath.storage.store.Store`, with state
restored from ``inferpath_alerts``.

Which rules: ``settings.alert_rules`` when the settings carry that field, else the
``INFERPATH_ALERT_RULES`` variable: a rule-file path, ``default`` (the shipped pack) or
unset/``off`` (no evaluator).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from inferpath.alerts.evaluator import AlertEvaluator
from inferpath.alerts.history import AlertHistory
from inferpath.alerts.rules import load_rule_file
from inferpath.config import ENV_ALERT_RULES

__all__ = ["ENV_ALERT_RULES", "alert_rules_source", "start_alerts"]

logger = logging.getLogger("inferpath.alerts")

_OFF = {"", "off", "none", "false", "0"}


def alert_rules_source(settings: Any, environ: Mapping[str, str] | None = None) -> str | None:
    """The configured rule source (path or ``default``), or ``None`` when alerts are off."""
    env = os.environ if environ is None else environ
    source = getattr(settings, "alert_rules", None) or env.get(ENV_ALERT_RULES)
    if source is None or str(source).strip().lower() in _OFF:
        return None
    return str(source).strip()


def start_alerts(store: Any, settings: Any, environ: Mapping[str, str] | None = None) -> AlertEvaluator | None:
    """Load the configured rules and start evaluating them on ``store``; ``None`` when off.

    Raises :class:`~inferpath.alerts.rules.RuleFileError` for a bad rule file (a
    configuration error belongs at start-up, naming file, line and field).
    """
    source = alert_rules_source(settings, environ)
    if source is None:
        return None
    rule_file = load_rule_file(source)
    evaluator = AlertEvaluator(rule_file, store, history=AlertHistory(store),
                               generator_url=getattr(settings, "server_url", "") or "")
    evaluator.start()
    logger.info("alerts: evaluating %d rules every %.0f s from %s (%d alerts restored)",
                len(rule_file.rules), rule_file.evaluation_interval, source,
                len(evaluator.firing()) + len(evaluator.pending()))
    return evaluator
