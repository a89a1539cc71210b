"""Benchmark: what the decode workers send the server per span, whole spans against their
derivation views (``server/decode_workers.py``, ``server/derive.py: derivation_view``).

For one 1000-span export (100 traces of 10 vLLM-like spans, as ``server_ingest.py`` sends)
in two shapes — ``light`` as generated (one attribute per step span) and ``heavy`` with 15
application attributes and a 2 kB prompt (``gen_ai.prompt.0.content``) on every span — both
sides are measured in the same run, alternating, best of ``--repeat`` rounds:

- bytes per span of the pickled reply;
- worker CPU per span: building the fields and pickling them;
- server CPU per span: loading the pickle and building the ``SpanRow`` objects (the part
  that holds the server's GIL);
- bytes per span the server holds for assembly (``tracemalloc`` of the built rows).

Reference: whole spans (``_span_fields``, what a worker sends when it wrote no Native block).
The request rows derived from both are asserted equal. ``python bench/decode_views.py
[--repeat 7] [--loops 200]``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server.otlp_factory import trace_body  # noqa: E402

from inferpath.server import decode_workers  # noqa: E402
from inferpath.server.derive import assemble_request  # noqa: E402
from inferpath.server.otlp import decode_trace_request  # noqa: E402
from inferpath.storage.rows import SpanRow  # noqa: E402


def _spans(shape: str) -> list[SpanRow]:
    body, _ = trace_body(spans_per_trace=10, traces=100)
    spans = decode_trace_request(body, content_type="application/x-protobuf", content_encoding=None).spans
    if shape == "light":
        return spans
    # A new string per span, as a decoder builds them (pickle would send a shared one once).
    return [replace(span, span_attributes={**span.span_attributes, **{f"app.key{i}": f"value {i} " * 3 for i in range(15)},
                                           "gen_ai.system": "openai",
                                           "gen_ai.prompt.0.content": f"{index:08d}" + "p" * 2000})
            for index, span in enumerate(spans)]


def _cpu_us_per_span(work, spans: int, loops: int) -> float:
    start = time.process_time()
    for _ in range(loops):
        work()
    return (time.process_time() - start) / loops / spans * 1e6


def _held_bytes_per_span(payload: bytes, spans: int) -> float:
    tracemalloc.start()
    rows = [SpanRow.from_checked(*fields) for fields in pickle.loads(payload)]
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del rows
    return held / spans


def _measure(spans: list[SpanRow], repeat: int, loops: int) -> dict:
    sides = {"whole": lambda: [decode_workers._span_fields(span) for span in spans],
             "view": lambda: decode_workers._view_fields(spans)}
    payloads = {name: pickle.dumps(fields(), protocol=5) for name, fields in sides.items()}
    by_trace: dict[str, list[list[SpanRow]]] = {}
    for name, payload in payloads.items():
        for span in (SpanRow.from_checked(*fields) for fields in pickle.loads(payload)):
            by_trace.setdefault(span.trace_id, [[], []])[name == "view"].append(span)
    for whole, view in by_trace.values():  # the reference's rows and the views' rows are the same
        assert assemble_request(whole, updated_at=spans[0].timestamp) == assemble_request(
            view, updated_at=spans[0].timestamp)
    worker = {name: float("inf") for name in sides}
    server = dict(worker)
    for _ in range(repeat):  # alternating, best round of each side
        for name, fields in sides.items():
            worker[name] = min(worker[name], _cpu_us_per_span(
                lambda: pickle.dumps(fields(), protocol=5), len(spans), loops))
            payload = payloads[name]
            server[name] = min(server[name], _cpu_us_per_span(
                lambda: [SpanRow.from_checked(*f) for f in pickle.loads(payload)], len(spans), loops))
    out = {}
    for name in sides:
        out[name] = {"reply_bytes_per_span": round(len(payloads[name]) / len(spans), 1),
                     "worker_cpu_us_per_span": round(worker[name], 3),
                     "server_cpu_us_per_span": round(server[name], 3),
                     "held_bytes_per_span": round(_held_bytes_per_span(payloads[name], len(spans)), 1)}
    out["view_over_whole"] = {key: round(out["view"][key] / out["whole"][key], 3) for key in out["view"]}
    return out


def run(repeat: int = 7, loops: int = 200) -> dict:
    """Both shapes; ``{shape: {"whole": figures, "view": figures, "view_over_whole": ratios}}``."""
    return {shape: _measure(_spans(shape), repeat, loops) for shape in ("light", "heavy")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="rounds per side (best kept)")
    parser.add_argument("--loops", type=int, default=200, help="exports per round")
    args = parser.parse_args()
    result = run(args.repeat, args.loops)
    print(json.dumps(result, indent=2))
    for shape, figures in result.items():
        ratios = figures["view_over_whole"]
        print(f"{shape}: view/whole server CPU {ratios['server_cpu_us_per_span']}, held bytes "
              f"{ratios['held_bytes_per_span']}, reply bytes {ratios['reply_bytes_per_span']}, worker CPU "
              f"{ratios['worker_cpu_us_per_span']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
