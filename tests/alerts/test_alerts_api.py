"""The server's alert read routes (``GET /api/v1/alerts``, ``POST /api/v1/alerts/backtest``) and
alert counters on ``/metrics``."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import httpx
from alert_scenarios import insert_requests, request

from inferpath.config import Settings
from inferpath.serve import server_services
from inferpath.server.runtime import serve_in_thread


def test_alerts_route_without_evaluator(store_url) -> None:
    # The server alone: no alerts service; with one and no rules: back-tests only.
    alone = serve_in_thread(Settings(store_url=store_url), port=0)
    try:
        body = httpx.get(f"{alone.url}/api/v1/alerts", timeout=10).json()
        metrics = httpx.get(f"{alone.url}/metrics", timeout=10).text
        refused = httpx.post(
            f"{alone.url}/api/v1/alerts/backtest", timeout=10, json={"rules": "rules: []", "start": "-60", "end": "0"}
        )
    finally:
        alone.stop()
    assert body["configured"] is False and body["history"] == []
    assert "inferpath_alerts_evaluations_total" not in metrics
    assert refused.status_code == 404 and "alerts service" in refused.json()["detail"]
    settings = Settings(store_url=store_url)
    quiet = serve_in_thread(settings, port=0, services=server_services(settings))
    try:
        body = httpx.get(f"{quiet.url}/api/v1/alerts", timeout=10).json()
        bad = httpx.post(
            f"{quiet.url}/api/v1/alerts/backtest",
            timeout=10,
            json={
                "rules": "rules:\n  - name: A\n    kind: nope\n",
                "source": "mine.yaml",
                "start": "2026-12-03T10:00:00Z",
                "end": "2026-12-03T11:00:00Z",
            },
        )
        long = httpx.post(
            f"{quiet.url}/api/v1/alerts/backtest",
            timeout=10,
            json={
                "rules": "rules: []",
                "start": "2026-01-01T00:00:00Z",
                "end": "2026-12-01T00:00:00Z",
                "step_seconds": 60,
            },
        )
        backwards = httpx.post(
            f"{quiet.url}/api/v1/alerts/backtest",
            timeout=10,
            json={"rules": "rules: []", "start": "2026-12-03T11:00:00Z", "end": "2026-12-03T10:00:00Z"},
        )
    finally:
        quiet.stop()
    assert body["configured"] is False
    assert bad.status_code == 422 and "mine.yaml:3: rules[0].kind" in bad.json()["detail"][0]["msg"]
    assert long.status_code == 422 and "480960 evaluations" in long.json()["detail"][0]["msg"]
    assert backwards.status_code == 422 and backwards.json()["detail"][0]["loc"] == ["body", "end"]


def test_alerts_route_and_metrics_with_a_firing_alert(store_url, tmp_path, receiver) -> None:
    url, captured = receiver
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"""
evaluation_interval: 200ms
receivers:
  - {{name: am, type: alertmanager, url: "{url}", resend_interval: 1h}}
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
        time.sleep(0.3)  # the delivery thread counts the send after the receiver answered
        body = httpx.get(f"{server.url}/api/v1/alerts", timeout=10).json()
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        server.stop()
    assert body["configured"] is True
    (firing,) = body["firing"]
    assert firing["rule"] == "TTFTTailDivergence" and firing["labels"]["alertname"] == "TTFTTailDivergence"
    assert firing["value"] > 4 and body["pending"] == []
    assert [row["state"] for row in body["history"]] == ["firing"]
    (status,) = body["rules"]
    assert status["health"] == "ok" and status["samples"][0]["active"] is True
    assert 'inferpath_alerts_notifications_sent_total{receiver="am"} 1.0' in metrics
    assert 'inferpath_alerts_notifications_failed_total{receiver="am"} 0.0' in metrics
    assert "inferpath_alerts_firing 1.0" in metrics
    evaluations = [line for line in metrics.splitlines() if line.startswith("inferpath_alerts_evaluations_total ")]
    assert float(evaluations[0].split()[1]) >= 1
