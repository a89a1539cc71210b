"""NVML poller: GPU state read straight from the driver, per GPU and per MIG instance.

Every NVML call goes through :class:`NvmlAdapter`, which takes the ``pynvml`` module
(nvidia-ml-py) as a constructor argument: production passes the real module, tests pass a
fake with the same function names, constants and ``NVMLError``. The module is imported
lazily by :meth:`NvmlPoller.from_system`, so importing this file needs no GPU and no
nvidia-ml-py.

Per device and poll (default every second): utilization, memory used/free/total, power,
temperature, SM and memory clocks and the clock-event (throttle) reasons bitmask; the
memory used by each compute process at a slower rate (default every 10 s). Units are
converted by the catalog (``catalog.NVML_CONVERSIONS``: percent -> ratio, mW -> W,
MHz -> Hz).

Failure rules:
- A field the device answers ``NVML_ERROR_NOT_SUPPORTED`` for is absent from the samples
  (never 0) and is not asked again for ``retry_unsupported_seconds`` (default 10 min): MIG
  instances, for one, never support utilization.
- ``NVML_ERROR_GPU_IS_LOST`` marks that GPU lost: it reports ``gpu_up`` 0 and no other
  field, and is not queried again (until NVML is started again); the other GPUs keep
  reporting. A GPU that cannot even be enumerated (``nvmlDeviceGetHandleByIndex`` or its UUID
  fails: lost, or any other NVML error) is reported the same way, under the identity it had
  at the last enumeration, or as ``UUID="unknown-gpu-<index>"`` when it never answered: a
  GPU never silently disappears from the samples.
- No nvidia-ml-py: one warning, the poller is disabled for good (``enabled`` False,
  ``disabled_reason``) and :meth:`poll` returns ``[]``.
- ``nvmlInit`` failing (no library, driver not loaded, no permission), or the driver going
  away later (``UNINITIALIZED``/``DRIVER_NOT_LOADED`` from any call): ``enabled`` is False,
  ``disabled_reason`` says why, GPUs seen before report ``gpu_up`` 0, and each later poll
  retries ``nvmlInit`` once its backoff has passed (``init_retry_seconds`` doubling up to
  ``init_retry_max_seconds``), counted in ``init_retries_total`` and
  ``init_failures_total``. A driver that loads after the agent started is picked up.
- Any other NVML error leaves that field out of this poll and is counted in
  ``errors_total`` (logged at most once a minute).

Samples carry ``host``, ``UUID``, ``gpu`` (index), ``modelName``, ``pci_bus_id`` and, for a
MIG instance, ``GPU_I_ID`` and ``mig_uuid``: dcgm-exporter's attribute names and device key
(:mod:`.identity`), so both sources line up.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from inferpath.collectors.catalog import NVML_CONVERSIONS, signal
from inferpath.collectors.identity import (
    GPU_INDEX,
    GPU_MIG_INSTANCE_ID,
    GPU_MODEL,
    GPU_PCI_BUS_ID,
    GPU_UUID,
    HOST,
)
from inferpath.collectors.prometheus import Sample
from inferpath.ratelimited_log import RateLimitedLog
from inferpath.vocabulary import GPU_UP, UNIT_RATIO

logger = logging.getLogger(__name__)

GPU_MIG_UUID = "mig_uuid"
PROCESS_PID = "process.pid"
UNKNOWN_GPU_UUID = "unknown-gpu-{index}"
"""``UUID`` of a GPU that failed at its first enumeration (its real UUID was never read)."""
_LOG_INTERVAL_SECONDS = 60.0
_SOURCE_METRIC = "nvml"


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine (no nvidia-ml-py, no library or no driver)."""


class FieldNotSupported(Exception):
    """The device does not support this query (``NVML_ERROR_NOT_SUPPORTED``)."""


class GpuLost(Exception):
    """The GPU fell off the bus (``NVML_ERROR_GPU_IS_LOST``)."""


