"""A check of the NVML collector on a real NVIDIA GPU: readings, load response, overhead, export.

Run by hand on a machine with a GPU, its driver, ``nvidia-ml-py`` and PyTorch (the load):
``python bench/nvml_device_check.py --out DIR``. Nothing here runs in CI (no GPU there);
the unit tests use a fake NVML (``tests/collectors/fake_pynvml.py``).

What it does, in one run of about a minute:

1. Reference: ``nvidia-smi --query-gpu=... -lms 500`` in the background (the driver's own
   tool), written to ``DIR/nvidia_smi.csv``.
2. Phases: 5 s idle, 15 s of load (a child process holds ``--load-gib`` of device memory and
   runs bf16 8192x8192 matrix products without pause), 6 s idle after. Meanwhile
   :class:`~inferpath.collectors.nvml.NvmlPoller` over the real ``pynvml`` polls every 0.5 s
   (per-process memory every 2 s), and :func:`~inferpath.collectors.agent.run_agent` (the
   code ``inferpath collect --nvml`` runs) pushes its own polls to a loopback OTLP receiver
   that keeps every body (``DIR/otlp_metrics.bin``: 4-byte big-endian length, then the
   protobuf body, per export).
3. Overhead: ``--polls`` polls against the same NVML calls made directly in a loop (the
   reference of ``bench/collectors_nvml.py``, here with the real driver's latency).

Checks (each printed PASS/FAIL, all in ``DIR/nvml_check.json``): every GPU reports
``gpu_up`` 1 and the core fields; the load phase's median utilization ≥ 0.9 and the idle
phase's ≤ 0.1; device memory used grows by at least 90 % of the load's allocation and the
load's process is reported with at least that much; during load the poller's medians agree
with ``nvidia-smi``'s (utilization within 0.05, memory within 2 %, power within 15 %); the
agent's exports all got 200 and carry the GPU signals.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from collectors_nvml import direct_calls  # noqa: E402

from inferpath.collectors.nvml import NvmlPoller  # noqa: E402

LOAD = """
import sys, time, torch
gib, seconds = float(sys.argv[1]), float(sys.argv[2])
hold = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("loaded", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
"""

SMI_FIELDS = "timestamp,index,uuid,utilization.gpu,memory.used,memory.total,power.draw,clocks.sm"


class _Receiver(BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/metrics":
            type(self).bodies.append(body)
            self.send_response(200)
        else:
            self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--load-gib", type=float, default=16.0)
    parser.add_argument("--polls", type=int, default=300)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    checks: dict[str, bool] = {}
    result: dict = {"checks": checks}

    smi_csv = (args.out / "nvidia_smi.csv").open("w")
    smi = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits", "-lms", "500"],
        stdout=smi_csv,
        stderr=subprocess.STDOUT,
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = threading.Event()
    agent_stats: dict = {}

    def agent() -> None:
        from inferpath.collectors.agent import run_agent

        stats = run_agent(f"http://127.0.0.1:{server.server_port}", nvml=True, scrape_targets=[], stop_event=stop)
        agent_stats.update(vars(stats))

    agent_thread = threading.Thread(target=agent, daemon=True)
    agent_thread.start()

    poller = NvmlPoller.from_system(host="nvml-check", process_interval_seconds=2.0)
    result["enabled"], result["disabled_reason"] = poller.enabled, poller.disabled_reason
    polls: list[tuple[str, float, list]] = []  # (phase, monotonic, samples)
    t0 = time.monotonic()

    def poll_for(phase: str, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            polls.append((phase, time.monotonic() - t0, poller.poll()))
            time.sleep(0.5)

    poll_for("idle_before", 5.0)
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(args.load_gib), "15"], stdout=subprocess.PIPE, text=True)
    assert load.stdout is not None
    load.stdout.readline()  # "loaded": memory held, products starting
    load_started = time.time()
    poll_for("warmup", 2.0)
    poll_for("load", 11.0)
    load.wait(timeout=60)
    load_ended = time.time()
    poll_for("idle_after", 6.0)
    stop.set()
    agent_thread.join(timeout=15)
    smi.terminate()
    smi.wait(timeout=10)
    smi_csv.close()
    server.shutdown()

    # Readings by phase.
    by_phase: dict[str, dict[str, list[float]]] = {}
    process_bytes: list[float] = []
    gpus: set[str] = set()
    for phase, _, samples in polls:
        for s in samples:
            gpus.add(s.attributes.get("UUID", "?"))
            by_phase.setdefault(phase, {}).setdefault(s.signal, []).append(s.value)
            if s.signal == "gpu_process_memory_used_bytes" and s.attributes.get("process.pid") == str(load.pid):
                process_bytes.append(s.value)
    result["gpus"] = sorted(gpus)
    result["first_poll"] = [
        {"signal": s.signal, "value": s.value, "unit": s.unit, "attributes": s.attributes} for s in polls[0][2]
    ]
    result["medians"] = {p: {k: _median(v) for k, v in sigs.items()} for p, sigs in by_phase.items()}
    idle, busy = result["medians"].get("idle_before", {}), result["medians"].get("load", {})
    core = ("gpu_up", "gpu_utilization_ratio", "gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_power_watts")
    checks["enabled and every core field read"] = bool(poller.enabled and gpus and all(k in idle for k in core))
    checks["gpu_up is 1"] = all(v == 1.0 for v in by_phase.get("load", {}).get("gpu_up", [0.0]))
    checks["idle utilization <= 0.1"] = idle.get("gpu_utilization_ratio", 1.0) <= 0.1
    checks["load utilization >= 0.9"] = busy.get("gpu_utilization_ratio", 0.0) >= 0.9
    grew = busy.get("gpu_memory_used_bytes", 0.0) - idle.get("gpu_memory_used_bytes", 0.0)
    result["memory_growth_gib"] = grew / (1 << 30)
    checks["memory used grew by >= 90 % of the load"] = grew >= 0.9 * args.load_gib * (1 << 30)
    result["load_process_memory_gib"] = max(process_bytes, default=0.0) / (1 << 30)
    checks["the load's process is reported with its memory"] = max(
        process_bytes, default=0.0
    ) >= 0.9 * args.load_gib * (1 << 30)
    result["power_watts"] = {"idle": idle.get("gpu_power_watts"), "load": busy.get("gpu_power_watts")}

    # nvidia-smi over the same load seconds (its timestamps: local wall clock, to the ms).
    rows = [line.split(", ") for line in (args.out / "nvidia_smi.csv").read_text().splitlines() if line.count(",") >= 7]
    result["nvidia_smi_rows"] = len(rows)

    def wall(text: str) -> float:
        return datetime.strptime(text, "%Y/%m/%d %H:%M:%S.%f").timestamp()

    in_load = [r for r in rows if load_started + 2.0 <= wall(r[0]) <= load_ended - 0.5]

    def smi(column: int) -> float | None:
        values = []
        for r in in_load:
            try:
                values.append(float(r[column]))
            except ValueError:
                pass
        return _median(values)

    smi_util, smi_mem, smi_power = smi(3), smi(4), smi(6)
    result["nvidia_smi_load_medians"] = {"util_percent": smi_util, "memory_used_mib": smi_mem, "power_w": smi_power}
    if smi_util is not None and busy:
        checks["utilization agrees with nvidia-smi (0.05)"] = (
            abs(busy["gpu_utilization_ratio"] - smi_util / 100) <= 0.05
        )
        checks["memory used agrees with nvidia-smi (2 %)"] = (
            abs(busy["gpu_memory_used_bytes"] / (1 << 20) - smi_mem) <= 0.02 * smi_mem
        )
        checks["power agrees with nvidia-smi (15 %)"] = abs(busy["gpu_power_watts"] - smi_power) <= 0.15 * smi_power

    # Overhead: polls against the same NVML calls made directly.
    import pynvml

    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    poller.process_interval_seconds = float("inf")
    best_poll = best_direct = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(args.polls):
            poller.poll()
        best_poll = min(best_poll, (time.perf_counter() - start) / args.polls)
        start = time.perf_counter()
        for _ in range(args.polls):
            direct_calls(pynvml, handles)
        best_direct = min(best_direct, (time.perf_counter() - start) / args.polls)
    n = max(1, len(handles))
    result["overhead_us_per_gpu"] = {
        "poll": best_poll / n * 1e6,
        "nvml_calls_alone": best_direct / n * 1e6,
        "overhead": (best_poll - best_direct) / n * 1e6,
    }
    poller.close()

    with (args.out / "otlp_metrics.bin").open("wb") as f:
        for body in _Receiver.bodies:
            f.write(struct.pack(">I", len(body)) + body)
    result["agent"] = agent_stats | {"bodies": len(_Receiver.bodies)}
    checks["agent exports all answered 200"] = bool(_Receiver.bodies and agent_stats.get("export_failures_total") == 0)
    (args.out / "nvml_check.json").write_text(json.dumps(result, indent=2, default=str))
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    print(json.dumps({k: result[k] for k in ("gpus", "medians", "overhead_us_per_gpu", "agent")}, default=str)[:4000])
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
