"""Every real-engine recording diagnosed as another capture of it would have been made.

Usage::

    python bench/recordings_matrix.py [--scrape-every N [--phase P]] [--no-spans | --no-scrapes]
                                      [--alone] [--only NAME ...] [--detail]

Each recording of ``tests/data/vllm_recordings/`` and ``tests/data/whatif_recordings/`` is
unpacked, changed as asked, imported into one embedded store behind an in-process server (their
times do not overlap), and diagnosed over its ground truth's window (with its baseline unless
``--alone``). The variants:

- ``--scrape-every N``: only every N-th scrape of each engine kept, from the ``--phase``-th
  (Prometheus scrapes every 15 s by default; the recordings were scraped about once a second);
- ``--no-spans``: the OTLP bodies removed (vLLM scraped, not traced);
- ``--no-scrapes``: the scrapes removed (vLLM traced, not scraped).

Prints one line per recording (OK/BAD, truth, verdict, its causes' shares), with ``--detail``
the summary and evidence of each miss, and the count named right. Exit 0 when all are, 1 when
not. A robustness check by hand (minutes: every recording is imported), not a CI test; the
recordings themselves are checked in CI by ``tests/analysis/test_vllm_recordings.py``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

from inferpath.analysis import diagnose
from inferpath.collectors.recording import choose_offset_ns, import_recording, open_recording
from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def _thin(root: Path, every: int, phase: int, spans: bool, scrapes: bool) -> None:
    """Remove what the variant leaves out, in the unpacked recording at ``root``."""
    if not spans:
        for body in [*root.rglob("*.pb"), *root.rglob("*.json.gz"), *root.rglob("*.pb.gz")]:
            body.unlink()
    by_engine: dict[Path, list[Path]] = {}
    for scrape in sorted(root.rglob("metrics_*.prom")):
        by_engine.setdefault(scrape.parent, []).append(scrape)
    for files in by_engine.values():
        for i, scrape in enumerate(files):
            if not scrapes or (i - phase) % every:
                scrape.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrape-every", type=int, default=1)
    parser.add_argument("--phase", type=int, default=0)
    parser.add_argument("--no-spans", action="store_true")
    parser.add_argument("--no-scrapes", action="store_true")
    parser.add_argument("--alone", action="store_true", help="no baseline: the window against the objectives")
    parser.add_argument("--only", nargs="*", default=None, help="recording names")
    parser.add_argument("--detail", action="store_true", help="the summary and evidence of each miss")
    args = parser.parse_args(argv)
    if args.scrape_every < 1 or (args.no_spans and args.no_scrapes):
        parser.error("--scrape-every must be at least 1, and a recording needs its spans or its scrapes")
    paths = sorted([*(DATA / "vllm_recordings").glob("*.tar.gz"), *(DATA / "whatif_recordings").glob("*.tar.gz")])
    if args.only:
        paths = [p for p in paths if p.name.split(".")[0] in args.only]

    def at(unix_ns: int, offset_ns: int) -> datetime:
        return datetime.fromtimestamp((unix_ns + offset_ns) / 1e9, tz=timezone.utc)

    right = 0
    with tempfile.TemporaryDirectory(prefix="inferpath-matrix-") as work:
        server = serve_in_thread(Settings(store_url=f"chdb://{work}/store", assembly_settle_seconds=0.2), port=0)
        try:
            loaded = {}
            with httpx.Client(base_url=server.url, timeout=300.0) as client:
                for path in paths:
                    name = path.name.split(".")[0]
                    recording = open_recording(path, workdir=Path(work) / name)
                    _thin(recording.root, args.scrape_every, args.phase, not args.no_spans, not args.no_scrapes)
                    recording = open_recording(recording.root)
                    offset = choose_offset_ns(
                        recording, ttl_days=server.runtime.settings.ttl_days, now_ns=time.time_ns()
                    )
                    import_recording(recording, client, offset_ns=offset, flush=False)
                    loaded[name] = (recording.ground_truth, offset)
                client.post("/api/v1/flush", params={"timeout_seconds": 300}).raise_for_status()
            for name, (truth, offset) in loaded.items():
                window, base = truth["window"], None if args.alone else truth.get("baseline")
                verdict = diagnose(
                    server.runtime.store,
                    window_start=at(window["start_unix_ns"], offset),
                    window_end=at(window["end_unix_ns"], offset),
                    baseline_start=at(base["start_unix_ns"], offset) if base else None,
                    baseline_end=at(base["end_unix_ns"], offset) if base else None,
                )
                expected = truth["expected_top_cause"]
                got = "healthy" if verdict.healthy else verdict.top_cause
                right += got == expected
                shares = ", ".join(f"{c.cause} {c.share:.0%}" for c in verdict.causes[:3])
                print(f"{'OK ' if got == expected else 'BAD'} {name:26} truth {expected:13} got {got!s:13} {shares}")
                if args.detail and got != expected:
                    print(f"    {verdict.summary}")
                    for cause in verdict.causes[:2]:
                        for evidence in cause.evidence:
                            print(f"      {cause.cause}: {evidence.text}")
        finally:
            server.stop()
    print(f"{right} of {len(loaded)} named right")
    return 0 if right == len(loaded) else 1


if __name__ == "__main__":
    sys.exit(main())
