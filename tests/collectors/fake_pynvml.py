"""A stand-in for the ``pynvml`` module (nvidia-ml-py) at the hardware boundary.

Same function names as nvidia-ml-py, and its own constants and exception classes (imported
from it: ``NVMLError(code)`` builds the real subclass, e.g. ``NVMLError_GpuIsLost``, as
the library does). As on real hardware, a lost GPU fails from ``nvmlDeviceGetHandleByIndex``
on. The readings are recorded values of real idle GPUs:

- ``L40S``: the nvidia-smi table and dcgm-exporter scrape of one L40S in
  ``../shared/data`` (31-32 C, 35.686 W from dcgm / 25 W in nvidia-smi, 0 of 46068 MiB used,
  0 %, SM 210 MHz, memory 405 MHz, idle clock-event reason).
- ``L4``: the dcgm-exporter scrape of one idle L4 (31 C, 16.365 W, 0 MiB used,
  22563 MiB free + 470 MiB reserved, SM 210 MHz, memory 405 MHz).

MIG is simulated on top of a recorded device (no MIG recording exists in the data folder):
``mig_instances`` adds instances whose memory is a slice of the parent's and that, as on
real hardware, answer NotSupported for utilization, power, temperature and clocks.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml
from pynvml import (  # noqa: F401 - re-exported: the fake module has the real names
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_DEVICE_MIG_DISABLE,
    NVML_DEVICE_MIG_ENABLE,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    NVML_ERROR_UNKNOWN,
    NVML_SUCCESS,
    NVML_TEMPERATURE_GPU,
    NVMLError,
    nvmlMemory_v2,
)

MIB = 1024 * 1024
CLOCKS_EVENT_REASON_GPU_IDLE = 0x1


@dataclass
class FakeGpu:
    """One device's readings in NVML's own units (percent, bytes, mW, C, MHz)."""

    uuid: str
    name: str
    pci_bus_id: str
    utilization_percent: int = 0
    memory_used_bytes: int = 0
    memory_free_bytes: int = 0
    memory_total_bytes: int = 0
    memory_reserved_bytes: int = 0
    """The driver's reserved part of the total: NVML's v1 memory call counts it as used."""
    memory_v2: bool = True
    """False: a driver before R510, whose NVML has no ``nvmlDeviceGetMemoryInfo_v2``."""
    power_milliwatts: int = 0
    temperature_celsius: int = 0
    sm_clock_mhz: int = 0
    memory_clock_mhz: int = 0
    clock_event_reasons: int = CLOCKS_EVENT_REASON_GPU_IDLE
    processes: list[tuple[int, int]] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    mig_instances: list[FakeGpu] = field(default_factory=list)
    gpu_instance_id: int | None = None


def l40s(**overrides) -> FakeGpu:
    """The recorded idle L40S (nvidia-smi table + dcgm-exporter scrape)."""
    values = dict(
        uuid="GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43",
        name="NVIDIA L40S",
        pci_bus_id="00000000:00:07.0",
        utilization_percent=0,
        memory_used_bytes=0,
        memory_free_bytes=45459 * MIB,
        memory_total_bytes=46068 * MIB,
        memory_reserved_bytes=608 * MIB,
        power_milliwatts=35686,
        temperature_celsius=32,
        sm_clock_mhz=210,
        memory_clock_mhz=405,
    )
    values.update(overrides)
    return FakeGpu(**values)


def l4(**overrides) -> FakeGpu:
    """The recorded idle L4 (dcgm-exporter scrape)."""
    values = dict(
        uuid="GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",
        name="NVIDIA L4",
        pci_bus_id="00000000:00:04.0",
        utilization_percent=0,
        memory_used_bytes=0,
        memory_free_bytes=22563 * MIB,
        memory_total_bytes=(22563 + 470) * MIB,
        memory_reserved_bytes=470 * MIB,
        power_milliwatts=16365,
        temperature_celsius=31,
        sm_clock_mhz=210,
        memory_clock_mhz=405,
    )
    values.update(overrides)
    return FakeGpu(**values)


def mig_instance(parent: FakeGpu, gpu_instance_id: int, slice_fraction: float) -> FakeGpu:
    """A MIG instance of ``parent`` holding ``slice_fraction`` of its memory."""
    total = int(parent.memory_total_bytes * slice_fraction)
    return FakeGpu(
        uuid=f"MIG-{parent.uuid[4:12]}-{gpu_instance_id:04d}-0000-0000-000000000000",
        name=parent.name,
        pci_bus_id=parent.pci_bus_id,
        memory_used_bytes=0,
        memory_free_bytes=total,
        memory_total_bytes=total,
        gpu_instance_id=gpu_instance_id,
        unsupported={
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetTemperature",
            "nvmlDeviceGetClockInfo",
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetComputeRunningProcesses",
        },
    )


class FakePynvml:
    """The module object. ``gpus``: devices by index; ``init_error``: an NVML code nvmlInit fails
    with, ``init_error_times`` times (``None``: every time); ``latency_seconds``: busy-wait per
    call (benchmarks). ``calls`` counts calls by name. ``NVMLError_*`` classes are pynvml's."""

    NVMLError = NVMLError
    nvmlMemory_v2 = nvmlMemory_v2

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        init_error: int | None = None,
        init_error_times: int | None = None,
        latency_seconds: float = 0.0,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.init_error_times = init_error_times
        self.latency_seconds = latency_seconds
        self.calls: Counter[str] = Counter()
        self.call_seconds = 0.0
        for name, value in globals().items():
            if name.startswith("NVML_"):
                setattr(self, name, value)

    def __getattr__(self, name: str):
        if name.startswith("NVMLError_"):  # the library's exception subclasses
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _enter(self, name: str, gpu: FakeGpu | None = None) -> None:
        self.calls[name] += 1
        if self.latency_seconds:
            start = time.perf_counter()
            while time.perf_counter() - start < self.latency_seconds:
                pass
            self.call_seconds += time.perf_counter() - start
        if gpu is not None:
            if gpu.lost:
                raise NVMLError(NVML_ERROR_GPU_IS_LOST)
            if name in gpu.unsupported:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None and self.init_error_times != 0:
            if self.init_error_times is not None:
                self.init_error_times -= 1
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._enter("nvmlDeviceGetHandleByIndex", self.gpus[index])
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str:
        self._enter("nvmlDeviceGetUUID", gpu)
        return gpu.uuid

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str:
        self._enter("nvmlDeviceGetName", gpu)
        return gpu.name

    def nvmlDeviceGetPciInfo(self, gpu: FakeGpu) -> SimpleNamespace:
        self._enter("nvmlDeviceGetPciInfo", gpu)
        return SimpleNamespace(busId=gpu.pci_bus_id)

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> tuple[int, int]:
        self._enter("nvmlDeviceGetMigMode", gpu)
        mode = NVML_DEVICE_MIG_ENABLE if gpu.mig_instances else NVML_DEVICE_MIG_DISABLE
        return mode, mode

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", gpu)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: FakeGpu, slot: int) -> FakeGpu:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", gpu)
        if slot >= len(gpu.mig_instances):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return gpu.mig_instances[slot]

    def nvmlDeviceGetGpuInstanceId(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", gpu)
        return gpu.gpu_instance_id

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates", gpu)
        return SimpleNamespace(gpu=gpu.utilization_percent, memory=0)

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu, version: int | None = None) -> SimpleNamespace:
        # As nvidia-ml-py: no version is the v1 call, whose "used" holds the reserved part
        # too (an idle H200: 615 MiB used in v1, 0 in v2 and in nvidia-smi).
        self._enter("nvmlDeviceGetMemoryInfo", gpu)
        total, free, reserved = gpu.memory_total_bytes, gpu.memory_free_bytes, gpu.memory_reserved_bytes
        if not version:
            return SimpleNamespace(used=gpu.memory_used_bytes + reserved, free=free, total=total)
        assert version == nvmlMemory_v2
        if not gpu.memory_v2:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        return SimpleNamespace(used=gpu.memory_used_bytes, free=free, total=total, reserved=reserved)

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetPowerUsage", gpu)
        return gpu.power_milliwatts

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", gpu)
        assert sensor == NVML_TEMPERATURE_GPU
        return gpu.temperature_celsius

    def nvmlDeviceGetClockInfo(self, gpu: FakeGpu, clock: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", gpu)
        return {NVML_CLOCK_SM: gpu.sm_clock_mhz, NVML_CLOCK_MEM: gpu.memory_clock_mhz}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", gpu)
        return gpu.clock_event_reasons

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", gpu)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]
