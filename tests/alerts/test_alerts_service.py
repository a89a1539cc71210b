"""The evaluator inside the inferpath server (``inferpath up``): a service the composition
(``inferpath/serve.py``) hands to the server, configured by ``alert_rules`` / INFERPATH_ALERT_RULES."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from alert_scenarios import insert_requests, request

from inferpath.alerts.rules import RuleFileError
from inferpath.alerts.service import AlertService, alert_rules_source
from inferpath.config import Settings
from inferpath.serve import server_services
from inferpath.server.runtime import serve_in_thread
from inferpath.server.services import ALERTS, AlertsService
from inferpath.storage.store import Store


def test_rules_source_and_off_switch() -> None:
    assert alert_rules_source(Settings.from_env({})) is None
    assert alert_rules_source(Settings.from_env({"INFERPATH_ALERT_RULES": "off"})) is None
    assert alert_rules_source(Settings.from_env({"INFERPATH_ALERT_RULES": "default"})) == "default"
    (service,) = server_services(Settings(alert_rules="default"))
    assert isinstance(service, AlertsService) and service.name == ALERTS and service.rule_file is not None
    (quiet,) = server_services(Settings(alert_rules="default"), evaluate_rules=False)
    assert quiet.rule_file is None  # a command's own server notifies no one


def test_bad_rule_file_fails_before_the_server_starts(tmp_path) -> None:
    bad = tmp_path / "rules.yaml"
    bad.write_text("rules:\n  - name: A\n    kind: kv_pressure\n    window: soon\n")
    with pytest.raises(RuleFileError, match=r"rules.yaml:4: rules\[0\].window"):
        AlertService.from_settings(Settings(alert_rules=str(bad)))


def test_server_runs_the_evaluator_and_notifies(store_url, tmp_path, receiver) -> None:
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
    settings = Settings(store_url=store_url, alert_rules=str(rules))
    server = serve_in_thread(settings, port=0, services=server_services(settings))
    try:
        assert server.runtime.services[ALERTS].evaluator is not None
        now = datetime.now(timezone.utc)
        insert_requests(
            server.runtime.store,
            [
                request(now - timedelta(seconds=60) + timedelta(milliseconds=200 * i), 3.0 if i % 30 == 0 else 0.1)
                for i in range(300)
            ],
        )
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
