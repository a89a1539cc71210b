"""Case 3 on the real reference path: the demo's ``batch-window`` scenario (server, engine
and gateway as child processes) with the evaluator running inside the server process.

Detector: the batch window holds every new request about 500 ms before its prefill, so the
mean TTFT rises with the tail and the p99/mean ratio barely moves (a divergence rule would
need a threshold tuned to this run). What does leave the healthy range is the TTFT p99
itself: healthy prefills at this time scale stay well under 0.2 s, batched ones take more
than 0.5 s. So the rule is ``quantile_over_slo`` on TTFT p99 with a 0.4 s SLO.

Resolution: the scenario keeps a tail phase (``tail_seconds``) with the batch window turned
off and no traffic; once the rule's window holds no fault rows the condition stops and the
alert resolves, while the server is still running, so the receiver sees the real
notification rather than a back-test's.
"""

from __future__ import annotations

from datetime import timedelta

from inferpath.demo.scenarios import ScenarioOptions
from inferpath.storage.store import Store

INTERVAL_SECONDS = 1.0
FOR_SECONDS = 2.0
WINDOW_SECONDS = 4.0
OFFSET_SECONDS = 5.0
"""``query_offset``: a request's row (keyed by its start) is written only after the request
ends, its spans are exported (0.5 s) and its trace has been quiet for the assembler's settle
time (2 s): about 4 s after a batched request starts here. So the evaluator reads the window
ending 5 s ago, as Prometheus' ``query_offset`` does for late samples; the alert clock runs
that much behind the wall clock."""


def _rules(receiver_url: str) -> str:
    return f"""
evaluation_interval: {INTERVAL_SECONDS}s
query_offset: {OFFSET_SECONDS}s
receivers:
  - {{name: am, type: alertmanager, url: "{receiver_url}", resend_interval: 1h}}
  - {{name: hook, type: webhook, url: "{receiver_url}/hook", timeout: 2s}}
rules:
  - name: TTFTp99OverSLO
    kind: quantile_over_slo
    measure: ttft
    quantile: 0.99
    slo_seconds: 0.4
    min_samples: 5
    window: {WINDOW_SECONDS}s
    for: {FOR_SECONDS}s
    annotations:
      summary: "TTFT p99 {{{{ evidence.quantile_seconds | ms }}}} over the 400 ms SLO"
"""


def test_batch_window_scenario_fires_once_and_resolves(tmp_path, store_url, receiver, scenario_runs) -> None:
    url, captured = receiver
    rules = tmp_path / "rules.yaml"
    rules.write_text(_rules(url))
    # The scenario suite's load (2 x 60 requests): this run is also the session's batch-window
    # run that tests/scenarios diagnoses (tests/conftest.py), so the scenario runs once.
    outcome = scenario_runs.run(
        "batch-window",
        ScenarioOptions(
            store_url=store_url,
            log_dir=tmp_path / "logs",
            server_env={"INFERPATH_ALERT_RULES": str(rules)},
            tail_seconds=OFFSET_SECONDS + WINDOW_SECONDS + 4 * INTERVAL_SECONDS,
        ),
    )
    fault_start, fault_end = outcome.fault_window

    with Store.open(store_url, ttl_days=3650) as store:
        rows = store.query_dicts(
            "SELECT timestamp, state FROM inferpath_alerts WHERE rule = 'TTFTp99OverSLO' ORDER BY timestamp"
        )
    states = [row["state"] for row in rows]
    assert states == ["pending", "firing", "resolved"], (states, (tmp_path / "logs" / "server.log").read_text()[-3000:])
    pending_at, firing_at, resolved_at = (row["timestamp"] for row in rows)
    # Quiet through the baseline phase; pending after the fault starts, within three
    # evaluation intervals of it on the alert clock (wall clock - query_offset: the first
    # slow requests' rows, stored within about the offset, and one interval to be read);
    # firing `for` after pending on the evaluation grid (one interval more only where a pass
    # overran its tick on the busy machine; tests/alerts/test_alerts_cases.py holds the
    # exact count).
    assert fault_start <= pending_at - timedelta(seconds=OFFSET_SECONDS)
    assert pending_at - timedelta(seconds=OFFSET_SECONDS) - fault_start <= timedelta(seconds=3 * INTERVAL_SECONDS), (
        pending_at - fault_start
    )
    held = (firing_at - pending_at).total_seconds()
    assert FOR_SECONDS - 0.001 < held < FOR_SECONDS + INTERVAL_SECONDS + 0.001, (pending_at, firing_at)
    assert resolved_at > fault_end

    # One firing notification (not one per evaluation), then the resolution.
    hook = captured.bodies("/hook")
    assert [body["status"] for body in hook] == ["firing", "resolved"]
    am = captured.bodies("/api/v2/alerts")
    assert len(am) == 2 and all(len(body) == 1 for body in am)
    assert am[0][0]["labels"]["alertname"] == "TTFTp99OverSLO"
    assert am[1][0]["endsAt"] <= hook[1]["alerts"][0]["endsAt"]
