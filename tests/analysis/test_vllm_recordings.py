"""Recordings of a real vLLM engine, loaded through ``inferpath import``'s code and diagnosed.

Each ``tests/data/vllm_recordings/<name>.tar.gz`` (and each of the what-if's
``tests/data/whatif_recordings/``) holds one real run (the engine's scrapes
with their times, the OTLP bodies it posted, the load client's own measurements) and its
ground truth, read from the raw scrapes when it was made (``ground_truth.json``, README
beside the tarballs). The verdict over the ground truth's window (and baseline, when the run
has one) must name that cause, or be healthy where the run was.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from inferpath.analysis import diagnose
from inferpath.collectors.recording import choose_offset_ns, import_recording, open_recording
from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread

# One worker imports the recordings once (the module fixture is per worker under xdist).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("vllm_recordings")]

DATA = Path(__file__).resolve().parents[1] / "data"
# The what-if's real runs are diagnosed too: each has its ground truth.
RECORDINGS = sorted([*(DATA / "vllm_recordings").glob("*.tar.gz"), *(DATA / "whatif_recordings").glob("*.tar.gz")])


def _at(unix_ns: int, offset_ns: int) -> datetime:
    return datetime.fromtimestamp((unix_ns + offset_ns) / 1e9, tz=timezone.utc)


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory):
    """One server over one store with every recording imported (their times do not overlap)."""
    root = tmp_path_factory.mktemp("recordings")
    server = serve_in_thread(Settings(store_url=f"chdb://{root / 'store'}", assembly_settle_seconds=0.2), port=0)
    loaded = {}
    try:
        with httpx.Client(base_url=server.url, timeout=120.0) as client:
            for path in RECORDINGS:
                recording = open_recording(path, workdir=root / path.name.split(".")[0])
                offset = choose_offset_ns(recording, ttl_days=server.runtime.settings.ttl_days, now_ns=time.time_ns())
                result = import_recording(recording, client, offset_ns=offset, flush=False)
                assert result.source == "vllm"
                loaded[path.name.split(".")[0]] = (recording.ground_truth, offset)
            # one flush for all: each import's own flush waited out its assembly
            assert client.post("/api/v1/flush", params={"timeout_seconds": 300}).json()["ok"]
        yield server, loaded
    finally:
        server.stop()


def _diagnose_truth(server, truth: dict, offset: int, *, baseline: bool = True):
    """The verdict over a recording's ground-truth window, with its baseline when it has one
    (and ``baseline``), the recording imported ``offset`` ns later."""
    window, base = truth["window"], truth.get("baseline") if baseline else None
    return diagnose(
        server.runtime.store,
        window_start=_at(window["start_unix_ns"], offset),
        window_end=_at(window["end_unix_ns"], offset),
        baseline_start=_at(base["start_unix_ns"], offset) if base else None,
        baseline_end=_at(base["end_unix_ns"], offset) if base else None,
    )


def _window_alone(imported, name: str):
    """The verdict of recording ``name``'s ground-truth window, without its baseline."""
    server, loaded = imported
    truth, offset = loaded[name]
    return _diagnose_truth(server, truth, offset, baseline=False)


def test_there_are_recordings_of_each_kind() -> None:
    names = {p.name.split(".")[0] for p in RECORDINGS}
    assert {"healthy_low_load", "kv_starved"} <= names


@pytest.mark.parametrize("name", [p.name.split(".")[0] for p in RECORDINGS])
def test_the_verdict_names_the_recorded_cause(imported, name: str) -> None:
    server, loaded = imported
    truth, offset = loaded[name]
    assert truth is not None, f"{name}: the recording has no ground_truth.json"
    verdict = _diagnose_truth(server, truth, offset)
    assert verdict.source == "spans"  # the spans hold the requests the engine counted
    expected = truth["expected_top_cause"]
    if expected == "healthy":
        assert verdict.healthy, verdict.summary
    else:
        assert not verdict.healthy, verdict.summary
        assert verdict.top_cause == expected, (verdict.summary, [(c.cause, c.share) for c in verdict.causes])
        if expected != "network_hop" and "network_hop" not in truth.get("also_causes", {}):
            # Only gateway_extra_hop delays the wire (its hop's p10 is the proxy's 1.0 s). In the
            # others the hops' tails (p10 3-24 ms, tail band 0.3-2.5 s) are waits at a busy
            # door: vLLM's API server beside a saturated engine, the gateway's event loop under
            # a synchronous tokenizer or slow retrieval.
            causes = [(c.cause, c.share) for c in verdict.causes]
            assert "network_hop" not in [c for c, _ in causes], causes
        advice = [h for c in verdict.causes for h in c.would_help]
        assert advice, verdict.summary


