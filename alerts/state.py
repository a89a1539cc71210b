"""Alert instances and their state machine, as Prometheus' alerting rules define it.

States: ``pending`` (condition true for less than ``for``), ``firing``, ``inactive``. A
firing alert whose condition stops is kept firing for ``keep_firing_for`` after the first
evaluation without it, then becomes inactive with ``resolved_at`` set ("resolved"). A
pending alert whose condition stops is dropped without notice. ``for = 0`` fires at the
first active evaluation. Source: Prometheus ``rules/alerting.go`` (``AlertingRule.Eval``).

Everything here is pure: times come in as arguments, so simulated time and replays over
past data use the same code as the live evaluator.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

__all__ = ["AlertInstance", "Change", "fingerprint", "step"]

State = Literal["pending", "firing", "inactive"]
Change = Literal["pending", "firing", "resolved", "inactive", "keep_firing"]
"""What :func:`step` reports: a new pending alert, firing, resolved (was firing), inactive
(pending dropped), keep_firing (grace period of ``keep_firing_for`` started)."""


def fingerprint(labels: Mapping[str, str]) -> str:
    """Stable id of a label set: first 16 hex digits of sha256 over the sorted labels (JSON)."""
    text = json.dumps(sorted(labels.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class AlertInstance:
    """One alert (one rule, one label set) and where it stands.

    Times are timezone-aware UTC. ``active_at``: first evaluation of the current episode with
    the condition true. ``fired_at``: when it started firing. ``resolved_at``: when it
    resolved. ``keep_firing_since``: first evaluation without the condition while firing.
    ``last_sent_at``: last notification handed to the notifiers (in memory only).
    """

    rule: str
    labels: dict[str, str]
    state: State
    active_at: datetime
    fired_at: datetime | None = None
    resolved_at: datetime | None = None
    keep_firing_since: datetime | None = None
    value: float | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    diagnosis: str = ""
    last_sent_at: datetime | None = None

    @property
    def fingerprint(self) -> str:
        """:func:`fingerprint` of :attr:`labels`."""
        return fingerprint(self.labels)


def step(
    alert: AlertInstance | None,
    *,
    active: bool,
    now: datetime,
    for_seconds: float,
    keep_firing_for_seconds: float,
    rule: str,
    labels: Mapping[str, str],
) -> tuple[AlertInstance | None, list[Change]]:
    """Advance one alert by one evaluation at ``now``.

    ``alert``: the instance so far (``None`` or inactive: none). ``active``: the condition
    holds now. Returns the instance afterwards (``None`` when there is none to keep) and the
    changes, in order (a ``for = 0`` alert reports ``["firing"]`` at once).
    """
    changes: list[Change] = []
    if active:
        if alert is None or alert.state == "inactive":
            alert = AlertInstance(rule=rule, labels=dict(labels), state="pending", active_at=now)
            changes.append("pending")
        alert.keep_firing_since = None
        if alert.state == "pending" and now - alert.active_at >= timedelta(seconds=for_seconds):
            alert.state = "firing"
            alert.fired_at = now
            changes = ["firing"]
        return alert, changes
    if alert is None or alert.state == "inactive":
        return None, changes
    if alert.state == "pending":
        alert.state = "inactive"
        return alert, ["inactive"]
    # Firing without the condition: maybe keep firing for a while.
    if keep_firing_for_seconds > 0:
        if alert.keep_firing_since is None:
            alert.keep_firing_since = now
            changes.append("keep_firing")
        if now - alert.keep_firing_since < timedelta(seconds=keep_firing_for_seconds):
            return alert, changes
    alert.state = "inactive"
    alert.resolved_at = now
    return alert, ["resolved"]
