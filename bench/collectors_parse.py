"""Benchmark: parsing and mapping a scrape vs. prometheus_client's parser alone, same text, same run.

Reference: ``list(text_string_to_metric_families(text))`` (the raw parser, nothing else).
Measured: ``parse_scrape(text, source, timestamp=...)``: filter, parse, map through the
catalog, combine, report missing. Throughput counts the text's sample lines (every line
that is not blank or a comment), the work both sides are given.

Run: ``python bench/collectors_parse.py [--seconds 2]``. Targets: ratio ≥ 0.8, ≥ 100k samples/s.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime, timezone
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from inferpath.collectors.pipeline import parse_scrape

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
FILES = (
    ("vllm", "vllm_live_capture/metrics_1796037503909019406.prom"),
    ("vllm", "model_server_metrics/vllm_v1_qwen2.5-0.5b_cncf_kops.prom"),
    ("sglang", "model_server_metrics/sglang_llama3.1-8b_under_load_docs.prom"),
    ("dcgm", "dcgm_exporter_metrics/cncf_ai_conformance_upcloud_L40S.prom"),
)


def _rate(function, seconds: float) -> float:
    """Calls per second of ``function`` over about ``seconds`` (best of three rounds)."""
    best = 0.0
    for _ in range(3):
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / 3:
            function()
            calls += 1
        best = max(best, calls / elapsed)
    return best


def run(seconds: float = 2.0, data: Path = DATA) -> list[dict]:
    """One row per file: sample lines, raw parser and pipeline rates, their ratio."""
    timestamp = datetime.now(timezone.utc)
    rows = []
    for source, relative in FILES:
        text = (data / relative).read_text()
        lines = sum(1 for line in text.splitlines() if line.strip() and not line.startswith("#"))
        raw = _rate(lambda text=text: list(text_string_to_metric_families(text)), seconds)
        ours = _rate(lambda text=text, source=source: parse_scrape(text, source, timestamp=timestamp), seconds)
        rows.append(
            {
                "file": relative,
                "source": source,
                "sample_lines": lines,
                "raw_scrapes_per_s": raw,
                "pipeline_scrapes_per_s": ours,
                "ratio": ours / raw,
                "pipeline_samples_per_s": ours * lines,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per side and file")
    args = parser.parse_args()
    print(f"{'file':60} {'lines':>6} {'raw/s':>9} {'ours/s':>9} {'ratio':>6} {'samples/s':>11}")
    for row in run(args.seconds):
        print(
            f"{row['file']:60} {row['sample_lines']:6d} {row['raw_scrapes_per_s']:9.0f} "
            f"{row['pipeline_scrapes_per_s']:9.0f} {row['ratio']:6.2f} {row['pipeline_samples_per_s']:11.0f}"
        )


if __name__ == "__main__":
    main()