def test_an_engine_that_served_before_the_window_is_not_starting_in_it_whatever_the_baseline(imported) -> None:
    # vLLM became ready a minute before gateway_slow_retrieval's window and served 87 requests
    # before it. Asked about the window alone (no baseline), the store still shows those
    # requests: the retriever's tail is not charged to a start-up.
    verdict = _window_alone(imported, "gateway_slow_retrieval")
    causes = [(c.cause, c.share) for c in verdict.causes]
    assert verdict.top_cause == "retrieval" and "cold_start" not in [c for c, _ in causes], causes


def test_a_verdict_on_the_engines_spans_alone_says_whose_ttft_it_judged(imported) -> None:
    # kv_starved holds vLLM's spans only: its TTFT starts at vLLM's arrival, not the caller's send.
    engine_only = _window_alone(imported, "kv_starved")
    assert any(n.startswith("the TTFT and E2E judged here are the engine's own") for n in engine_only.notes), (
        engine_only.notes
    )
    # vLLM's spans name no endpoint class: the verdict says what "unclassified" is judged as.
    assert any(n.startswith("'unclassified': requests whose spans name no endpoint class") for n in engine_only.notes)
    # With the load client's spans (its own TTFT, and the hop to vLLM) nothing needs saying.
    with_client = _window_alone(imported, "kv_starved_b")
    assert not any(n.startswith("the TTFT and E2E judged here") for n in with_client.notes), with_client.notes


def test_a_client_that_read_its_streams_late_is_told_so(imported) -> None:
    # busy_client_hop: vLLM made the tokens on time (its TTFT p99 ≈ 40 ms); the load client,
    # starved of CPU, got the first chunk of its slowest requests with the last.
    verdict = _window_alone(imported, "busy_client_hop")
    hop = verdict.causes[0]
    assert hop.cause == "network_hop", verdict.summary
    assert "read late, in one lump" in hop.would_help[0], hop.would_help
    lumps = next(e for e in hop.evidence if e.measure == "lump_streams")
    assert lumps.current is not None and lumps.current >= 5, lumps.text
    # The budget says the same of the hop's time (it offered to co-locate the gateway).
    assert verdict.budget is not None and verdict.budget.items[0].stage == "network"
    assert verdict.budget.items[0].action.startswith("read the streams promptly on the caller's side")


@pytest.mark.parametrize("name", ["gateway_pool_limit", "gateway_pool_limit_b", "gateway_pool_burst"])
def test_calls_that_waited_for_a_connection_to_an_idle_engine_are_a_queue_not_the_wire(imported, name: str) -> None:
    # The gateway's pool of 4 (6, 8) connections to vLLM: the calls waited up to 50 s inside the
    # gateway's model-call span, vLLM never queued. The advice was "co-locate the gateway".
    # In the burst the load client, starved of CPU, also read half its slowest streams late:
    # that is its own hop's, not the gateway's wait for a connection (it read network_hop).
    verdict = _window_alone(imported, name)
    queue = verdict.causes[0]
    assert queue.cause == "queueing" and "network" in queue.stages, verdict.summary
    hop = [
        e.text for e in queue.evidence if e.text.startswith("the calls waited in a queue before reaching the engine")
    ]
    assert hop, queue.evidence
    # the engine's own gauges place the cap: it never ran more than the pool let through
    pool = {"gateway_pool_limit": 4, "gateway_pool_limit_b": 6, "gateway_pool_burst": 8}[name]
    assert f"the engine ran at most {pool} at once and none waited in it" in hop[0], hop[0]
    assert any(a.startswith("adding GPUs will not help") for a in queue.would_not_help), queue.would_not_help
    assert verdict.budget is not None and verdict.budget.items[0].cause == "queueing", verdict.budget.text()
    if name != "gateway_pool_burst":
        assert "co-locate" not in verdict.budget.text(), verdict.budget.text()
    else:
        # The caller's late reads stay named, for the caller's own hop, and its time (the
        # hop's floor is a wait too there: every call in the burst waited 1.4 s at least).
        hop_cause = next(c for c in verdict.causes if c.cause == "network_hop")
        assert hop_cause.share < queue.share / 4, verdict.summary
        lumps = next(e for e in hop_cause.evidence if e.measure == "lump_streams")
        assert lumps.current is not None and lumps.current >= 10, lumps.text
        assert any("read late, in one lump" in h for h in hop_cause.would_help), hop_cause.would_help


