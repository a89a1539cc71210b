"""The evaluator inside the inferpath server (``inferpath up``), configured by INFERPATH_ALERT_RULES."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from alert_scenarios import insert_requests, request

from inferpath.alerts.rules import RuleFileError
from inferpath.alerts.service import alert_rules_source, start_alerts
from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread
from inferpath.storage.store import Store


def test_rules_source_and_off_switch() -> None:
    assert alert_rules_source(Settings(), {}) is None
    assert alert_rules_source(Settings(), {"INFERPATH_ALERT_RULES": "off"}) is None
    assert alert_rules_source(Settings(), {"INFERPATH_ALERT_RULES": "default"}) == "default"


def test_bad_rule_file_fails_at_start(tmp_path) -> None:
    bad = tmp_path / "rules.yaml"
    bad.write_text("rules:\n  - name: A\n    kind: kv_pressure\n    window: soon\n")
    with pytest.raises(RuleFileError, match=r"rules.yaml:4: rules\[0\].window"):
        start_alerts(store=None, settings=Settings(), environ={"INFERPATH_ALERT_RULES": str(bad)})


def test_server_runs_the_evaluator_and_notifies(store_url, tmp_path, receiver, monkeypatch) -> None:
    url, captured = receiver
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"""
evaluation_interval: 200ms
receivers:
  - name: am
    type: alertmanager
    url: {url}
rules:
  - name: TTFTTailDivergence
    kind: tail_divergence
    ratio_threshold: 4
    min_samples: 100
    window: 5m
""")
    monkeypatch.setenv("INFERPATH_ALERT_RULES", str(rules))
    server = serve_in_thread(Settings(store_url=store_url), port=0)
    try:
        assert server.runtime.alerts is not None
        now = datetime.now(timezone.utc)
        insert_requests(server.runtime.store, [
            request(now - timedelta(seconds=60) + timedelta(milliseconds=200 * i), 3.0 if i % 30 == 0 else 0.1)
            for i in range(300)])
        deadline = time.monotonic() + 20
        while not captured.bodies("/api/v2/alerts") and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.stop()
    (post,) = captured.bodies("/api/v2/alerts")[:1]
    assert post[0]["labels"]["alertname"] == "TTFTTailDivergence"
    with Store.open(store_url) as store:
        states = [row[0] for row in store.query("SELECT state FROM inferpath_alerts ORDER BY timestamp")]
    assert states[0] == "firing"
