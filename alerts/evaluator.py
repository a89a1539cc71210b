"""The alert evaluator: every ``evaluation_interval`` run each rule's query, advance each
alert's state (:mod:`inferpath.alerts.state`), record changes, hand notifications over.

One evaluation at time ``now`` queries ``[now - query_offset - window, now - query_offset)``.
Labels of an alert: the rule's split-by labels, ``endpoint_class`` when the rule selects one,
the rule's ``labels`` and ``alertname`` (the rule name), later ones winning, as in
Prometheus. Annotations are rendered at every evaluation from the evidence; ``{{ diagnosis }}``
is computed once, when the alert starts firing (it reads two windows of rows).

A rule whose query fails keeps its alerts as they are (Prometheus does the same) and is
reported with ``health="err"``. A failed history insert or a receiver that is down never
stops the evaluation: the first is counted, the second retried by the notifier's own thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from inferpath.alerts.history import AlertHistory
from inferpath.alerts.notifiers import Notification, build_notifiers
from inferpath.alerts.queries import Sample, evaluate_rule
from inferpath.alerts.rules import RuleFile
from inferpath.alerts.state import AlertInstance, Change, fingerprint, step
from inferpath.alerts.templates import render, uses_diagnosis
from inferpath.storage.periodic import PeriodicPasses

__all__ = ["AlertEvaluator", "RuleStatus", "Transition", "backtest"]

logger = logging.getLogger("inferpath.alerts")


@dataclass
class Transition:
    """A state change of one alert at evaluation time ``at`` (aware UTC): ``value`` and
    ``reason`` of that evaluation (for an alert that went inactive or resolved, the value that
    ended it)."""

    at: datetime
    rule: str
    labels: dict[str, str]
    change: Change
    value: float | None
    reason: str


@dataclass
class RuleStatus:
    """The outcome of one rule in one evaluation: ``health`` ``ok`` or ``err`` (``error`` says
    why), its :class:`~inferpath.alerts.queries.Sample` list, ``duration_seconds``."""

    rule: str
    health: str
    samples: list[Sample] = field(default_factory=list)
    error: str = ""
    duration_seconds: float = 0.0


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class AlertEvaluator(PeriodicPasses):
    """Evaluates ``rule_file`` against ``store`` (``query``/``insert``/``query_dicts``).

    ``notifiers``: objects with ``submit(list[Notification]) -> bool`` and ``close()``
    (default: built from the file's receivers; ``[]`` for none). ``history``: records
    changes and restores state (``None``: neither, e.g. for back-tests). ``clock``: returns
    the aware current time (tests pass simulated time). ``generator_url``: put into
    notifications. ``diagnose``: compute ``{{ diagnosis }}`` (False in back-tests).
    Counters: ``evaluations_total``, ``rule_errors_total``, ``history_errors_total``.
    """

    thread_name = "inferpath-alerts"
    failure_message = "alerts: evaluation failed"
    first_pass_at_start = True

    def __init__(
        self,
        rule_file: RuleFile,
        store: Any,
        *,
        notifiers: list[Any] | None = None,
        history: AlertHistory | None = None,
        clock: Callable[[], datetime] = _utc_now,
        generator_url: str = "",
        diagnose: bool = True,
    ) -> None:
        super().__init__(rule_file.evaluation_interval)
        self.rule_file = rule_file
        self.store = store
        self.notifiers = build_notifiers(rule_file.receivers) if notifiers is None else list(notifiers)
        self.history = history
        self.clock = clock
        self._grid_origin: datetime | None = None
        self._last_tick = -1
        self.generator_url = generator_url
        self.diagnose = diagnose
        # Only Alertmanager receivers want resends (else they resolve alerts on their own).
        intervals = [
            n.resend_interval_seconds for n in self.notifiers if getattr(n, "resend_interval_seconds", None) is not None
        ]
        self._resend_seconds: float | None = min(intervals) if intervals else None
        self.alerts: dict[str, dict[str, AlertInstance]] = {rule.name: {} for rule in rule_file.rules}
        self.last_statuses: list[RuleStatus] = []
        self.evaluations_total = 0
        self.rule_errors_total = 0
        self.history_errors_total = 0
        self._lock = threading.Lock()
        if history is not None:
            self.restore()

    # ------------------------------------------------------------------ state
    def restore(self) -> int:
        """Load pending and firing alerts from the history; returns how many were restored.

        Alerts of rules no longer in the file are forgotten. A failure is logged and counted;
        evaluation then starts from no alerts.
        """
        if self.history is None:
            return 0
        try:
            restored = self.history.restore()
        except Exception as exc:  # noqa: BLE001 - a store hiccup must not stop the server
            self.history_errors_total += 1
            logger.warning("alerts: could not restore state: %s", exc)
            return 0
        count = 0
        for alert in restored:
            if alert.rule in self.alerts:
                self.alerts[alert.rule][alert.fingerprint] = alert
                count += 1
        return count

    def firing(self) -> list[AlertInstance]:
        """Alerts firing now (keep-firing included)."""
        return [a for alerts in self.alerts.values() for a in alerts.values() if a.state == "firing"]

    def pending(self) -> list[AlertInstance]:
        """Alerts pending now."""
        return [a for alerts in self.alerts.values() for a in alerts.values() if a.state == "pending"]

    def snapshot(self) -> dict[str, Any]:
        """What the evaluator holds now, JSON-ready (times ISO strings via the caller's encoder):
        ``{"evaluation_interval_seconds", "query_offset_seconds", "evaluations_total",
        "firing": [alert], "pending": [alert], "rules": [status]}``; an alert is
        ``{rule, state, labels, annotations, value, active_at, fired_at, keep_firing_since}``,
        a rule status ``{rule, health, error, duration_seconds, samples: [{labels, value,
        active, confidence, reason}]}``. Taken under the evaluation lock, so it waits for a
        running evaluation rather than read a half-updated state.
        """
        with self._lock:
            alerts = [a for by_fp in self.alerts.values() for a in by_fp.values()]
            statuses = list(self.last_statuses)
            evaluations = self.evaluations_total

        def alert_row(a: AlertInstance) -> dict[str, Any]:
            return {
                "rule": a.rule,
                "state": a.state,
                "labels": dict(a.labels),
                "annotations": dict(a.annotations),
                "value": a.value,
                "active_at": a.active_at,
                "fired_at": a.fired_at,
                "keep_firing_since": a.keep_firing_since,
            }

        return {
            "evaluation_interval_seconds": self.rule_file.evaluation_interval,
            "query_offset_seconds": self.rule_file.query_offset,
            "evaluations_total": evaluations,
            "firing": [alert_row(a) for a in alerts if a.state == "firing"],
            "pending": [alert_row(a) for a in alerts if a.state == "pending"],
            "rules": [
                {
                    "rule": s.rule,
                    "health": s.health,
                    "error": s.error,
                    "duration_seconds": s.duration_seconds,
                    "samples": [
                        {
                            "labels": dict(x.labels),
                            "value": x.value,
                            "active": x.active,
                            "confidence": x.confidence,
                            "reason": x.reason,
                        }
                        for x in s.samples
                    ],
                }
                for s in statuses
            ],
        }

    # ------------------------------------------------------------------ evaluation
    def evaluate_once(self, now: datetime | None = None) -> list[Transition]:
        """Evaluate every rule at ``now`` (default: the clock); return the transitions.

        Statuses of the rules are left in :attr:`last_statuses`. Never raises for a rule's
        query error, a history error or a receiver problem.
        """
        with self._lock:
            now = self.clock() if now is None else now
            at = now - timedelta(seconds=self.rule_file.query_offset)
            transitions: list[Transition] = []
            outgoing: list[tuple[Notification, bool]] = []  # (notification, is_resend)
            statuses = []
            for rule in self.rule_file.rules:
                started = time.perf_counter()
                try:
                    samples = evaluate_rule(self.store, rule, at)
                except Exception as exc:  # noqa: BLE001 - one bad rule must not stop the others
                    self.rule_errors_total += 1
                    logger.warning("alerts: rule %s failed: %s", rule.name, exc)
                    statuses.append(
                        RuleStatus(rule.name, "err", error=str(exc), duration_seconds=time.perf_counter() - started)
                    )
                    continue
                statuses.append(RuleStatus(rule.name, "ok", samples, duration_seconds=time.perf_counter() - started))
                self._advance(rule, samples, now, at, transitions, outgoing)
            self.last_statuses = statuses
            self.evaluations_total += 1
            self._notify(outgoing)
            return transitions

    def _labels(self, rule: Any, sample: Sample) -> dict[str, str]:
        labels = dict(sample.labels)
        if rule.endpoint_class is not None:
            labels["endpoint_class"] = rule.endpoint_class
        labels.update(rule.labels)
        labels["alertname"] = rule.name
        return labels

    def _advance(
        self,
        rule: Any,
        samples: list[Sample],
        now: datetime,
        at: datetime,
        transitions: list[Transition],
        outgoing: list[tuple[Notification, bool]],
    ) -> None:
        alerts = self.alerts[rule.name]
        seen: set[str] = set()
        by_fingerprint: dict[str, tuple[dict[str, str], Sample | None]] = {}
        for sample in samples:
            labels = self._labels(rule, sample)
            key = fingerprint(labels)
            by_fingerprint[key] = (labels, sample)
            if sample.active:
                seen.add(key)
        for key in list(seen) + [k for k in alerts if k not in seen]:
            labels, found = by_fingerprint.get(key, (alerts[key].labels if key in alerts else {}, None))
            alert, changes = step(
                alerts.get(key),
                active=key in seen,
                now=now,
                for_seconds=rule.for_,
                keep_firing_for_seconds=rule.keep_firing_for,
                rule=rule.name,
                labels=labels,
            )
            if alert is None:
                continue
            if found is not None and key in seen:
                alert.value, alert.evidence = found.value, dict(found.evidence)
            if "firing" in changes and self.diagnose and uses_diagnosis(rule.annotations):
                alert.diagnosis = self._diagnosis(rule, at)
            reason = found.reason if found is not None else "condition no longer holds"
            alert.annotations = {
                name: render(
                    text,
                    value=alert.value,
                    labels=alert.labels,
                    evidence=alert.evidence,
                    reason=reason,
                    diagnosis=alert.diagnosis or "computed when the alert fires",
                )
                for name, text in rule.annotations.items()
            }
            for change in changes:
                # An alert that stops reports the value that stopped it, beside its reason.
                value = found.value if found is not None and change in ("inactive", "resolved") else alert.value
                transitions.append(Transition(now, rule.name, dict(alert.labels), change, value, reason))
                self._record(alert, change, now)
                if change == "firing":
                    outgoing.append((self._notification(alert, "firing", now), False))
                    alert.last_sent_at = now
                elif change == "resolved":
                    outgoing.append((self._notification(alert, "resolved", now), False))
            if alert.state == "inactive":
                alerts.pop(key, None)
                continue
            alerts[key] = alert
            if (
                alert.state == "firing"
                and not changes
                and self._resend_seconds is not None
                and (alert.last_sent_at is None or (now - alert.last_sent_at).total_seconds() >= self._resend_seconds)
            ):
                outgoing.append((self._notification(alert, "firing", now), True))
                alert.last_sent_at = now

    def _diagnosis(self, rule: Any, at: datetime) -> str:
        try:
            from inferpath.analysis import diagnose

            window = timedelta(seconds=rule.window)
            verdict = diagnose(
                self.store,
                window_start=at - window,
                window_end=at,
                baseline_start=at - 2 * window,
                baseline_end=at - window,
            )
            return verdict.summary
        except Exception as exc:  # noqa: BLE001 - no diagnosis is no reason to withhold an alert
            return f"no diagnosis ({exc})"

    def _record(self, alert: AlertInstance, change: Change, now: datetime) -> None:
        if self.history is None:
            return
        try:
            self.history.record(alert, change, now)
        except Exception as exc:  # noqa: BLE001 - state in memory stays right; counted
            self.history_errors_total += 1
            logger.warning("alerts: could not record %s of %s: %s", change, alert.rule, exc)

    def _notification(self, alert: AlertInstance, status: Literal["firing", "resolved"], now: datetime) -> Notification:
        return Notification(
            status=status,
            labels=dict(alert.labels),
            annotations=dict(alert.annotations),
            starts_at=alert.fired_at or alert.active_at,
            ends_at=alert.resolved_at if status == "resolved" else None,
            fingerprint=alert.fingerprint,
            generator_url=self.generator_url,
            sent_at=now,
        )

    def _notify(self, outgoing: list[tuple[Notification, bool]]) -> None:
        for notifier in self.notifiers:
            wants_resends = getattr(notifier, "resend_interval_seconds", None) is not None
            batch = [n for n, is_resend in outgoing if wants_resends or not is_resend]
            if batch:
                notifier.submit(batch)

    # ------------------------------------------------------------------ loop
    def run_pass(self) -> None:
        """One evaluation (the thread runs one every ``evaluation_interval``, from its start),
        stamped with its tick on the evaluation grid: the first pass's time plus whole
        intervals, as Prometheus stamps rule evaluations. Stamped with the clock instead, a
        pass that started 3 ms earlier in its tick than the one that went pending measured
        ``for`` = 2 intervals as 1.997 s and fired one interval late."""
        now = self.clock()
        if self._grid_origin is None:
            self._grid_origin = now
        interval = self.rule_file.evaluation_interval
        tick = max(round((now - self._grid_origin).total_seconds() / interval), self._last_tick + 1)
        self._last_tick = tick
        self.evaluate_once(self._grid_origin + timedelta(seconds=tick * interval))

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Stop the loop, then let each notifier deliver what it holds (bounded) and close."""
        super().stop(timeout_seconds)
        for notifier in self.notifiers:
            try:
                notifier.close(timeout_seconds)
            except Exception:  # noqa: BLE001
                logger.exception("alerts: closing a notifier failed")


def backtest(
    rule_file: RuleFile, store: Any, start: datetime, end: datetime, step_seconds: float | None = None
) -> list[Transition]:
    """What the rules would have done over ``[start, end)``: evaluate every ``step_seconds``
    (default: the file's ``evaluation_interval``) in simulated time, with no notifiers, no
    history and no diagnosis. Returns the transitions in order."""
    interval = timedelta(seconds=step_seconds or rule_file.evaluation_interval)
    evaluator = AlertEvaluator(rule_file, store, notifiers=[], history=None, diagnose=False)
    transitions: list[Transition] = []
    now = start
    while now < end:
        transitions.extend(evaluator.evaluate_once(now))
        now += interval
    return transitions
