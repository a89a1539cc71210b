"""Case 3 (batch-window divergence end to end with a real Alertmanager-API receiver), restart
without re-notifying or forgetting, and case 6 (receiver down: retries, nothing blocks).

Case 3 emulates the batch-window fault with stored request rows in simulated time
(:func:`alert_scenarios.batch_window_traffic`) rather than a live ``demo/scenarios.py`` run,
so that ``for`` and the evaluation interval can be checked to the second in a few seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import uvicorn
from alert_receiver import Captured, receiver_app
from alert_scenarios import FAULT_END, FAULT_START, T0, batch_window_traffic, insert_requests, simulate

from inferpath.alerts.evaluator import AlertEvaluator
from inferpath.alerts.history import AlertHistory
from inferpath.alerts.notifiers import Delivery, redact_url
from inferpath.alerts.rules import parse_rule_text
from inferpath.demo.processes import free_port as _free_port
from inferpath.storage.reader import Reader

INTERVAL_SECONDS = 15
FOR_SECONDS = 60


def _rules(receiver_url: str, extra: str = "") -> object:
    return parse_rule_text(f"""
evaluation_interval: {INTERVAL_SECONDS}s
receivers:
  - name: am
    type: alertmanager
    url: {receiver_url}
    resend_interval: 30m
    backoff_initial: 50ms
{extra}
rules:
  - name: TTFTTailDivergence
    kind: tail_divergence
    endpoint_class: interactive
    measure: ttft
    ratio_threshold: 4
    min_samples: 100
    window: 1m
    for: {FOR_SECONDS}s
    labels: {{severity: page}}
    annotations:
      summary: "TTFT p99 {{{{ evidence.quantile_seconds | ms }}}} is {{{{ value }}}}x the mean
        {{{{ evidence.mean_seconds | ms }}}}"
      description: "{{{{ diagnosis }}}}"
