"""Benchmark: NVML poller overhead per GPU per poll beyond the NVML calls themselves.

A fake pynvml (``tests/collectors/fake_pynvml.py``, recorded L40S readings) busy-waits
``--call-latency-us`` in every call, as a driver round trip would. Reference, same run:
the same NVML calls made directly in a loop over the same fake (what any poller must
pay). Overhead = (poll time - reference time) / GPUs. Target: ≤ 20 µs per GPU per poll.

Run: ``python bench/collectors_nvml.py [--gpus 8] [--call-latency-us 20] [--polls 2000]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "collectors"))

from fake_pynvml import FakePynvml, l40s  # noqa: E402

from inferpath.collectors.nvml import NvmlAdapter, NvmlPoller  # noqa: E402


def direct_calls(nvml, handles: list) -> None:
    """Exactly the NVML calls one poll makes per GPU (processes excluded: they run every 10 s),
    on ``nvml`` (the fake here, the real ``pynvml`` in ``nvml_device_check.py``)."""
    for handle in handles:
        nvml.nvmlDeviceGetUtilizationRates(handle)
        nvml.nvmlDeviceGetMemoryInfo(handle, nvml.nvmlMemory_v2)
        nvml.nvmlDeviceGetPowerUsage(handle)
        nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
        nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)
        nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)


def run(gpus: int = 8, call_latency_us: float = 20.0, polls: int = 2000) -> dict:
    """Per-GPU poll time, reference time and overhead, in µs."""
    fake = FakePynvml(
        [l40s(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000") for i in range(gpus)],
        latency_seconds=call_latency_us / 1e6,
    )
    adapter = NvmlAdapter(fake)
    adapter.init()
    # Process memory every 10 s: outside a 1 s poll's steady state, so off here.
    poller = NvmlPoller(adapter, host="bench", process_interval_seconds=float("inf"))
    poller.poll()  # lists devices (once a minute in production)
    handles = [fake.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
    best_poll = best_reference = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(polls):
            samples = poller.poll()
        best_poll = min(best_poll, (time.perf_counter() - start) / polls)
        start = time.perf_counter()
        for _ in range(polls):
            direct_calls(fake, handles)
        best_reference = min(best_reference, (time.perf_counter() - start) / polls)
    assert len(samples) == gpus * 10
    return {
        "gpus": gpus,
        "call_latency_us": call_latency_us,
        "poll_us_per_gpu": best_poll / gpus * 1e6,
        "reference_us_per_gpu": best_reference / gpus * 1e6,
        "overhead_us_per_gpu": (best_poll - best_reference) / gpus * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--call-latency-us", type=float, default=20.0)
    parser.add_argument("--polls", type=int, default=2000)
    args = parser.parse_args()
    result = run(args.gpus, args.call_latency_us, args.polls)
    print(
        f"{result['gpus']} GPUs, NVML call latency {result['call_latency_us']:g} µs: "
        f"poll {result['poll_us_per_gpu']:.1f} µs/GPU, NVML calls alone {result['reference_us_per_gpu']:.1f} µs/GPU, "
        f"overhead {result['overhead_us_per_gpu']:.1f} µs/GPU (target ≤ 20)"
    )


if __name__ == "__main__":
    main()
