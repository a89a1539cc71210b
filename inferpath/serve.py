"""The server with the services it runs for others: the one place that wires them in.

The server (:mod:`inferpath.server`) runs background services through an interface it
declares (:mod:`inferpath.server.services`) and imports none of them; this module builds
them (today the alert evaluator, :class:`inferpath.alerts.service.AlertService`) for every
command that starts a server: ``inferpath up``, ``python -m inferpath.serve`` (what the demo
and its scenarios run as their server process) and the server a command starts for itself
over ``--store`` (``inferpath diagnose``, ``inferpath alerts test``).

``python -m inferpath.serve [--host H] [--port P] [--store URL] [--scrape SOURCE=URL ...]``
takes the flags of ``python -m inferpath.server`` (the server alone) and evaluates the alert
rules of ``INFERPATH_ALERT_RULES``.
"""

from __future__ import annotations

import sys
from typing import Any

from inferpath.alerts.service import AlertService
from inferpath.server.__main__ import main as server_main
from inferpath.server.services import BackgroundService

__all__ = ["main", "server_services"]


def server_services(settings: Any, *, evaluate_rules: bool = True) -> list[BackgroundService]:
    """The services a server over ``settings`` runs: the alerts service, evaluating the rules
    of ``settings.alert_rules``, or with ``evaluate_rules=False`` none of them (it then only
    answers back-tests: a server a command starts for itself must not notify anyone).

    Raises :class:`~inferpath.alerts.rules.RuleFileError` for a bad rule file, naming file,
    line and field.
    """
    return [AlertService.from_settings(settings) if evaluate_rules else AlertService()]


def main(argv: list[str] | None = None) -> int:
    """``python -m inferpath.serve``: :func:`inferpath.server.__main__.main` with
    :func:`server_services`; exit codes as there (2 also for an invalid rule file)."""
    return server_main(argv, services_for=server_services, prog="python -m inferpath.serve")


if __name__ == "__main__":
    sys.exit(main())
