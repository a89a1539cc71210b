"""Alert state changes in ``inferpath_alerts``: written on every change, read back on start.

Rows are few (state changes, not evaluations), so they are inserted directly rather than
through a batch writer; the evaluator catches and counts a failed insert. The latest row
of each fingerprint is the alert's state: :meth:`AlertHistory.restore` returns the alerts
whose latest row is ``pending`` or ``firing``, with their ``active_at``/``fired_at``, so a
restarted evaluator continues their ``for`` timers and does not notify them again.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from inferpath.alerts.state import AlertInstance, Change

__all__ = ["AlertHistory", "ALERTS_TABLE", "ALERT_COLUMNS"]

ALERTS_TABLE = "inferpath_alerts"
ALERT_COLUMNS: tuple[str, ...] = (
    "timestamp",
    "rule",
    "fingerprint",
    "state",
    "labels",
    "annotations",
    "value",
    "active_at",
    "fired_at",
    "resolved_at",
    "keep_firing_since",
    "evidence",
)
_ROW_STATE = {
    "pending": "pending",
    "firing": "firing",
    "keep_firing": "firing",
    "resolved": "resolved",
    "inactive": "inactive",
}


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


class AlertHistory:
    """Writes ``inferpath_alerts`` through ``store`` (a :class:`~inferpath.storage.store.Store`:
    ``insert``, ``query``) and restores the evaluator from it; the read API reads the changes
    with :meth:`inferpath.storage.reader.Reader.alert_changes`."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def record(self, alert: AlertInstance, change: Change, at: datetime) -> None:
        """Insert one row for ``change`` of ``alert`` at ``at`` (aware). Store errors propagate."""
        value = alert.value
        row = (
            at,
            alert.rule,
            alert.fingerprint,
            _ROW_STATE[change],
            dict(alert.labels),
            dict(alert.annotations),
            value,
            alert.active_at,
            alert.fired_at,
            alert.resolved_at,
            alert.keep_firing_since,
            json.dumps(alert.evidence, default=_json_default, sort_keys=True),
        )
        self.store.insert(ALERTS_TABLE, [row], ALERT_COLUMNS)

    def restore(self) -> list[AlertInstance]:
        """Alerts whose latest row is pending or firing (including a started keep-firing period)."""
        sql = (
            "SELECT rule, labels, state, active_at, fired_at, resolved_at, keep_firing_since, value,"
            " annotations, evidence FROM inferpath_alerts"
            " ORDER BY timestamp DESC LIMIT 1 BY fingerprint"
        )
        alerts = []
        for (
            rule,
            labels,
            state,
            active_at,
            fired_at,
            resolved_at,
            keep_since,
            value,
            notes,
            evidence,
        ) in self.store.query(sql):
            if state not in ("pending", "firing"):
                continue
            try:
                evidence_dict = json.loads(evidence) if evidence else {}
            except ValueError:
                evidence_dict = {}
            alerts.append(
                AlertInstance(
                    rule=rule,
                    labels=dict(labels),
                    state=state,
                    active_at=active_at,
                    fired_at=fired_at,
                    resolved_at=resolved_at,
                    keep_firing_since=keep_since,
                    value=value,
                    annotations=dict(notes),
                    evidence=evidence_dict,
                    # Already notified before the restart: resends (if any) continue from here.
                    last_sent_at=fired_at if state == "firing" else None,
                )
            )
        return alerts
