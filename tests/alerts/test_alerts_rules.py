"""Rule files: the shipped pack, errors naming file, line and field, durations, templates."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from typer.testing import CliRunner

from inferpath.alerts.cli import app
from inferpath.alerts.rules import RuleFileError, load_rule_file, parse_rule_text
from inferpath.alerts.state import step
from inferpath.alerts.templates import render


def test_default_pack_covers_each_class_and_kind() -> None:
    rules = load_rule_file("default")
    kinds = {(r.kind, r.endpoint_class) for r in rules.rules}
    for kind in ("tail_divergence", "quantile_over_slo", "error_rate"):
        assert (kind, "interactive") in kinds and (kind, "bulk") in kinds
    assert {"queue_growing", "kv_pressure", "idle_gpu_latency"} <= {k for k, _ in kinds}
    itl = [r for r in rules.rules if r.kind == "quantile_over_slo" and r.measure == "itl"]
    assert len(itl) == 2
    kv = next(r for r in rules.rules if r.kind == "kv_pressure")
    assert kv.usage_threshold == 0.9


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        (
            "rules:\n  - name: A\n    kind: tail_divergence\n    ratio_threshold: 4\n    for: 5 minutes\n",
            5,
            "rules[0].for",
            "duration",
        ),
        ("rules:\n  - name: A\n    kind: tail_divergence\n", 2, "rules[0].ratio_threshold", "required"),
        (
            "rules:\n  - name: A\n    kind: tail_divergenc\n    ratio_threshold: 4\n",
            3,
            "rules[0].kind",
            "tail_divergence",
        ),
        (
            "rules:\n  - name: A\n    kind: error_rate\n    threshold_ratio: 0.05\n    windw: 5m\n",
            5,
            "rules[0].windw",
            "not permitted",
        ),
        (
            "rules:\n  - name: A\n    kind: quantile_over_slo\n    slo_seconds: 1\n    measure: tftt\n",
            5,
            "rules[0].measure",
            "ttft",
        ),
        ("receivers:\n  - name: am\n    type: alertmanager\nrules: []\n", 2, "receivers[0]", "url is required"),
        (
            "rules:\n  - name: A\n    kind: kv_pressure\n    annotations:\n      summary: '{{ evidence.p99 }}'\n",
            5,
            "rules[0].annotations.summary",
            "kv_cache_usage_ratio",
        ),
        ("rules:\n  - name: A\n    kind: kv_pressure\n  - name: A\n    kind: kv_pressure\n", 1, "rules", "two rules"),
        ("rules:\n  - name: A\n    kind: [oops\n", 3, "(file)", "YAML"),
    ],
)
def test_errors_name_file_line_and_field(text: str, line: int, field: str, words: str) -> None:
    with pytest.raises(RuleFileError) as caught:
        parse_rule_text(text, "team.yaml")
    (problem_line, problem_field, message) = caught.value.problems[0]
    assert (problem_line, problem_field) == (line, field), caught.value.problems
    assert words in message
    assert str(caught.value).startswith(f"team.yaml:{line}: {field}: ")


def test_unreadable_file_names_the_file(tmp_path) -> None:
    with pytest.raises(RuleFileError, match="missing.yaml: cannot read: "):
        load_rule_file(tmp_path / "missing.yaml")


def test_templates_render_evidence_with_filters() -> None:
    text = render(
        "p99 {{ evidence.quantile_seconds | ms }} is {{ value }}x ({{ labels.endpoint_class }}); "
        "{{ evidence.error_ratio | percent }} {{ evidence.missing }}",
        value=17.391304,
        labels={"endpoint_class": "interactive"},
        evidence={"quantile_seconds": 3.0, "error_ratio": 0.05},
    )
    assert text == "p99 3000.0 ms is 17.39x (interactive); 5.0% n/a"


def test_state_machine_follows_prometheus() -> None:
    t0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
    kw = dict(for_seconds=60, keep_firing_for_seconds=30, rule="R", labels={"alertname": "R"})
    alert, changes = step(None, active=True, now=t0, **kw)
    assert (alert.state, changes) == ("pending", ["pending"])
    alert, changes = step(alert, active=True, now=t0 + timedelta(seconds=45), **kw)
    assert (alert.state, changes) == ("pending", [])
    alert, changes = step(alert, active=True, now=t0 + timedelta(seconds=60), **kw)
    assert (alert.state, changes, alert.fired_at) == ("firing", ["firing"], t0 + timedelta(seconds=60))
    alert, changes = step(alert, active=False, now=t0 + timedelta(seconds=75), **kw)
    assert (alert.state, changes) == ("firing", ["keep_firing"])
    alert, changes = step(alert, active=True, now=t0 + timedelta(seconds=90), **kw)  # back: timer reset
    assert (alert.state, changes, alert.keep_firing_since) == ("firing", [], None)
    alert, changes = step(alert, active=False, now=t0 + timedelta(seconds=105), **kw)
    alert, changes = step(alert, active=False, now=t0 + timedelta(seconds=120), **kw)
    assert (alert.state, changes) == ("firing", [])
    alert, changes = step(alert, active=False, now=t0 + timedelta(seconds=135), **kw)
    assert (alert.state, changes, alert.resolved_at) == ("inactive", ["resolved"], t0 + timedelta(seconds=135))
    # A pending alert whose condition stops is dropped without a resolution.
    pending, _ = step(None, active=True, now=t0, **kw)
    gone, changes = step(pending, active=False, now=t0 + timedelta(seconds=15), **kw)
    assert (gone.state, changes) == ("inactive", ["inactive"])
    # for: 0 fires at once.
    instant, changes = step(None, active=True, now=t0, **(kw | {"for_seconds": 0}))
    assert (instant.state, changes) == ("firing", ["firing"])


def test_cli_check(tmp_path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["check", "default"])
    assert result.exit_code == 0, result.output
    assert "TTFTTailDivergence" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: A\n    kind: tail_divergence\n    ratio_threshold: 0.5\n")
    result = runner.invoke(app, ["check", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:4: rules[0].ratio_threshold:" in result.output.replace("\n  ", "")
