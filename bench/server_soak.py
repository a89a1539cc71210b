"""Soak: the server under a steady OTLP span load for minutes; its memory and its losses.

The server (``python -m inferpath.server``, its own process, a fresh chDB folder) takes a
paced load of ``--rate`` spans/s (``--clients`` exporters, ``--spans-per-request`` spans per
export, every export a new body built here with fresh ids, each retried until its 200 as an
OTLP exporter does) for ``--seconds``. Every ``--sample-seconds`` the server's resident set
(``VmRSS`` from ``/proc``) is read, its child processes' included (none today). Growth, the figure the
target bounds, is the median RSS of the last minute against the median of the minute after
the first ``--warmup-seconds`` (imports, caches and chDB's pools are in place by then),
minus one. A single sample is no measure of growth: merges and insert blocks swing the
resident set by 60-130 MB from one 10 s sample to the next, so a last sample against the
first after warm-up (also printed, with the peak) measures where a merge stood at that
instant. At the end the server is stopped gracefully and its store
counted: every acknowledged span must be stored exactly once, and its ``/metrics`` must
show nothing refused and nothing dropped. In the OpenTelemetry Collector's words an export
answered 503 (or 429) is *refused*: the client retries it, nothing is lost, but the
offered rate was not sustained; *dropped* is data lost after its 200 (never, by design).

``python bench/server_soak.py [--seconds 600] [--rate 20000] [--clients 4]``
Target: at 20k spans/s for 10 minutes, RSS grows ≤ 10 % and nothing is dropped.
Exit 1 when the growth (of the medians) is over 10 %, a span is lost or stored twice, or a
refusal or a drop is counted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server.otlp_factory import trace_body  # noqa: E402
from server_ingest import PROTOBUF, _free_port, _start, children, scratch_folder  # noqa: E402

from inferpath.storage.store import Store  # noqa: E402

# Counted on the server's /metrics; any of them above 0 fails the soak.
REFUSED_METRICS = (
    "inferpath_server_spans_refused_total",
    "inferpath_ingest_refused_busy_total",
    "inferpath_ingest_refused_store_unavailable_total",
)
DROPPED_METRICS = ("inferpath_server_spans_dropped_total", "inferpath_writer_rows_dropped_total")


def _metric_sum(text: str, name: str) -> float:
    """Sum of every series of metric ``name`` in Prometheus text (NaN when absent)."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    ]
    return sum(values) if values else float("nan")


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` in bytes (``VmRSS`` of ``/proc/PID/status``, Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def tree_rss_bytes(pid: int) -> tuple[int, int]:
    """``(server, children)``: resident set sizes in bytes of ``pid`` and of its child
    processes together."""
    kids = 0
    for child in children(pid):
        try:
            kids += rss_bytes(child)
        except (FileNotFoundError, RuntimeError):  # exited between the two reads
            continue
    return rss_bytes(pid), kids


def run(
    seconds: float = 600.0,
    rate: float = 20_000.0,
    clients: int = 4,
    spans_per_request: int = 1000,
    sample_seconds: float = 10.0,
    warmup_seconds: float = 60.0,
    workdir: str | None = None,
) -> dict:
    """Run the soak; returns its figures (RSS samples in MB, rates, losses)."""
    with scratch_folder(workdir, "inferpath-soak-") as folder:
        return _run(folder, seconds, rate, clients, spans_per_request, sample_seconds, warmup_seconds)


def _run(
    folder: Path,
    seconds: float,
    rate: float,
    clients: int,
    spans_per_request: int,
    sample_seconds: float,
    warmup_seconds: float,
) -> dict:
    store_url = f"chdb://{folder / 'store'}"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = _start(store_url, port)
    spans_per_trace = 10
    acked_span_ids: list[str] = []
    retries = [0]
    lock = threading.Lock()
    started = time.monotonic()
    stop_at = started + seconds
    interval = clients * spans_per_request / rate  # each exporter's pace

    def exporter(index: int) -> None:
        next_at = started + index * interval / clients
        with httpx.Client(base_url=url, timeout=60) as http:
            while time.monotonic() < stop_at:
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                next_at += interval
                body, ids = trace_body(spans_per_trace=spans_per_trace, traces=spans_per_request // spans_per_trace)
                while True:
                    response = http.post("/v1/traces", content=body, headers=PROTOBUF)
                    if response.status_code == 200:
                        break
                    retries[0] += 1
                    time.sleep(float(response.headers.get("retry-after", "0.1")))
                with lock:
                    acked_span_ids.extend(s for spans in ids.values() for s in spans)

    samples: list[tuple[float, int, int]] = []  # (seconds, server RSS, its children's RSS)
    loads: list[float] = []
    threads = [threading.Thread(target=exporter, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    while time.monotonic() < stop_at:
        samples.append((time.monotonic() - started, *tree_rss_bytes(server.pid)))
        loads.append(os.getloadavg()[0])
        time.sleep(min(sample_seconds, max(0.0, stop_at - time.monotonic())))
    for thread in threads:
        thread.join(120)
    samples.append((time.monotonic() - started, *tree_rss_bytes(server.pid)))
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    refused = {name: _metric_sum(metrics, name) for name in REFUSED_METRICS}
    dropped = {name: _metric_sum(metrics, name) for name in DROPPED_METRICS}
    server.send_signal(signal.SIGTERM)
    server.wait(300)
    with Store.open(store_url) as store:
        stored = dict(
            store.query("SELECT SpanId, count() FROM otel_traces WHERE ServiceName != 'probe' GROUP BY SpanId")
        )
    expected = set(acked_span_ids)
    # Growth is of the whole process tree.
    totals = [(at, rss + kids) for at, rss, kids in samples]
    reference = next((rss for at, rss in totals if at >= warmup_seconds), totals[-1][1])
    # Robust to a single sample's timing: the median of the last minute against the median
    # of the minute after warm-up.
    first = [rss for at, rss in totals if warmup_seconds <= at < warmup_seconds + 60] or [reference]
    last = [rss for at, rss in totals if at >= totals[-1][0] - 60]
    return {
        "seconds": seconds,
        "target_rate": rate,
        "clients": clients,
        "acked_spans": len(acked_span_ids),
        "achieved_rate": round(len(acked_span_ids) / seconds),
        "retries": retries[0],
        "lost": len(expected - set(stored)),
        "stored_twice": sum(1 for span_id, n in stored.items() if n > 1 and span_id in expected),
        "refused": refused,
        "dropped": dropped,
        "rss_reference_mb": round(reference / 2**20, 1),
        "rss_last_mb": round(totals[-1][1] / 2**20, 1),
        "rss_max_mb": round(max(rss for _, rss in totals) / 2**20, 1),
        "rss_growth": round(totals[-1][1] / reference - 1, 4),
        "rss_growth_of_medians": round(statistics.median(last) / statistics.median(first) - 1, 4),
        "rss_mb": [(round(at), round(rss / 2**20, 1)) for at, rss in totals],
        "load_average_median": round(statistics.median(loads), 2) if loads else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--rate", type=float, default=20_000.0, help="offered spans per second")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--spans-per-request", type=int, default=1000)
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--warmup-seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    result = run(
        args.seconds, args.rate, args.clients, args.spans_per_request, args.sample_seconds, args.warmup_seconds
    )
    print(json.dumps(result, indent=2))
    counted = list(result["refused"].values()) + list(result["dropped"].values())
    bad = (
        result["rss_growth_of_medians"] > 0.10
        or result["lost"]
        or result["stored_twice"]
        or any(v for v in counted if v == v)
    )  # NaN: metric absent
    print(
        f"{result['acked_spans']} spans in {args.seconds:.0f} s ({result['achieved_rate']} spans/s of "
        f"{args.rate:.0f} offered): RSS {result['rss_reference_mb']} -> {result['rss_last_mb']} MB "
        f"(last sample {result['rss_growth']:+.1%}, peak {result['rss_max_mb']} MB; growth of the medians "
        f"{result['rss_growth_of_medians']:+.1%}), lost {result['lost']}, twice {result['stored_twice']}, "
        f"refused {result['refused']} (retries {result['retries']}), dropped {result['dropped']}"
        f"{'  FAILED' if bad else ''}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