""")


def _wait_for(predicate, timeout_seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_case3_batch_window_pending_firing_resolved_one_notification_each(store, receiver) -> None:
    url, captured = receiver
    insert_requests(store, batch_window_traffic())
    rules = _rules(url)
    evaluator = AlertEvaluator(rules, store, history=AlertHistory(store), generator_url="http://inferpath:4318")
    try:
        transitions = simulate(evaluator, T0, 12 * 60, INTERVAL_SECONDS)
        (delivery,) = evaluator.notifiers
        assert delivery.flush(10.0)
    finally:
        evaluator.stop()
    changes = [(t.change, t.at) for t in transitions]
    assert [c for c, _ in changes] == ["pending", "firing", "resolved"], changes
    pending_at, firing_at, resolved_at = (at for _, at in changes)
    assert FAULT_START <= pending_at <= FAULT_START + timedelta(seconds=2 * INTERVAL_SECONDS)
    assert firing_at - pending_at == timedelta(seconds=FOR_SECONDS)
    assert firing_at - FAULT_START <= timedelta(seconds=FOR_SECONDS + 2 * INTERVAL_SECONDS)
    assert FAULT_END < resolved_at <= FAULT_END + timedelta(minutes=1, seconds=INTERVAL_SECONDS)

    posts = captured.bodies("/api/v2/alerts")
    assert len(posts) == 2, posts  # one firing, one resolution; not one per evaluation
    (firing,), (resolved,) = posts
    assert firing["labels"] == {"alertname": "TTFTTailDivergence", "endpoint_class": "interactive", "severity": "page"}
    assert firing["startsAt"] == firing_at.isoformat().replace("+00:00", "Z")
    assert firing["endsAt"] > firing["startsAt"]  # ahead of now, until the next resend
    assert firing["generatorURL"] == "http://inferpath:4318"
    assert "x the mean" in firing["annotations"]["summary"] and "ms" in firing["annotations"]["summary"]
    assert firing["annotations"]["description"]  # the diagnosis, or why there is none
    assert resolved["endsAt"] == resolved_at.isoformat().replace("+00:00", "Z")
    assert resolved["labels"] == firing["labels"]

    history = Reader(store).alert_changes(T0, T0 + timedelta(hours=1))
    assert [row["state"] for row in history] == ["pending", "firing", "resolved"]
    assert all(row["labels"]["alertname"] == "TTFTTailDivergence" for row in history)


def test_restart_neither_renotifies_nor_forgets(store, receiver) -> None:
    url, captured = receiver
    insert_requests(store, batch_window_traffic())
    rules = _rules(url)
    # First life: pending and firing, then the process stops mid-incident.
    first = AlertEvaluator(rules, store, history=AlertHistory(store), diagnose=False)
    simulate(first, T0, 4 * 60, INTERVAL_SECONDS)
    assert [a.state for a in first.firing()] == ["firing"]
    fired_at = first.firing()[0].fired_at
    first.stop()
    assert len(captured.bodies("/api/v2/alerts")) == 1
    # Second life on the same store: the alert is still firing, with its original fired_at.
    second = AlertEvaluator(rules, store, history=AlertHistory(store), diagnose=False)
    try:
        assert [(a.state, a.fired_at) for a in second.firing()] == [("firing", fired_at)]
        transitions = simulate(second, T0 + timedelta(minutes=4), 8 * 60, INTERVAL_SECONDS)
        assert [t.change for t in transitions] == ["resolved"]
        assert second.notifiers[0].flush(10.0)
    finally:
        second.stop()
    posts = captured.bodies("/api/v2/alerts")
    assert len(posts) == 2  # the firing one from the first life and the resolution; no re-notify
    assert posts[0][0]["startsAt"] == posts[1][0]["startsAt"]  # the same episode
    assert posts[1][0]["endsAt"] == transitions[0].at.isoformat().replace("+00:00", "Z")


def test_restart_keeps_the_for_timer_of_a_pending_alert(store) -> None:
    insert_requests(store, batch_window_traffic())
    rules = _rules("http://127.0.0.1:9")  # never reached: no alert fires while we look
    first = AlertEvaluator(rules, store, notifiers=[], history=AlertHistory(store), diagnose=False)
    transitions = simulate(first, T0, 165, INTERVAL_SECONDS)  # through FAULT_START + 2 intervals
    assert [t.change for t in transitions] == ["pending"]
    pending_at = transitions[0].at
    second = AlertEvaluator(rules, store, notifiers=[], history=AlertHistory(store), diagnose=False)
    assert [a.active_at for a in second.pending()] == [pending_at]
    later = simulate(second, T0 + timedelta(seconds=165), 120, INTERVAL_SECONDS)
    assert [(t.change, t.at) for t in later] == [("firing", pending_at + timedelta(seconds=FOR_SECONDS))]


def test_case6_receiver_down_retries_with_backoff_and_nothing_blocks(store, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    port = _free_port()
    secret_url = f"http://alert:s3cr3t-pw@127.0.0.1:{port}/hook?token=t0k3n-secret"
    insert_requests(store, batch_window_traffic())
    delivery = Delivery(
        name="hook",
        kind="webhook",
        url=secret_url,
        timeout_seconds=1.0,
        max_attempts=10,
        backoff_initial_seconds=0.05,
        backoff_max_seconds=0.4,
    )
    rules = _rules(f"http://127.0.0.1:{port}")
    evaluator = AlertEvaluator(rules, store, notifiers=[delivery], diagnose=False)
    server = None
    try:
        started = time.monotonic()
        transitions = simulate(evaluator, T0, 4 * 60, INTERVAL_SECONDS)  # fires with the receiver down
        assert "firing" in [t.change for t in transitions]
        # The evaluator kept evaluating while the receiver was down.
        assert evaluator.evaluations_total == 16
        evaluation_seconds = time.monotonic() - started
        assert _wait_for(lambda: delivery.retries_total >= 3, 5.0)
        assert delivery.sent_total == 0
        delays = delivery.backoff_delays_seconds
        assert delays[:3] == [0.05, 0.1, 0.2]  # exponential backoff
        # More evaluations while the worker is still retrying return promptly.
        busy_started = time.monotonic()
        simulate(evaluator, T0 + timedelta(minutes=4), 60, INTERVAL_SECONDS)
        assert time.monotonic() - busy_started < max(2.0, 2 * evaluation_seconds)
        # The receiver comes up on its port: the pending notification is delivered.
        captured = Captured()
        server = uvicorn.Server(
            uvicorn.Config(receiver_app(captured), host="127.0.0.1", port=port, log_level="warning")
        )
        threading.Thread(target=server.run, daemon=True).start()
        assert _wait_for(lambda: delivery.sent_total == 1, 15.0)
        (body,) = captured.bodies("/hook")
        assert body["status"] == "firing" and body["alerts"][0]["labels"]["alertname"] == "TTFTTailDivergence"
        assert delivery.failed_total == 0 and delivery.dropped_total == 0
    finally:
        evaluator.stop(5.0)
        if server is not None:
            server.should_exit = True
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "127.0.0.1" in logged  # the receiver's failures were logged...
    assert "s3cr3t-pw" not in logged and "t0k3n-secret" not in logged  # ...without its secrets
    assert "s3cr3t-pw" not in repr(delivery)
    assert redact_url(secret_url) == f"http://127.0.0.1:{port}/…"


def test_non_retryable_answer_is_dropped_and_counted(serve_app) -> None:
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()
    calls = []

    @app.post("/hook")
    async def hook() -> JSONResponse:
        calls.append(1)
        return JSONResponse({"error": "bad payload"}, status_code=400)

    with serve_app(app) as url:
        delivery = Delivery(name="hook", kind="webhook", url=f"{url}/hook", backoff_initial_seconds=0.05)
        from inferpath.alerts.notifiers import Notification

        delivery.submit([Notification("firing", {"alertname": "X"}, {}, T0, None, "f")])
        assert _wait_for(lambda: delivery.failed_total == 1, 10.0)
        delivery.close()
    assert len(calls) == 1 and delivery.retries_total == 0