@dataclass(frozen=True)
class Device:
    """One pollable device: a whole GPU or a MIG instance (``mig_instance_id`` set).

    ``uuid`` is the physical GPU's UUID in both cases (dcgm-exporter labels MIG series with
    the parent's ``UUID`` and a ``GPU_I_ID``); ``mig_uuid`` is the instance's own ``MIG-…``.
    """

    handle: Any
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    mig_instance_id: int | None = None
    mig_uuid: str = ""
    unreadable: str = ""  # why the device could not be enumerated (handle None); "" when it could


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlAdapter:
    """The only code that calls NVML. ``pynvml``: the nvidia-ml-py module, or a fake of it.

    Translates ``NVMLError`` into :class:`FieldNotSupported`, :class:`GpuLost` and
    :class:`NvmlUnavailable` (the driver gone: ``UNINITIALIZED``, ``DRIVER_NOT_LOADED``,
    ``LIBRARY_NOT_FOUND``); other NVML errors propagate as they are. ``initialized``: True
    between a successful :meth:`init` and :meth:`shutdown` (or the driver going away).
    """

    def __init__(self, pynvml: Any) -> None:
        self.nvml = pynvml
        self.calls_total = 0
        self.initialized = False
        self._not_supported = pynvml.NVML_ERROR_NOT_SUPPORTED
        self._lost = pynvml.NVML_ERROR_GPU_IS_LOST
        self._not_found = pynvml.NVML_ERROR_NOT_FOUND
        self._driver_gone = {
            getattr(pynvml, name)
            for name in ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_UNINITIALIZED")
            if hasattr(pynvml, name)
        }
        self._memory_v2 = getattr(pynvml, "nvmlMemory_v2", None)
        self._function_not_found = getattr(pynvml, "NVML_ERROR_FUNCTION_NOT_FOUND", None)
        # Newer drivers renamed throttle reasons "clocks event reasons"; use what exists.
        self._event_reasons = (
            getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """Call one NVML function, translating its errors (see the class docstring)."""
        self.calls_total += 1
        try:
            return function(*args)
        except self.nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == self._not_supported:
                raise FieldNotSupported(str(exc)) from None
            if code == self._lost:
                raise GpuLost(str(exc)) from None
            if code in self._driver_gone:
                self.initialized = False
                raise NvmlUnavailable(f"NVML stopped answering: {exc}") from None
            raise

    def init(self) -> None:
        """``nvmlInit``; raises :class:`NvmlUnavailable` with the driver's words when it fails."""
        self.calls_total += 1
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML could not start: {exc}") from exc
        self.initialized = True

    def shutdown(self) -> None:
        """``nvmlShutdown``, ignoring errors (the driver may be gone already)."""
        self.initialized = False
        try:
            self.calls_total += 1
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down anyway
            logger.debug("nvmlShutdown failed", exc_info=True)

    def devices(self) -> list[Device]:
        """Every GPU, or its MIG instances where MIG is enabled. A GPU that cannot be
        enumerated (lost, or another NVML error) is listed with ``handle`` None, ``uuid`` ""
        and the error in ``unreadable``; :class:`NvmlUnavailable` (driver gone) propagates."""
        nvml = self.nvml
        found: list[Device] = []
        for index in range(self.call(nvml.nvmlDeviceGetCount)):
            try:
                handle = self.call(nvml.nvmlDeviceGetHandleByIndex, index)
                uuid = _text(self.call(nvml.nvmlDeviceGetUUID, handle))
                name = _text(self.call(nvml.nvmlDeviceGetName, handle))
                bus_id = _text(self.call(nvml.nvmlDeviceGetPciInfo, handle).busId)
            except GpuLost as exc:
                found.append(Device(None, index, "", "", "", unreadable=f"GPU is lost ({exc})"))
                continue
            except nvml.NVMLError as exc:
                found.append(Device(None, index, "", "", "", unreadable=f"cannot be read ({exc})"))
                continue
            found.append(Device(handle, index, uuid, name, bus_id))
            found.extend(self._mig_devices(handle, index, uuid, name, bus_id))
        return found

    def _mig_devices(self, handle: Any, index: int, uuid: str, name: str, bus_id: str) -> list[Device]:
        nvml = self.nvml
        try:
            current, _pending = self.call(nvml.nvmlDeviceGetMigMode, handle)
        except (FieldNotSupported, GpuLost):
            return []
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        instances = []
        for slot in range(self.call(nvml.nvmlDeviceGetMaxMigDeviceCount, handle)):
            try:
                mig = self.call(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == self._not_found:
                    continue  # an empty slot
                raise
            instance_id = int(self.call(nvml.nvmlDeviceGetGpuInstanceId, mig))
            mig_uuid = _text(self.call(nvml.nvmlDeviceGetUUID, mig))
            instances.append(Device(mig, index, uuid, name, bus_id, instance_id, mig_uuid))
        return instances

    # One method per reading; each returns raw NVML units.
    def utilization_percent(self, handle: Any) -> float:
        return float(self.call(self.nvml.nvmlDeviceGetUtilizationRates, handle).gpu)

    def memory_bytes(self, handle: Any) -> tuple[float, float, float]:
        """(used, free, total) bytes, ``used`` without the driver's reserved memory: NVML's
        v2 memory call (drivers R510 on), what nvidia-smi's ``memory.used`` and
        dcgm-exporter's ``DCGM_FI_DEV_FB_USED`` report. The v1 call, where the driver or
        nvidia-ml-py has no v2, counts the reserved part as used (615 MiB on an idle H200)."""
        if self._memory_v2 is not None:
            try:
                info = self.call(self.nvml.nvmlDeviceGetMemoryInfo, handle, self._memory_v2)
                return float(info.used), float(info.free), float(info.total)
            except self.nvml.NVMLError as exc:
                if getattr(exc, "value", None) != self._function_not_found:
                    raise
                self._memory_v2 = None  # a driver before R510: v1 from now on
        info = self.call(self.nvml.nvmlDeviceGetMemoryInfo, handle)
        return float(info.used), float(info.free), float(info.total)

    def power_milliwatts(self, handle: Any) -> float:
        return float(self.call(self.nvml.nvmlDeviceGetPowerUsage, handle))

    def temperature_celsius(self, handle: Any) -> float:
        return float(self.call(self.nvml.nvmlDeviceGetTemperature, handle, self.nvml.NVML_TEMPERATURE_GPU))

    def sm_clock_mhz(self, handle: Any) -> float:
        return float(self.call(self.nvml.nvmlDeviceGetClockInfo, handle, self.nvml.NVML_CLOCK_SM))

    def memory_clock_mhz(self, handle: Any) -> float:
        return float(self.call(self.nvml.nvmlDeviceGetClockInfo, handle, self.nvml.NVML_CLOCK_MEM))

    def clock_event_reasons(self, handle: Any) -> float:
        return float(self.call(self._event_reasons, handle))

    def process_memory_bytes(self, handle: Any) -> list[tuple[int, float]]:
        """(pid, used bytes) of each compute process; processes whose usage NVML hides are left out."""
        processes = self.call(self.nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        return [(int(p.pid), float(p.usedGpuMemory)) for p in processes if p.usedGpuMemory is not None]


# Field name -> (adapter method, [(catalog NVML key, index into a tuple result or None)]).
_FIELDS: tuple[tuple[str, str, tuple[tuple[str, int | None], ...]], ...] = (
    ("utilization", "utilization_percent", (("nvmlDeviceGetUtilizationRates.gpu", None),)),
    (
        "memory",
        "memory_bytes",
        (
            ("nvmlDeviceGetMemoryInfo.used", 0),
            ("nvmlDeviceGetMemoryInfo.free", 1),
            ("nvmlDeviceGetMemoryInfo.total", 2),
        ),
    ),
    ("power", "power_milliwatts", (("nvmlDeviceGetPowerUsage", None),)),
    ("temperature", "temperature_celsius", (("nvmlDeviceGetTemperature", None),)),
    ("sm_clock", "sm_clock_mhz", (("nvmlDeviceGetClockInfo.sm", None),)),
    ("memory_clock", "memory_clock_mhz", (("nvmlDeviceGetClockInfo.mem", None),)),
    ("clock_event_reasons", "clock_event_reasons", (("nvmlDeviceGetCurrentClocksEventReasons", None),)),
)
_PROCESS_FIELD = "process_memory"
# Resolved once: (field, adapter method, [(signal, convert, unit, tuple position, NVML name)]).
_READERS = tuple(
    (
        field_name,
        method,
        tuple(
            (NVML_CONVERSIONS[key][0], NVML_CONVERSIONS[key][1], signal(NVML_CONVERSIONS[key][0]).unit, position, key)
            for key, position in outputs
        ),
    )
    for field_name, method, outputs in _FIELDS
)


class NvmlPoller:
    """Reads every device through ``adapter`` and returns canonical :class:`Sample` rows.

    ``adapter``: an :class:`NvmlAdapter` (already initialised; see :meth:`from_system`) or
    ``None`` for a disabled poller, in which case ``disabled_reason`` says why.
    ``host``: the ``host`` attribute (default: this machine's name). ``interval_seconds``:
    the poll period the caller should keep (default 1 s). ``process_interval_seconds``:
    period of the per-process memory query. ``retry_unsupported_seconds``: how long a
    NotSupported field is not asked again. ``init_retry_seconds``/``init_retry_max_seconds``:
    first and longest wait between ``nvmlInit`` retries while NVML does not start (doubling).
    ``monotonic``/``wall_clock``: clocks (tests). An adapter that is not initialised is
    started by the first :meth:`poll`. Counters: ``polls_total``, ``errors_total``,
    ``init_retries_total`` (``nvmlInit`` attempts made by polls, after a failed or no start),
    ``init_failures_total``.
    """

    def __init__(
        self,
        adapter: NvmlAdapter | None,
        *,
        host: str | None = None,
        interval_seconds: float = 1.0,
        process_interval_seconds: float = 10.0,
        retry_unsupported_seconds: float = 600.0,
        topology_refresh_seconds: float = 60.0,
        disabled_reason: str = "",
        init_retry_seconds: float = 5.0,
        init_retry_max_seconds: float = 300.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        if interval_seconds <= 0:
            raise ValueError(f"interval_seconds: must be > 0, got {interval_seconds}")
        if not 0 < init_retry_seconds <= init_retry_max_seconds:
            raise ValueError(
                f"init_retry_seconds: must be > 0 and <= init_retry_max_seconds, got "
                f"{init_retry_seconds} and {init_retry_max_seconds}"
            )
        self.adapter = adapter
        self.host = host or socket.gethostname()
        self.interval_seconds = interval_seconds
        self.process_interval_seconds = process_interval_seconds
        self.retry_unsupported_seconds = retry_unsupported_seconds
        self.topology_refresh_seconds = topology_refresh_seconds
        self.disabled_reason = disabled_reason if adapter is None else ""
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self._devices: list[Device] = []
        self._attributes: dict[tuple[str, int | None], dict[str, str]] = {}
        self._devices_at = float("-inf")
        self._processes_at = float("-inf")
        # (device key, field) -> monotonic time until which it is not asked again.
        self.unsupported: dict[tuple[tuple[str, int | None], str], float] = {}
        self.lost: set[str] = set()
        self.polls_total = 0
        self.errors_total = 0
        self.init_retry_seconds = init_retry_seconds
        self.init_retry_max_seconds = init_retry_max_seconds
        self.init_retries_total = 0
        self.init_failures_total = 0
        self._init_backoff_s = init_retry_seconds
        self._next_init_at = float("-inf")  # an adapter given uninitialised starts at the first poll
        self._failure_log = RateLimitedLog(logger, _LOG_INTERVAL_SECONDS)
        self._init_log = RateLimitedLog(logger, _LOG_INTERVAL_SECONDS, clock=monotonic)

    @classmethod
    def from_system(cls, **kwargs: Any) -> NvmlPoller:
        """A poller over the real driver: imports ``pynvml`` and calls ``nvmlInit``.

        Never raises for a missing package, library or driver: it logs one warning. Without
        nvidia-ml-py the poller is disabled for good; when ``nvmlInit`` fails, later polls
        retry it with backoff (class docstring). ``kwargs`` as for the constructor.
        """
        try:
            import pynvml  # noqa: PLC0415 - optional dependency, imported only when polling
        except ImportError:
            return cls._disabled("nvidia-ml-py is not installed (pip install 'inferpath[collectors]')", kwargs)
        adapter = NvmlAdapter(pynvml)
        poller = cls(adapter, **kwargs)
        try:
            adapter.init()
        except NvmlUnavailable as exc:
            poller.init_failures_total += 1
            poller._init_failed(exc, poller._monotonic(), first=True)
        return poller

    @classmethod
    def _disabled(cls, reason: str, kwargs: dict) -> NvmlPoller:
        logger.warning("NVML collector off: %s", reason)
        return cls(None, disabled_reason=reason, **kwargs)

    @property
    def enabled(self) -> bool:
        """True while NVML is started and devices are read; False when it is unavailable (see
        ``disabled_reason``; polls keep retrying ``nvmlInit`` unless nvidia-ml-py is missing)."""
        return self.adapter is not None and self.adapter.initialized

    def close(self) -> None:
        """Shut NVML down; the poller is disabled afterwards."""
        if self.adapter is not None:
            self.adapter.shutdown()
            self.adapter = None
            self.disabled_reason = "closed"

    def poll(self) -> list[Sample]:
        """One reading of every device; never raises (errors are counted, see the module docstring)."""
        if self.adapter is None:
            return []
        self.polls_total += 1
        now = self._monotonic()
        timestamp = self._wall_clock()
        if not self.adapter.initialized and not self._start(now):
            return self._all_down(self._devices, timestamp)
        try:
            if now - self._devices_at >= self.topology_refresh_seconds:
                self._refresh_devices(now)
        except NvmlUnavailable as exc:
            self._init_failed(exc, now)
            return self._all_down(self._devices, timestamp)
        except Exception as exc:  # noqa: BLE001 - a collector never stops its loop
            self._failed("listing devices", exc)
            return self._all_down(self._devices, timestamp)
        with_processes = now - self._processes_at >= self.process_interval_seconds
        if with_processes:
            self._processes_at = now
        samples: list[Sample] = []
        readers = [(field_name, getattr(self.adapter, method), outputs) for field_name, method, outputs in _READERS]
        for position, device in enumerate(self._devices):
            try:
                self._poll_device(device, readers, timestamp, now, with_processes, samples)
            except NvmlUnavailable as exc:  # the driver went away mid-poll: the rest cannot be read
                self._init_failed(exc, now)
                samples.extend(self._all_down(self._devices[position:], timestamp))
                break
        return samples

    def _all_down(self, devices: list[Device], timestamp: datetime) -> list[Sample]:
        """``gpu_up`` 0 for each of ``devices`` (known, but unreadable now)."""
        return [
            Sample(
                GPU_UP,
                0.0,
                "gauge",
                UNIT_RATIO,
                self._attributes[(d.uuid, d.mig_instance_id)],
                timestamp,
                _SOURCE_METRIC,
            )
            for d in devices
        ]

    def _adapter(self) -> NvmlAdapter:
        """The adapter; ``RuntimeError`` once :meth:`close` released it."""
        if self.adapter is None:
            raise RuntimeError("the NVML poller is closed")
        return self.adapter

    def _start(self, now: float) -> bool:
        """Retry ``nvmlInit`` when its backoff has passed; True once NVML is started."""
        if now < self._next_init_at:
            return False
        self.init_retries_total += 1
        try:
            self._adapter().init()
        except NvmlUnavailable as exc:
            self.init_failures_total += 1
            self._init_failed(exc, now)
            return False
        logger.info(
            "NVML started after %d %s", self.init_retries_total, "retry" if self.init_retries_total == 1 else "retries"
        )
        self.disabled_reason = ""
        self._init_backoff_s = self.init_retry_seconds
        self.lost.clear()  # a restarted driver enumerates its GPUs afresh
        self._devices_at = float("-inf")
        return True

    def _init_failed(self, exc: Exception, now: float, *, first: bool = False) -> None:
        """NVML is not usable: say why, schedule the next ``nvmlInit`` with backoff."""
        if self.adapter is not None:
            self.adapter.initialized = False
        wait = self._init_backoff_s
        self._next_init_at = now + wait
        self._init_backoff_s = min(wait * 2, self.init_retry_max_seconds)
        self.disabled_reason = f"{exc} (no NVIDIA driver on this machine?)" if first else str(exc)
        self._init_log.warning(
            "NVML collector off: %s; retrying nvmlInit in %.0f s (backoff up to %.0f s)",
            self.disabled_reason,
            wait,
            self.init_retry_max_seconds,
        )

    def _refresh_devices(self, now: float) -> None:
        devices = self._adapter().devices()
        known_gpus = {d.index: d for d in self._devices if d.mig_instance_id is None}
        for position, device in enumerate(devices):
            if device.unreadable:
                # Keep the identity it had, so its series continue and turn gpu_up 0.
                known = known_gpus.get(device.index)
                device = (
                    replace(known, handle=None, unreadable=device.unreadable)
                    if known is not None
                    else replace(device, uuid=UNKNOWN_GPU_UUID.format(index=device.index))
                )
                devices[position] = device
                self._mark_lost(device, device.uuid, device.unreadable)
                for instance in self._devices:  # its MIG instances went with it
                    if instance.index == device.index and instance.mig_instance_id is not None:
                        self._mark_lost(instance, instance.mig_uuid, device.unreadable)
        # A lost GPU may no longer enumerate; keep it listed so that it keeps reporting gpu_up 0.
        listed = {(d.uuid, d.mig_instance_id) for d in devices}
        devices += [
            d
            for d in self._devices
            if (d.mig_uuid or d.uuid) in self.lost and (d.uuid, d.mig_instance_id) not in listed
        ]
        self._devices = devices
        self._devices_at = now
        self._attributes = {}
        for d in self._devices:
            attributes = {
                HOST: self.host,
                GPU_UUID: d.uuid,
                GPU_INDEX: str(d.index),
                GPU_MODEL: d.name,
                GPU_PCI_BUS_ID: d.pci_bus_id,
            }
            if d.mig_instance_id is not None:
                attributes[GPU_MIG_INSTANCE_ID] = str(d.mig_instance_id)
                attributes[GPU_MIG_UUID] = d.mig_uuid
            self._attributes[(d.uuid, d.mig_instance_id)] = {k: v for k, v in attributes.items() if v}

    def _poll_device(
        self,
        device: Device,
        readers: list,
        timestamp: datetime,
        now: float,
        with_processes: bool,
        samples: list[Sample],
    ) -> None:
        key = (device.uuid, device.mig_instance_id)
        # One attribute dict per device, shared by its samples (they are never mutated).
        attributes = self._attributes[key]
        lost_key = device.mig_uuid or device.uuid
        if lost_key in self.lost:
            samples.append(Sample(GPU_UP, 0.0, "gauge", UNIT_RATIO, attributes, timestamp, _SOURCE_METRIC))
            return
        unsupported = self.unsupported
        handle = device.handle
        append = samples.append
        for field_name, read, outputs in readers:
            if unsupported:
                until = unsupported.get((key, field_name))
                if until is not None:
                    if now < until:
                        continue
                    del unsupported[(key, field_name)]
            try:
                reading = read(handle)
            except FieldNotSupported:
                unsupported[(key, field_name)] = now + self.retry_unsupported_seconds
                continue
            except GpuLost:
                self._mark_lost(device, lost_key)
                samples.append(Sample(GPU_UP, 0.0, "gauge", UNIT_RATIO, attributes, timestamp, _SOURCE_METRIC))
                return
            except NvmlUnavailable:
                raise
            except Exception as exc:  # noqa: BLE001 - one failing field must not stop the poll
                self._failed(f"{field_name} of GPU {device.uuid}", exc)
                continue
            for name, convert, unit, position, nvml_key in outputs:
                value = reading if position is None else reading[position]
                append(Sample(name, convert(value), "gauge", unit, attributes, timestamp, nvml_key))
        append(Sample(GPU_UP, 1.0, "gauge", UNIT_RATIO, attributes, timestamp, _SOURCE_METRIC))
        if with_processes and (key, _PROCESS_FIELD) not in unsupported:
            self._poll_processes(device, key, attributes, timestamp, now, samples)

    def _poll_processes(
        self,
        device: Device,
        key: tuple,
        attributes: dict[str, str],
        timestamp: datetime,
        now: float,
        samples: list[Sample],
    ) -> None:
        try:
            processes = self._adapter().process_memory_bytes(device.handle)
        except FieldNotSupported:
            self.unsupported[(key, _PROCESS_FIELD)] = now + self.retry_unsupported_seconds
            return
        except GpuLost:
            self._mark_lost(device, device.mig_uuid or device.uuid)
            return
        except NvmlUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001
            self._failed(f"processes of GPU {device.uuid}", exc)
            return
        name, convert = NVML_CONVERSIONS["nvmlDeviceGetComputeRunningProcesses.usedGpuMemory"]
        for pid, used in processes:
            samples.append(
                Sample(
                    name,
                    convert(used),
                    "gauge",
                    "By",
                    {**attributes, PROCESS_PID: str(pid)},
                    timestamp,
                    "nvmlDeviceGetComputeRunningProcesses.usedGpuMemory",
                )
            )

    def _mark_lost(self, device: Device, lost_key: str, reason: str = "GPU is lost") -> None:
        if lost_key not in self.lost:
            self.lost.add(lost_key)
            logger.error(
                "GPU %s (index %d): %s; reported as gpu_up 0, the other GPUs keep reporting",
                lost_key,
                device.index,
                reason,
            )

    def _failed(self, what: str, exc: Exception) -> None:
        self.errors_total += 1
        self._failure_log.warning("NVML read of %s failed: %s", what, exc)