def test_a_capacity_what_if_over_a_queue_in_front_of_the_engine_says_why_it_changes_nothing(imported) -> None:
    # The pool's calls waited 43 s before vLLM, which held none: two replicas predict the same
    # TTFT, and the answer says why instead of leaving a 24.02 → 24.01 s to be read as noise.
    from inferpath.analysis.whatif import Change, predict

    server, loaded = imported

    def warnings(name: str, change: Change) -> list[str]:
        truth, offset = loaded[name]
        window = truth["window"]
        start, end = (_at(window[k], offset) for k in ("start_unix_ns", "end_unix_ns"))
        return predict(server.runtime.store, start, end, change, max_error=10.0).warnings

    said = warnings("gateway_pool_burst", Change(replicas=2))
    assert any(w.startswith("no request waited in the engine") for w in said), said
    fewer = warnings("gateway_pool_burst", Change(max_num_seqs=4))
    assert not any(w.startswith("no request waited") for w in fewer), fewer  # less, not more
    # A window whose engine queued gets no such warning (kv_starved_b: 156 preemptions, 70 waiting).
    queued = warnings("kv_starved_b", Change(replicas=2))
    assert not any(w.startswith("no request waited in the engine") for w in queued), queued


def test_requests_that_failed_while_vllm_was_loading_are_named_its_cold_start(imported) -> None:
    """cold_start_gateway_503: the demo gateway answered 503 to the 69 requests that came while
    vLLM was still loading (the load client did not retry them)."""
    verdict = _window_alone(imported, "cold_start_gateway_503")
    assert verdict.failed == {"error (HTTP 503)": 69}, verdict.failed
    assert "top cause: cold_start (100% of the failed requests); 30% of requests failed: 69 error (HTTP 503)" in (
        verdict.summary
    )
    evidence = [e.text for e in verdict.causes[0].evidence]
    assert any(
        t.startswith("69 of the 69 failed requests arrived before a starting replica was ready") for t in evidence
    )


def _import_copy(
    imported,
    tmp_path: Path,
    name: str,
    *,
    drop_service: str | None = None,
    scrapes: bool = True,
    spans: bool = True,
    scrape_every: int = 1,
    days_before: int = 1,
):
    """Import recording ``name`` again, ``days_before`` days before its first copy, as another
    capture would have recorded it: without ``drop_service``'s spans, without its scrapes, with
    only every ``scrape_every``-th scrape, or without any span (``spans=False``: vLLM scraped
    and not traced). The copy's
    spans get new trace ids (each byte inverted), so that it is a trace of its own beside the
    first copy. Returns its ground truth and offset."""
    server, loaded = imported
    recording = open_recording(DATA / "vllm_recordings" / f"{name}.tar.gz", workdir=tmp_path)
    for body in recording.root.rglob("*.pb"):
        if not spans:
            body.unlink()
            continue
        request = ExportTraceServiceRequest.FromString(body.read_bytes())
        kept = [
            rs
            for rs in request.resource_spans
            if not any(a.key == "service.name" and a.value.string_value == drop_service for a in rs.resource.attributes)
        ]
        for span in (span for rs in kept for scope in rs.scope_spans for span in scope.spans):
            span.trace_id = bytes(b ^ 0xFF for b in span.trace_id)
        del request.resource_spans[:]
        request.resource_spans.extend(kept)
        body.write_bytes(request.SerializeToString())
    for i, scrape in enumerate(sorted(recording.root.rglob("metrics_*.prom"))):
        if not scrapes or i % scrape_every:
            scrape.unlink()
    truth, first_offset = loaded[name]
    offset = first_offset - days_before * 86_400 * 10**9
    with httpx.Client(base_url=server.url, timeout=120.0) as client:
        import_recording(open_recording(recording.root), client, offset_ns=offset)
    return truth, offset


def test_a_cold_start_seen_from_vllms_spans_alone_is_named(imported, tmp_path: Path) -> None:
    # cold_start_waiting as a capture of vLLM alone records it (spans and scrapes, no caller's
    # span: ../shared/data/vllm_live_capture): the 77 requests the load client held while vLLM
    # loaded reached it in one wall 1.2 s after it was ready and queued behind its 16 slots. The
    # engine's spans all start after readiness; the wall says they waited for it.
    server, _ = imported
    truth, offset = _import_copy(imported, tmp_path, "cold_start_waiting", drop_service="load-client")
    verdict = _diagnose_truth(server, truth, offset, baseline=False)
    assert any(n.startswith("the TTFT and E2E judged here are the engine's own") for n in verdict.notes)
    assert verdict.top_cause == "cold_start", (verdict.summary, [(c.cause, c.share) for c in verdict.causes])
    assert any("slowed by its start" in e.text for e in verdict.causes[0].evidence), verdict.causes[0].evidence


