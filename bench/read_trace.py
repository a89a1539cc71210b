"""Benchmark: one trace by id (``GET /api/v1/traces/{id}``'s query), against the
OpenTelemetry Collector ClickHouse exporter's documented trace lookup.

Fills a fresh embedded store with :mod:`synthetic` (``--spans`` spans of 10 per trace over
one day, generated inside ClickHouse; ``otel_traces_trace_id_ts`` is fed by its
materialized view), then, in the same run and on the same store, alternating per lookup:

- the reference: the exporter's documented query, one statement whose ``WITH`` scalar
  subqueries take the trace's bounds from ``otel_traces_trace_id_ts`` (run through the
  same clickhouse-connect client, with the same columns, order and ``LIMIT 1 BY``);
- :meth:`inferpath.storage.reader.Reader.trace_spans`: the bounds first (one thread), then
  the spans between them.

Each side looks up ``--lookups`` stored trace ids (random, the same ones) and as many
unknown ids (the common case while a client polls for a trace not yet inserted), and
must return the same spans. Printed per case: CPU milliseconds per lookup (this
process, chDB's threads included) and wall milliseconds, and the ratio reference / inferpath.

``python bench/read_trace.py [--spans 2000000] [--lookups 200] [--store DIR]``
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic  # noqa: E402  (a sibling module of the benchmarks)
from scratch import scratch_folder  # noqa: E402

from inferpath.storage.reader import Reader  # noqa: E402
from inferpath.storage.rows import SPAN_COLUMNS, SpanRow  # noqa: E402
from inferpath.storage.store import Store  # noqa: E402

DAY = timedelta(days=1)

# The exporter's documented trace-by-id query (its README's Grafana example), with
# inferpath's column list and ordering so that both sides return the same rows.
REFERENCE_SQL = (
    "WITH"
    " (SELECT min(Start) FROM otel_traces_trace_id_ts WHERE TraceId = {trace_id:String}) AS trace_start,"
    " (SELECT max(End) + 1 FROM otel_traces_trace_id_ts WHERE TraceId = {trace_id:String}) AS trace_end"
    f" SELECT {', '.join(SPAN_COLUMNS)} FROM otel_traces"
    " WHERE TraceId = {trace_id:String}"
    " AND Timestamp >= trace_start AND Timestamp <= trace_end"
    " ORDER BY Timestamp, SpanId LIMIT 1 BY SpanId"
)


def run(spans: int = 2_000_000, lookups: int = 200, workdir: str | None = None) -> dict:
    """Fill (unless the folder is filled) and time both sides; returns the figures. Without
    ``workdir`` the store is filled in a temporary folder, removed afterwards. Raises
    ``AssertionError`` when the two sides return different spans."""
    with scratch_folder(workdir, "inferpath-bench-") as folder:
        with Store.open(f"chdb://{folder / 'store'}") as store:
            fill = None
            if store.query("SELECT count() FROM otel_traces")[0][0] == 0:
                start = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) - DAY
                fill = synthetic.fill(store, spans=spans, start=start, duration=DAY)
            return _measure(store, lookups, fill)


def _cpu_wall(call) -> tuple[float, float, object]:
    cpu, wall = time.process_time(), time.perf_counter()
    result = call()
    return time.process_time() - cpu, time.perf_counter() - wall, result


def _measure(store: Store, lookups: int, fill: dict | None) -> dict:
    stored = store.query("SELECT count() FROM otel_traces")[0][0]
    known = [
        row[0]
        for row in store.query(
            "SELECT TraceId FROM otel_traces_trace_id_ts ORDER BY cityHash64(TraceId) LIMIT {n:UInt32}", {"n": lookups}
        )
    ]
    unknown = [secrets.token_hex(16) for _ in range(lookups)]
    reader = Reader(store)
    reference = lambda trace_id: [  # noqa: E731
        SpanRow.from_db_row(r) for r in store.query(REFERENCE_SQL, {"trace_id": trace_id})
    ]
    for warm in (known[0], unknown[0]):  # first queries load marks and indexes: not timed
        reference(warm), reader.trace_spans(warm)
    cases: dict[str, dict] = {}
    for case, ids in (("stored", known), ("unknown", unknown)):
        figures: dict[str, dict[str, list[float]]] = {
            side: {"cpu": [], "wall": []} for side in ("reference", "inferpath")
        }
        order = random.Random(7)
        for trace_id in ids:
            sides = [("reference", reference), ("inferpath", reader.trace_spans)]
            order.shuffle(sides)  # neither side always runs on the other's warm caches
            results = {}
            for side, lookup in sides:
                cpu, wall, results[side] = _cpu_wall(lambda lookup=lookup, trace_id=trace_id: lookup(trace_id))
                figures[side]["cpu"].append(cpu * 1000)
                figures[side]["wall"].append(wall * 1000)
            assert results["reference"] == results["inferpath"], f"different spans for trace {trace_id}"
            if case == "stored":
                assert results["inferpath"], f"stored trace {trace_id} not found"
        summary = {
            side: {"cpu_ms": round(statistics.mean(f["cpu"]), 3), "wall_ms_p50": round(statistics.median(f["wall"]), 3)}
            for side, f in figures.items()
        }
        summary["cpu_ratio"] = round(summary["reference"]["cpu_ms"] / summary["inferpath"]["cpu_ms"], 2)
        cases[case] = summary
    return {"stored_spans": stored, "lookups": lookups, "fill": fill, "cases": cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=2_000_000)
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--store", default=None, help="keep the filled store in this folder")
    args = parser.parse_args()
    result = run(args.spans, args.lookups, args.store)
    print(json.dumps(result, indent=2, default=str))
    for case, figures in result["cases"].items():
        print(
            f"{case} trace: inferpath {figures['inferpath']['cpu_ms']} ms CPU per lookup vs the exporter's"
            f" query {figures['reference']['cpu_ms']} ms: ratio {figures['cpu_ratio']}"
            f" (wall p50 {figures['inferpath']['wall_ms_p50']} vs {figures['reference']['wall_ms_p50']} ms)"
        )


if __name__ == "__main__":
    main()
