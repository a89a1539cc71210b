"""Benchmark: a decode worker's CPU per span with Python's default garbage-collector
thresholds against the server's (``server/memory.py: tune_gc_for_server``).

A worker's whole reply to one 1000-span export (100 traces of 10 vLLM-like spans, as
``server_ingest.py`` sends): decoding the protobuf body, writing the Native block, the
derivation views, the pickle (``server/decode_workers.py: _reply``). Both settings are
measured in this process, alternating, best of ``--repeat`` rounds of ``--loops`` exports:

- reference: the interpreter's defaults (``gc.set_threshold(700, 10, 10)``, nothing frozen);
- tuned: what a worker runs with (start-up frozen, ``SERVER_GC_THRESHOLDS``).

Collections are counted per round with ``gc.callbacks``. ``python bench/worker_gc.py
[--repeat 5] [--loops 100]``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratch import scratch_folder  # noqa: E402
from server.otlp_factory import trace_body  # noqa: E402

from inferpath.server import decode_workers  # noqa: E402
from inferpath.server.memory import SERVER_GC_THRESHOLDS, tune_gc_for_server  # noqa: E402
from inferpath.storage.rows import SPAN_COLUMNS  # noqa: E402
from inferpath.storage.store import Store  # noqa: E402

DEFAULT_THRESHOLDS = (700, 10, 10)
SPANS_PER_EXPORT = 1000


def _defaults() -> None:
    gc.unfreeze()
    gc.set_threshold(*DEFAULT_THRESHOLDS)


def _round(bodies: list[bytes], native_types: tuple[str, ...], loops: int) -> tuple[float, int]:
    """CPU µs per span and the number of collections over ``loops`` replies."""
    collections = [0]

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections[0] += 1

    gc.callbacks.append(count)
    try:
        started = time.process_time()
        for index in range(loops):
            reply = decode_workers._reply("application/x-protobuf", None, 0, native_types,
                                          bodies[index % len(bodies)])
            pickle.dumps(reply, protocol=5)
        seconds = time.process_time() - started
    finally:
        gc.callbacks.remove(count)
    return seconds / (loops * SPANS_PER_EXPORT) * 1e6, collections[0]


def _check_arguments(repeat: int, loops: int) -> None:
    """Raise ``ValueError`` naming the first of ``repeat``, ``loops`` below 1."""
    for name, value in (("repeat", repeat), ("loops", loops)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def run(repeat: int = 5, loops: int = 100, workdir: str | None = None) -> dict:
    """Both settings; ``{"default": figures, "tuned": figures, "tuned_over_default": ratio}``.
    Leaves the process with the thresholds it had and nothing frozen. Raises ``ValueError``
    for ``repeat`` or ``loops`` < 1."""
    _check_arguments(repeat, loops)
    with scratch_folder(workdir, "inferpath-bench-") as folder, Store.open(f"chdb://{folder / 'store'}") as store:
        native_types = store.column_types("otel_traces", SPAN_COLUMNS)
    bodies = [trace_body(spans_per_trace=10, traces=SPANS_PER_EXPORT // 10)[0] for _ in range(min(loops, 20))]
    best = {"default": (float("inf"), 0), "tuned": (float("inf"), 0)}
    thresholds = gc.get_threshold()
    try:
        for _ in range(repeat):
            for name, prepare in (("default", _defaults), ("tuned", tune_gc_for_server)):
                prepare()
                figures = _round(bodies, native_types, loops)
                best[name] = min(best[name], figures)
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    out = {name: {"thresholds": list(DEFAULT_THRESHOLDS if name == "default" else SERVER_GC_THRESHOLDS),
                  "cpu_us_per_span": round(cpu, 3), "collections_per_export": round(count / loops, 2)}
           for name, (cpu, count) in best.items()}
    out["tuned_over_default"] = round(out["tuned"]["cpu_us_per_span"] / out["default"]["cpu_us_per_span"], 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--repeat", type=int, default=5, help="rounds per setting (best kept)")
    parser.add_argument("--loops", type=int, default=100, help="exports per round")
    args = parser.parse_args()
    try:
        _check_arguments(args.repeat, args.loops)
    except ValueError as exc:
        parser.error(str(exc))
    result = run(args.repeat, args.loops)
    print(json.dumps(result, indent=2))
    print(f"worker CPU per span: default thresholds {result['default']['cpu_us_per_span']} µs, the server's "
          f"{result['tuned']['cpu_us_per_span']} µs: ratio {result['tuned_over_default']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