def test_an_engine_at_its_running_peak_is_named_from_its_spans_without_gauges(imported, tmp_path: Path) -> None:
    # slots_starved's vLLM spans without its scrapes (tracing on, /metrics not scraped): its
    # running batch, counted from the spans, sat at its peak of 4 while requests waited. It read
    # "batching" (the median queue time rose with the tail's) before the spans were counted.
    server, _ = imported
    truth, offset = _import_copy(imported, tmp_path, "slots_starved", scrapes=False)
    verdict = _diagnose_truth(server, truth, offset)
    assert verdict.top_cause == "gpu_compute", (verdict.summary, [(c.cause, c.share) for c in verdict.causes])
    assert verdict.engine is not None and verdict.engine.source == "spans" and verdict.engine.slot_limit == 4
    assert verdict.engine.slot_bound_steps * 2 > verdict.engine.waiting_steps
    assert any(n.startswith("the engine's gauges are not exported") for n in verdict.notes), verdict.notes
    assert any(e.text.startswith("counted from the engine's request spans") for e in verdict.causes[0].evidence)
    # kv_starved the same way: below its running peak while requests waited, which a full KV
    # cache and a scheduler's hold both do; without KV usage the spans cannot tell which.
    truth, offset = _import_copy(imported, tmp_path / "kv", "kv_starved", scrapes=False)
    kv = _diagnose_truth(server, truth, offset, baseline=False)
    assert kv.engine is not None and kv.engine.source == "gauges" and not kv.engine.reported
    assert kv.top_cause != "gpu_compute", kv.summary


def test_scrapes_late_in_a_saturated_machine_are_read_with_the_spans(imported) -> None:
    # slots_starved_c (3 slots, a saturated machine): its scrapes came 1-9 s apart in the load.
    # One taken between a request's end and the next admission (waiting 14, running 2 of 3)
    # was the latest for five one-second steps, and the window 15 s earlier than the ground
    # truth's read "batching" (8 held steps against 5 at the limit). Counted once per scrape,
    # the scrapes show 6 waiting steps; the spans show the queue at 21 steps, every one of them
    # with the batch at its limit of 3.
    server, loaded = imported
    truth, offset = loaded["slots_starved_c"]
    shift = 15 * 10**9
    window = {k: v - shift for k, v in truth["window"].items()}
    verdict = _diagnose_truth(server, {"window": window}, offset)
    assert verdict.top_cause == "gpu_compute", (verdict.summary, [(c.cause, c.share) for c in verdict.causes])
    state = verdict.engine
    assert state is not None and state.source == "spans and scrapes" and state.slot_limit == 3
    assert state.scraped_waiting_steps == 6, state.text()
    assert (state.waiting_steps, state.slot_bound_steps, state.held_steps) == (21, 21, 0), state.text()


@pytest.mark.parametrize("name", ["kv_long_e", "slots2_e_2", "budget_e", "healthy_e", "cold_e"])
def test_an_engine_scraped_and_not_traced_is_named_from_its_histograms(imported, tmp_path: Path, name: str) -> None:
    # The recording's scrapes alone (vLLM's /metrics, tracing off): its TTFT, queue-time and
    # E2E histograms count the requests, its gauges say what held them. Before, "no verdict".
    # cold_e's engine opened to the 85 requests held while it loaded (waiting 48 at its second
    # scrape, drained in 9 s, empty after): its counters began in the window, a start.
    server, _ = imported
    truth, offset = _import_copy(imported, tmp_path, name, spans=False)
    verdict = _diagnose_truth(server, truth, offset)
    assert verdict.source == "histograms", verdict.summary
    expected = truth["expected_top_cause"]
    if expected == "healthy":
        assert verdict.healthy, verdict.summary
    else:
        assert verdict.top_cause == expected, (verdict.summary, [(c.cause, c.share) for c in verdict.causes])


@pytest.mark.parametrize("name", ["token_budget_c", "budget_e", "slots_starved_c"])
def test_scrapes_further_apart_than_the_queue_came_and_went_are_read_with_the_spans(
    imported, tmp_path: Path, name: str
) -> None:
    # Every 15th scrape kept: Prometheus's default interval over a capture scraped each second.
    # The bursts queued for seconds at a time, between scrapes (token_budget_c's scrapes then
    # show no waiting step at all, budget_e's two): the spans count the queue at each step.
    server, _ = imported
    truth, offset = _import_copy(imported, tmp_path, name, scrape_every=15, days_before=2)
    verdict = _diagnose_truth(server, truth, offset)
    assert verdict.top_cause == truth["expected_top_cause"], (
        verdict.summary,
        [(c.cause, c.share) for c in verdict.causes],
    )
    assert verdict.engine is not None and verdict.engine.source == "spans and scrapes"
    scraped = verdict.engine.scraped_waiting_steps or 0
    assert verdict.engine.waiting_steps >= 2 * scraped and verdict.engine.waiting_steps > scraped
    evidence = [e.text for c in verdict.causes for e in c.evidence if e.measure == "engine_waiting_steps"]
    assert evidence and "counted from its request spans at each step" in evidence[0], evidence
