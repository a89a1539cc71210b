"""The demo's fault scenarios, diagnosed on a quiet machine and beside a CPU-burning neighbour.

Usage::

    python bench/scenarios_under_load.py [--burners 2] [--only kv-pressure,batch-window]

Runs every scenario of :mod:`inferpath.demo.scenarios` (real processes: server, emulated
engine, gateway) twice: first with nothing else started, then with ``--burners`` processes
spinning on the CPU (one per core by default) at normal priority for the whole run. Prints the
confusion table of each pass and the load average seen, and exits 1 unless both passes name
every scenario correctly. One run per scenario and pass, no retry: this measures how often a
verdict survives outside load.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

from inferpath.demo.scenarios import SCENARIOS, ScenarioOptions, confusion_table, run_scenario


def _burn(stop_at: float) -> None:
    value = 0
    while time.time() < stop_at:
        value = (value * 1103515245 + 12345) & 0x7FFFFFFF


def run_pass(names: list[str], burners: int, log_root: Path) -> tuple[list, float, float]:
    """Run ``names`` once each with ``burners`` CPU-burning processes; (outcomes, wall s, max load)."""
    procs = [multiprocessing.Process(target=_burn, args=(time.time() + 3600,), daemon=True) for _ in range(burners)]
    for proc in procs:
        proc.start()
    outcomes, peak = [], 0.0
    started = time.monotonic()
    try:
        for name in names:
            outcomes.append(
                run_scenario(name, ScenarioOptions(log_dir=log_root / f"{burners}-{name}"), log=lambda _line: None)
            )
            peak = max(peak, os.getloadavg()[0])
            print(f"  {name}: {outcomes[-1].diagnosed_cause} ({'ok' if outcomes[-1].correct else 'WRONG'})", flush=True)
    finally:
        for proc in procs:
            proc.terminate()
    return outcomes, time.monotonic() - started, peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not 0 <= args.burners <= 64:
        parser.error(
            f"unknown scenario(s) {unknown}; one of {', '.join(SCENARIOS)}" if unknown else "--burners must be in 0..64"
        )
    log_root = Path(tempfile.mkdtemp(prefix="inferpath-scenarios-"))
    all_correct = True
    for burners in (0, args.burners):
        print(f"pass with {burners} CPU-burning process(es):", flush=True)
        outcomes, wall, peak = run_pass(names, burners, log_root)
        print(confusion_table(outcomes))
        print(f"wall {wall:.0f} s, peak load average {peak:.1f}\n", flush=True)
        all_correct &= all(o.correct for o in outcomes)
    return 0 if all_correct else 1


if __name__ == "__main__":
    sys.exit(main())
