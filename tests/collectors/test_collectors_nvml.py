"""NVML poller with a fake pynvml module (recorded L40S / L4 readings) at the hardware boundary."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest
from fake_pynvml import (
    MIB,
    NVML_ERROR_DRIVER_NOT_LOADED,
    FakePynvml,
    l4,
    l40s,
    mig_instance,
)

from inferpath.collectors.combine import DERIVED_FROM_ATTRIBUTE, fill_utilization
from inferpath.collectors.identity import device_key
from inferpath.collectors.nvml import NvmlAdapter, NvmlPoller
from inferpath.collectors.pipeline import parse_scrape

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
GPU_FIELDS = {
    "gpu_utilization_ratio",
    "gpu_memory_used_bytes",
    "gpu_memory_free_bytes",
    "gpu_memory_total_bytes",
    "gpu_power_watts",
    "gpu_temperature_celsius",
    "gpu_sm_clock_hertz",
    "gpu_memory_clock_hertz",
    "gpu_clock_event_reasons",
    "gpu_up",
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _poller(fake: FakePynvml, clock: Clock | None = None, **kwargs) -> NvmlPoller:
    adapter = NvmlAdapter(fake)
    adapter.init()
    return NvmlPoller(adapter, host="node-a", monotonic=clock or Clock(), wall_clock=lambda: T0, **kwargs)


def _by_device(samples) -> dict[tuple, dict[str, float]]:
    out: dict[tuple, dict[str, float]] = {}
    for s in samples:
        if s.signal != "gpu_process_memory_used_bytes":
            out.setdefault(device_key(s.attributes), {})[s.signal] = s.value
    return out


def _case_4_fake() -> FakePynvml:
    mig_parent = l4(unsupported={"nvmlDeviceGetUtilizationRates"})
    mig_parent.mig_instances = [mig_instance(mig_parent, 1, 0.5)]
    no_power = l40s(unsupported={"nvmlDeviceGetPowerUsage"}, processes=[(4242, 1536 * MIB)])
    return FakePynvml([mig_parent, no_power])


def test_case_4_not_supported_fields_are_absent_and_not_asked_again():
    fake = _case_4_fake()
    clock = Clock()
    poller = _poller(fake, clock)
    samples = poller.poll()
    devices = _by_device(samples)
    mig_gpu = ("node-a", "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c", "")
    mig_instance_key = ("node-a", "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c", "1")
    other = ("node-a", "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43", "")
    assert set(devices) == {mig_gpu, mig_instance_key, other}
    # Only utilization is missing on the MIG-enabled GPU, only power on the other.
    assert set(devices[mig_gpu]) == GPU_FIELDS - {"gpu_utilization_ratio"}
    assert set(devices[other]) == GPU_FIELDS - {"gpu_power_watts"}
    # The MIG instance answers memory only, as real MIG handles do.
    assert set(devices[mig_instance_key]) == {
        "gpu_memory_used_bytes",
        "gpu_memory_free_bytes",
        "gpu_memory_total_bytes",
        "gpu_up",
    }
    assert devices[mig_instance_key]["gpu_memory_total_bytes"] == int((22563 + 470) * MIB * 0.5)
    # Recorded values, converted once: L4 16.365 W, 31 C, 210/405 MHz; L40S 46068 MiB.
    assert devices[mig_gpu]["gpu_power_watts"] == pytest.approx(16.365)
    assert devices[mig_gpu]["gpu_temperature_celsius"] == 31
    assert devices[mig_gpu]["gpu_sm_clock_hertz"] == 210e6 and devices[mig_gpu]["gpu_memory_clock_hertz"] == 405e6
    assert devices[other]["gpu_memory_total_bytes"] == 46068 * MIB
    assert devices[other]["gpu_utilization_ratio"] == 0.0
    assert devices[other]["gpu_clock_event_reasons"] == 1  # GPU idle
    processes = [s for s in samples if s.signal == "gpu_process_memory_used_bytes"]
    assert [(s.attributes["process.pid"], s.value) for s in processes] == [("4242", 1536 * MIB)]
    assert all(s.timestamp == T0 and s.attributes["host"] == "node-a" for s in samples)

    # Ten more polls a second apart: NotSupported queries are not repeated.
    utilization_calls = fake.calls["nvmlDeviceGetUtilizationRates"]
    power_calls = fake.calls["nvmlDeviceGetPowerUsage"]
    for _ in range(10):
        clock.now += 1.0
        again = _by_device(poller.poll())
        assert again == devices
    # Per poll: the non-MIG L40S asks for utilization, the L4 only for power; nothing retried.
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == utilization_calls + 10
    assert fake.calls["nvmlDeviceGetPowerUsage"] == power_calls + 10
    # Processes every 10 s (polls 0 and 10): three devices, then two (the MIG instance said NotSupported).
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 3 + 2
    # After the retry period they are asked once more.
    clock.now += 600.0
    poller.poll()
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == utilization_calls + 10 + 3


def test_case_4_mig_utilization_comes_from_dcgm_graphics_engine_active():
    poller = _poller(_case_4_fake())
    nvml_samples = poller.poll()
    dcgm = (
        'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",GPU_I_ID="1",'
        'GPU_I_PROFILE="3g.12gb",Hostname="node-a"} 0.625\n'
    )
    dcgm_samples = parse_scrape(dcgm, "dcgm", timestamp=T0).samples
    merged = fill_utilization([*nvml_samples, *dcgm_samples])
    filled = [s for s in merged if s.signal == "gpu_utilization_ratio" and DERIVED_FROM_ATTRIBUTE in s.attributes]
    assert len(filled) == 1
    assert filled[0].value == 0.625
    assert filled[0].attributes[DERIVED_FROM_ATTRIBUTE] == "gpu_graphics_engine_active_ratio"
    assert device_key(filled[0].attributes) == ("node-a", "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c", "1")
    # GPUs with their own utilization are not touched.
    assert sum(1 for s in merged if s.signal == "gpu_utilization_ratio") == 2


def test_lost_gpu_is_marked_lost_while_the_other_keeps_reporting(caplog):
    first, second = l40s(), l4()
    fake = FakePynvml([first, second])
    clock = Clock()
    poller = _poller(fake, clock, topology_refresh_seconds=5.0)
    poller.poll()
    second.lost = True
    with caplog.at_level(logging.ERROR, logger="inferpath.collectors.nvml"):
        for _ in range(8):  # across a device-list refresh, where the lost GPU no longer enumerates
            clock.now += 1.0
            devices = _by_device(poller.poll())
    lost_key = ("node-a", second.uuid, "")
    assert devices[lost_key] == {"gpu_up": 0.0}
    assert set(devices[("node-a", first.uuid, "")]) == GPU_FIELDS
    assert poller.lost == {second.uuid}
    assert len([r for r in caplog.records if "lost" in r.message]) == 1


def test_no_driver_gives_one_clear_message_and_the_collector_is_off(caplog, monkeypatch):
    import sys

    fake = FakePynvml([], init_error=NVML_ERROR_DRIVER_NOT_LOADED)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with caplog.at_level(logging.WARNING, logger="inferpath.collectors.nvml"):
        poller = NvmlPoller.from_system(host="node-a")
        assert poller.poll() == [] and poller.poll() == []
    assert not poller.enabled
    assert "Driver Not Loaded" in poller.disabled_reason
    [record] = [r for r in caplog.records if r.name == "inferpath.collectors.nvml"]
    assert "NVML collector off" in record.message


def test_real_nvidia_ml_py_without_a_gpu_is_off_not_crashing():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    poller = NvmlPoller.from_system()
    assert not poller.enabled and poller.poll() == []
    assert "NVML could not start" in poller.disabled_reason


def test_unexpected_nvml_error_skips_the_field_and_is_counted():
    gpu = l40s()
    fake = FakePynvml([gpu])
    poller = _poller(fake)
    original = fake.nvmlDeviceGetTemperature

    def failing(handle, sensor):
        raise fake.NVMLError(fake.NVML_ERROR_UNKNOWN)

    fake.nvmlDeviceGetTemperature = failing
    devices = _by_device(poller.poll())
    assert "gpu_temperature_celsius" not in devices[("node-a", gpu.uuid, "")]
    assert poller.errors_total == 1 and not poller.unsupported
    fake.nvmlDeviceGetTemperature = original
    assert "gpu_temperature_celsius" in _by_device(poller.poll())[("node-a", gpu.uuid, "")]


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_seconds"):
        NvmlPoller(None, interval_seconds=0)


def _four_gpus() -> list:
    return [
        l40s(uuid=f"GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc4{i}", pci_bus_id=f"00000000:00:0{i + 4}.0") for i in range(4)
    ]


def test_a_gpu_lost_before_it_enumerates_is_reported_not_dropped(caplog):
    """nvmlDeviceGetHandleByIndex(2) raises NVMLError_GpuIsLost: GPU 2 is a gpu_up 0 sample,
    not only a log line (it was left out of the samples)."""
    import pynvml

    gpus = _four_gpus()
    gpus[2].lost = True
    fake = FakePynvml(gpus)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):  # the library's own class, as on real hardware
        fake.nvmlDeviceGetHandleByIndex(2)
    with caplog.at_level(logging.ERROR, logger="inferpath.collectors.nvml"):
        samples = _poller(fake).poll()
    devices = _by_device(samples)
    for i in (0, 1, 3):
        assert set(devices[("node-a", gpus[i].uuid, "")]) == GPU_FIELDS
        assert devices[("node-a", gpus[i].uuid, "")]["gpu_up"] == 1.0
    assert devices[("node-a", "unknown-gpu-2", "")] == {"gpu_up": 0.0}
    [lost] = [s for s in samples if s.attributes.get("UUID") == "unknown-gpu-2"]
    assert lost.attributes == {"host": "node-a", "UUID": "unknown-gpu-2", "gpu": "2"}
    assert any("index 2" in r.message and "GPU is lost" in r.message for r in caplog.records)


def test_a_gpu_that_stops_enumerating_keeps_its_identity_and_turns_gpu_up_zero():
    gpus = _four_gpus()
    fake = FakePynvml(gpus)
    clock = Clock()
    poller = _poller(fake, clock, topology_refresh_seconds=5.0)
    assert _by_device(poller.poll())[("node-a", gpus[2].uuid, "")]["gpu_up"] == 1.0
    gpus[2].lost = True
    for _ in range(6):  # through a device-list refresh, where index 2 now fails to enumerate
        clock.now += 1.0
        devices = _by_device(poller.poll())
        assert devices[("node-a", gpus[2].uuid, "")] == {"gpu_up": 0.0}
        assert len(devices) == 4


def test_nvml_init_failing_once_is_retried_with_backoff_and_counted(caplog, monkeypatch):
    """nvmlInit raising NVMLError_DriverNotLoaded once used to switch NVML off for the life of
    the process; now later polls retry it, with backoff, and count the retries."""
    import sys

    fake = FakePynvml([l40s()], init_error=NVML_ERROR_DRIVER_NOT_LOADED, init_error_times=3)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    clock = Clock()
    with caplog.at_level(logging.WARNING, logger="inferpath.collectors.nvml"):
        poller = NvmlPoller.from_system(
            host="node-a", monotonic=clock, wall_clock=lambda: T0, init_retry_seconds=5.0, init_retry_max_seconds=60.0
        )
    assert not poller.enabled and "Driver Not Loaded" in poller.disabled_reason
    tried_at = []
    for _ in range(40):
        before = fake.calls["nvmlInit"]
        samples = poller.poll()
        if fake.calls["nvmlInit"] > before:
            tried_at.append(clock.now - 1000.0)
        if samples:
            break
        clock.now += 1.0
    # Failed at 0 (from_system), retried at 5 and 15 (failed), then at 35 (started).
    assert tried_at == [5.0, 15.0, 35.0]
    assert poller.enabled and poller.disabled_reason == ""
    assert (poller.init_retries_total, poller.init_failures_total) == (3, 3)
    assert set(_by_device(samples)[("node-a", l40s().uuid, "")]) == GPU_FIELDS


def test_a_driver_that_goes_away_turns_known_gpus_down_and_is_started_again():
    gpus = [l40s(), l4()]
    fake = FakePynvml(gpus)
    clock = Clock()
    poller = _poller(fake, clock, init_retry_seconds=2.0)
    assert len(_by_device(poller.poll())) == 2
    original = fake.nvmlDeviceGetMemoryInfo

    def driver_gone(handle, *version):
        raise fake.NVMLError(fake.NVML_ERROR_UNINITIALIZED)

    fake.nvmlDeviceGetMemoryInfo = driver_gone
    clock.now += 1.0
    devices = _by_device(poller.poll())
    assert {key: values["gpu_up"] for key, values in devices.items()} == {
        ("node-a", gpus[0].uuid, ""): 0.0,
        ("node-a", gpus[1].uuid, ""): 0.0,
    }
    assert not poller.enabled
    fake.nvmlDeviceGetMemoryInfo = original
    clock.now += 1.0
    assert {v["gpu_up"] for v in _by_device(poller.poll()).values()} == {0.0}  # backoff not over
    clock.now += 1.0
    devices = _by_device(poller.poll())
    assert poller.enabled and poller.init_retries_total == 1
    assert all(set(values) == GPU_FIELDS and values["gpu_up"] == 1.0 for values in devices.values())


def test_memory_used_leaves_the_drivers_reserved_part_out_as_nvidia_smi_and_dcgm_do(shared_data):
    # On a real H200 NVML's v1 call said 615 MiB used on an idle GPU where nvidia-smi said 0:
    # v1 counts the driver's reserved memory as used, v2 (and dcgm-exporter) do not.
    fake = FakePynvml([l40s()])
    reading = _by_device(_poller(fake).poll())[("node-a", "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43", "")]
    scrape = (shared_data / "dcgm_exporter_metrics/cncf_ai_conformance_upcloud_L40S.prom").read_text()
    dcgm = {s.signal: s.value for s in parse_scrape(scrape, "dcgm", timestamp=T0).samples}
    assert reading["gpu_memory_used_bytes"] == dcgm["gpu_memory_used_bytes"] == 0.0
    assert reading["gpu_memory_free_bytes"] == dcgm["gpu_memory_free_bytes"] == 45459 * MIB


def test_a_driver_without_the_v2_memory_call_is_read_with_v1_and_not_asked_again():
    gpu = l40s(memory_v2=False, memory_used_bytes=1000 * MIB)
    fake = FakePynvml([gpu])
    poller = _poller(fake)
    for _ in range(3):
        reading = _by_device(poller.poll())[("node-a", gpu.uuid, "")]
        # v1: the reserved 608 MiB counted as used; the field is never left out for it
        assert reading["gpu_memory_used_bytes"] == (1000 + 608) * MIB
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 4  # one refused v2 call, then v1 each poll
    assert poller.errors_total == 0
