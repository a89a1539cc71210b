"""Span hot path: an inferpath stage span with 10 attributes vs the bare OTel SDK span.

Both sides use the same SDK provider and batch processor (exporting to a sink that keeps
nothing), so the ratio is the cost inferpath adds on top of the SDK. Interleaved rounds,
best round of each side (the least disturbed by other load on the machine).

    python bench/bench_stage_span.py [--spans N] [--rounds R]
Target (issue 3): ratio <= 1.15.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from inferpath.instrumentation import provider
from inferpath.instrumentation.stages import stage

ATTRIBUTES = {f"inferpath.bench.a{i}": i for i in range(9)}  # + inferpath.stage = 10


class DiscardingExporter(SpanExporter):
    def export(self, spans: Sequence) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def run(spans: int, rounds: int) -> dict[str, float]:
    provider.configure("bench", span_exporter=DiscardingExporter(), max_queue_size=1 << 20, schedule_delay_seconds=0.2)
    tracer = provider.current_provider().get_tracer("bare")
    bare_attributes = {"inferpath.stage": "retrieval", **ATTRIBUTES}

    def bare() -> None:
        for _ in range(spans):
            with tracer.start_as_current_span("retrieval", attributes=bare_attributes):
                pass

    def ours() -> None:
        for _ in range(spans):
            with stage("retrieval", **ATTRIBUTES):
                pass

    best = {"bare": float("inf"), "ours": float("inf")}
    for _ in range(rounds):
        for name, body in (("bare", bare), ("ours", ours)):
            started = time.perf_counter()
            body()
            best[name] = min(best[name], (time.perf_counter() - started) / spans)
            provider.force_flush(5.0)
    provider.shutdown(5.0)
    return {"bare_us": best["bare"] * 1e6, "ours_us": best["ours"] * 1e6, "ratio": best["ours"] / best["bare"]}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    result = run(args.spans, args.rounds)
    print(f"bare OTel SDK span (reference): {result['bare_us']:.2f} us/span")
    print(f"inferpath stage span:           {result['ours_us']:.2f} us/span")
    print(f"ratio: {result['ratio']:.3f} (target <= 1.15)")
    return result


if __name__ == "__main__":
    main()
