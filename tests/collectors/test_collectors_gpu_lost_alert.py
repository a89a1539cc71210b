"""A lost GPU, from NVML to the default alert pack: 4 GPUs, ``nvmlDeviceGetHandleByIndex(2)``
raises ``NVMLError_GpuIsLost``; the poller's samples are stored as the server stores them
(real chDB) and the shipped ``GPULost`` rule fires for GPU 2 only."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from fake_pynvml import FakePynvml, l40s

from inferpath.alerts.evaluator import AlertEvaluator
from inferpath.alerts.rules import RuleFile, load_rule_file
from inferpath.collectors.nvml import NvmlAdapter, NvmlPoller
from inferpath.server.scrape import samples_to_rows
from inferpath.storage.rows import GAUGE_COLUMNS
from inferpath.storage.store import Store

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def test_default_pack_fires_gpu_lost_for_the_gpu_that_no_longer_enumerates(store_url: str) -> None:
    gpus = [l40s(uuid=f"GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc4{i}") for i in range(4)]
    fake = FakePynvml(gpus)
    adapter = NvmlAdapter(fake)
    adapter.init()
    clock = {"now": T0}
    poller = NvmlPoller(
        adapter,
        host="node-a",
        monotonic=lambda: (clock["now"] - T0).total_seconds(),
        wall_clock=lambda: clock["now"],
        topology_refresh_seconds=10.0,
    )
    default = load_rule_file("default")
    rules = RuleFile(
        evaluation_interval=default.evaluation_interval, rules=[r for r in default.rules if r.kind == "gpu_lost"]
    )
    assert [r.name for r in rules.rules] == ["GPULost"]
    with Store.open(store_url, ttl_days=3650) as store:
        evaluator = AlertEvaluator(rules, store, notifiers=[], diagnose=False)

        def run(seconds: int) -> list:
            transitions = []
            for _ in range(seconds):
                gauges, _, _ = samples_to_rows(poller.poll(), "nvml")
                store.insert("otel_metrics_gauge", [g.to_insert_row() for g in gauges], GAUGE_COLUMNS)
                clock["now"] += timedelta(seconds=1)
                if (clock["now"] - T0).total_seconds() % 15 == 0:
                    transitions += evaluator.evaluate_once(clock["now"])
            return transitions

        assert run(60) == []  # four healthy GPUs: evaluated and quiet
        [status] = evaluator.last_statuses
        assert [s.confidence for s in status.samples] == ["ok"] * 4 and not any(s.active for s in status.samples)
        gpus[2].lost = True
        transitions = run(75)  # across a device-list refresh: index 2 now fails to enumerate
        firing = [t for t in transitions if t.change == "firing"]
        assert len(firing) == 1
        assert firing[0].labels["UUID"] == gpus[2].uuid and firing[0].labels["gpu"] == "2"
        [status] = evaluator.last_statuses
        assert sorted(s.labels["gpu"] for s in status.samples if s.active) == ["2"]
