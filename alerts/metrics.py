"""The evaluator's and notifiers' counters as Prometheus metric families (``inferpath_alerts_*``).

Read at scrape time by the server's collector (:mod:`inferpath.server.selfmetrics`); nothing
is updated on the evaluation path beyond the plain integer counters it already keeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["alert_metric_families"]

_NOTIFIER_COUNTERS = (
    ("sent_total", "inferpath_alerts_notifications_sent", "Notifications delivered, per receiver."),
    (
        "failed_total",
        "inferpath_alerts_notifications_failed",
        "Notifications given up after the last attempt or a non-retryable answer, per receiver.",
    ),
    (
        "dropped_total",
        "inferpath_alerts_notifications_dropped",
        "Notification batches dropped because the receiver's queue was full or closed, per receiver.",
    ),
    ("retries_total", "inferpath_alerts_notifications_retries", "Delivery attempts retried, per receiver."),
)


def alert_metric_families(evaluator: Any) -> Iterator[Metric]:
    """Metric families of ``evaluator`` (an :class:`~inferpath.alerts.evaluator.AlertEvaluator`):
    counters ``inferpath_alerts_evaluations_total``, ``…_rule_errors_total``,
    ``…_history_errors_total``; per-receiver (label ``receiver``) counters
    ``inferpath_alerts_notifications_{sent,failed,dropped,retries}_total`` (a notifier without
    a counter, e.g. the log's ``failed_total``, reports none); gauges ``inferpath_alerts_firing``
    and ``inferpath_alerts_pending`` (alerts in that state now)."""
    for name, doc, value in (
        ("inferpath_alerts_evaluations", "Evaluations of the whole rule file.", evaluator.evaluations_total),
        (
            "inferpath_alerts_rule_errors",
            "Rule queries that failed (the rule's alerts kept as they were).",
            evaluator.rule_errors_total,
        ),
        (
            "inferpath_alerts_history_errors",
            "State changes or restores that could not use inferpath_alerts.",
            evaluator.history_errors_total,
        ),
    ):
        yield CounterMetricFamily(name, doc, value=value)
    for attribute, name, doc in _NOTIFIER_COUNTERS:
        family = CounterMetricFamily(name, doc, labels=["receiver"])
        for notifier in evaluator.notifiers:
            value = getattr(notifier, attribute, None)
            if value is not None:
                family.add_metric([str(getattr(notifier, "name", "?"))], value)
        yield family
    # The snapshot is taken under the evaluation lock: the alert maps change during an evaluation.
    snapshot = evaluator.snapshot()
    yield GaugeMetricFamily("inferpath_alerts_firing", "Alerts firing now.", value=len(snapshot["firing"]))
    yield GaugeMetricFamily("inferpath_alerts_pending", "Alerts pending now.", value=len(snapshot["pending"]))
