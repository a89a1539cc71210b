"""Calibrating the what-if's engine model from a stored window: no vendor profile, only what
the window itself recorded.

- **Arrivals and tokens**: one :class:`TraceRequest` per request row (``timestamp``,
  ``input_tokens``, ``output_tokens``, ``endpoint_class``, ``replica``), with its observed
  ``ttft_ns``, ``queue_ns``, ``prefill_ns``, ``decode_ns``. The API-side time before the
  scheduler saw it (``ttft − queue − prefill``: HTTP, tokenization, IPC) is kept per request.
- **Step times** (:class:`StepTimeModel`): least squares of each request's prefill time on its
  prompt tokens (``prefill ≈ a + b·tokens``) and of its mean ITL on the mean running batch
  of its engine during its decode (``step ≈ c + d·batch``). The running batch is counted from
  the rows themselves (requests between their first schedule and their last token, per
  replica), so the fit needs engine spans but no gauges.
- **KV pool**: vLLM's ``kv_cache_usage_perc`` is ``used blocks / usable blocks``, so its values
  are fractions whose common denominator is the number of usable blocks (vLLM reserves one
  block of ``num_gpu_blocks``); the block size is the power of two whose block counts of the
  tokens in flight (from the rows, at each scrape) best match ``usage × blocks``.
  (``vllm:cache_config_info`` carries both, but the collectors' catalog does not keep info
  metrics.) Without a KV gauge the pool is unlimited and KV changes cannot be predicted.
- **Batch limit**: the peak of ``running_requests`` when requests waited at it while KV had
  room (the limit was reached); otherwise the limit was never binding and vLLM's default
  (256) is assumed, with a note.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from typing import Any, Mapping, Sequence

from inferpath.analysis.percentiles import quantile

DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default --max-num-seqs
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # vLLM V1's default prompt-token budget per step
DEFAULT_BLOCK_SIZE_TOKENS = 16  # vLLM's default --block-size
BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
KV_FULL_RATIO = 0.9
_KV_SAMPLES = 300
MIN_REQUESTS = 20

ROW_COLUMNS = ("timestamp", "endpoint_class", "replica", "input_tokens", "output_tokens", "ttft_ns", "e2e_ns",
               "queue_ns", "prefill_ns", "decode_ns", "itl_ns")


class InsufficientSignalsError(ValueError):
    """The window lacks what the engine model needs; the message names the missing signal."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of the window: ``arrival_seconds`` from the window start (API arrival),
    ``engine_arrival_seconds`` (plus its ``api_seconds``, when the scheduler saw it), tokens,
    class, the index of its replica, and what was observed (seconds; ITL ``None`` for a
    one-token output)."""

    arrival_seconds: float
    engine_arrival_seconds: float
    api_seconds: float
    prompt_tokens: int
    output_tokens: int
    endpoint_class: str
    replica_index: int
    observed_ttft_seconds: float
    observed_queue_seconds: float
    observed_prefill_seconds: float
    observed_itl_seconds: float | None


@dataclass(frozen=True)
class StepTimeModel:
    """Engine step times, seconds: ``prefill_seconds(tokens) = prefill_base + prefill_per_token ·
    tokens`` and ``decode_step_seconds(batch) = decode_base + decode_per_sequence · batch``
    (linear beyond the observed range too), with the observed ranges they were fitted on."""

    prefill_base_seconds: float
    prefill_per_token_seconds: float
    decode_base_seconds: float
    decode_per_sequence_seconds: float
    max_batch_observed: float
    max_prompt_tokens_observed: int

    def prefill_seconds(self, tokens: int) -> float:
        """Seconds of one prefill step over ``tokens`` prompt tokens in total."""
        return self.prefill_base_seconds + self.prefill_per_token_seconds * tokens

    def decode_step_seconds(self, batch_size: int) -> float:
        """Seconds of one decode step of ``batch_size`` sequences."""
        return self.decode_base_seconds + self.decode_per_sequence_seconds * batch_size

    def scaled_decode(self, factor: float) -> "StepTimeModel":
        """The same model with decode steps ``factor`` times as long."""
        return StepTimeModel(self.prefill_base_seconds, self.prefill_per_token_seconds,
                             self.decode_base_seconds * factor, self.decode_per_sequence_seconds * factor,
                             self.max_batch_observed, self.max_prompt_tokens_observed)


@dataclass
class Calibration:
    """Everything the replay needs, from one window (module docstring), plus where each value
    came from (``sources``) and what could not be calibrated (``notes``)."""

    requests: list[TraceRequest]
    step_time: StepTimeModel
    replicas: int
    num_kv_blocks: int | None
    block_size_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    window_seconds: float
    observed_kv_mean_ratio: float | None
    observed_kv_max_ratio: float | None
    observed_preemptions: float | None
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def engine_settings(self):  # -> whatif.EngineSettings (imported late: whatif imports this module)
        """The observed configuration of one engine; an unknown KV pool is unlimited."""
        from inferpath.analysis.whatif import EngineSettings

        blocks = self.num_kv_blocks or 1 << 40
        return EngineSettings(blocks, self.block_size_tokens, self.max_num_seqs, self.max_num_batched_tokens)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (not the requests)."""
        st = self.step_time
        return {
            "requests": len(self.requests), "window_seconds": self.window_seconds, "replicas": self.replicas,
            "num_kv_blocks": self.num_kv_blocks, "block_size_tokens": self.block_size_tokens if self.num_kv_blocks else None,
            "max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
            "prefill_base_seconds": st.prefill_base_seconds, "prefill_per_token_seconds": st.prefill_per_token_seconds,
            "decode_base_seconds": st.decode_base_seconds,
            "decode_per_sequence_seconds": st.decode_per_sequence_seconds,
            "max_batch_observed": st.max_batch_observed, "sources": self.sources, "notes": self.notes,
        }


def _fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares ``y = a + b·x`` with ``a, b ≥ 0`` (a step never costs less with more work);
    a single x value gives ``(mean y, 0)``."""
    n = len(xs)
    mx, my = math.fsum(xs) / n, math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if sxx <= 1e-12:
        return my, 0.0
    b = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if b < 0:
        return my, 0.0
    a = my - b * mx
    if a < 0:  # through the origin instead
        b = math.fsum(x * y for x, y in zip(xs, ys)) / math.fsum(x * x for x in xs)
        return 0.0, b
    return a, b


class _Concurrency:
    """The running batch of one replica over time, from request intervals [scheduled, end):
    a step function with its running integral, so a mean over any interval costs two searches."""

    def __init__(self, intervals: Sequence[tuple[float, float]]) -> None:
        events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
        self.times: list[float] = []
        self.counts: list[int] = []
        self.integral: list[float] = []
        count, area, last = 0, 0.0, None
        for t, delta in events:
            if last is not None:
                area += count * (t - last)
            count += delta
            last = t
            self.times.append(t)
            self.counts.append(count)
            self.integral.append(area)

    def _area(self, t: float) -> float:
        i = bisect.bisect_right(self.times, t) - 1
        if i < 0:
            return 0.0
        return self.integral[i] + self.counts[i] * (t - self.times[i])

    def mean(self, start: float, end: float) -> float:
        """Mean running count over [start, end)."""
        if end <= start:
            return float(self.at(start))
        return (self._area(end) - self._area(start)) / (end - start)

    def at(self, t: float) -> int:
        """Running count just after ``t``."""
        i = bisect.bisect_right(self.times, t) - 1
        return self.counts[i] if i >= 0 else 0

    def peak(self) -> int:
        return max(self.counts, default=0)


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value) / 1e9


def calibrate(rows: Sequence[Mapping[str, Any]], signals: Mapping[str, Sequence[Sequence[tuple[int, float]]]],
              *, window_start: datetime, window_end: datetime) -> Calibration:
    """Build the :class:`Calibration` of a window.

    ``rows``: request rows with :data:`ROW_COLUMNS` (``ok`` requests of the window);
    ``signals``: per canonical signal (``running_requests``, ``queue_depth``,
    ``kv_cache_usage_ratio``, ``preemptions_total``) a list of series, one per engine, each
    a list of ``(unix ns, value)`` inside the window. Raises :class:`InsufficientSignalsError`
    naming what is missing: too few requests, or no engine spans (queue/prefill/decode times).
    """
    start_s = window_start.timestamp()
    window_seconds = max(1e-3, window_end.timestamp() - start_s)
    if len(rows) < MIN_REQUESTS:
        raise InsufficientSignalsError(f"insufficient data: {len(rows)} requests in the window, need {MIN_REQUESTS}")
    usable = [r for r in rows if r.get("prefill_ns") is not None and r.get("queue_ns") is not None
              and r.get("ttft_ns") is not None and r.get("e2e_ns") is not None
              and r.get("input_tokens") and r.get("output_tokens")]
    if len(usable) < MIN_REQUESTS:
        raise InsufficientSignalsError(
            f"no engine spans: {len(usable)} of {len(rows)} requests carry the engine's queue and prefill times "
            f"and token counts (an llm_request span, vLLM's or the instrumented engine's); step times cannot be "
            f"calibrated without them")
    notes: list[str] = []
    sources: dict[str, str] = {}
    if len(usable) < len(rows):
        notes.append(f"{len(rows) - len(usable)} requests without engine timings or token counts were left out")
    replica_names = sorted({str(r.get("replica") or "") for r in usable})
    replica_index = {name: i for i, name in enumerate(replica_names)}

    requests: list[TraceRequest] = []
    intervals: dict[int, list[tuple[float, float]]] = {}
    decoding: list[tuple[int, float, float, float]] = []  # (replica, first token, end, itl)
    for r in usable:
        arrival = r["timestamp"].timestamp() - start_s
        ttft, queue, prefill = _seconds(r["ttft_ns"]), _seconds(r["queue_ns"]), _seconds(r["prefill_ns"])
        e2e = _seconds(r["e2e_ns"])
        out_tokens = int(r["output_tokens"])
        decode = _seconds(r.get("decode_ns"))
        itl = None
        if out_tokens > 1:
            if decode is not None:
                itl = decode / (out_tokens - 1)
            elif r.get("itl_ns") is not None:
                itl = _seconds(r["itl_ns"])
        api = max(0.0, ttft - queue - prefill)
        k = replica_index[str(r.get("replica") or "")]
        scheduled = arrival + api + queue
        first_token = arrival + ttft
        intervals.setdefault(k, []).append((scheduled, max(first_token, arrival + e2e)))
        if itl is not None:
            decoding.append((k, first_token, arrival + e2e, itl))
        requests.append(TraceRequest(arrival, arrival + api, api, int(r["input_tokens"]), out_tokens,
                                     str(r.get("endpoint_class") or ""), k, ttft, queue, prefill, itl))

    # Step times.
    prefill_base, prefill_per_token = _fit_line([float(q.prompt_tokens) for q in requests],
                                                [q.observed_prefill_seconds for q in requests])
    concurrency = {k: _Concurrency(v) for k, v in intervals.items()}
    if len(decoding) >= 3:
        batches = [concurrency[k].mean(s, e) for k, s, e, _ in decoding]
        decode_base, decode_per_seq = _fit_line(batches, [itl for *_, itl in decoding])
        max_batch = max(batches)
        sources["step_time"] = (f"least squares over {len(requests)} prefill times and {len(decoding)} "
                                f"requests' ITL against their running batch (1-{max_batch:.0f})")
    else:
        decode_base, decode_per_seq, max_batch = 0.0, 0.0, 1.0
        notes.append("too few multi-token outputs to fit decode step times: decode is taken as free")
    step_time = StepTimeModel(prefill_base, prefill_per_token, decode_base, decode_per_seq, max_batch,
                              max(q.prompt_tokens for q in requests))

    running_peak_rows = max(c.peak() for c in concurrency.values())
    running = signals.get("running_requests") or []
    waiting = signals.get("queue_depth") or []
    kv = signals.get("kv_cache_usage_ratio") or []

    # KV pool.
    num_kv_blocks, block_size = _kv_pool(kv, requests, concurrency, intervals, start_s, notes, sources)
    kv_values = [v for series in kv for _, v in series]
    kv_mean = math.fsum(kv_values) / len(kv_values) if kv_values else None
    kv_max = max(kv_values) if kv_values else None

    # Batch limit.
    max_num_seqs = DEFAULT_MAX_NUM_SEQS
    if running:
        running_peak = max(v for series in running for _, v in series)
        at_limit = _waited_at_peak(running, waiting, kv, running_peak)
        if at_limit:
            max_num_seqs = max(1, round(running_peak))
            sources["max_num_seqs"] = (f"running_requests peak {running_peak:.0f} with requests waiting and KV below "
                                       f"{KV_FULL_RATIO:.0%} at {at_limit} scrapes")
        else:
            notes.append(f"the batch limit was never reached (running peak {running_peak:.0f} without a queue "
                         f"while KV had room): vLLM's default max_num_seqs {DEFAULT_MAX_NUM_SEQS} is assumed")
    else:
        queued = sum(1 for q in requests if q.observed_queue_seconds > 0.05)
        if queued >= max(3, len(requests) // 20) and num_kv_blocks is None:
            max_num_seqs = max(1, running_peak_rows)
            sources["max_num_seqs"] = f"peak of requests running at once in the spans ({running_peak_rows}); no gauge"
        notes.append("no running_requests gauge: the batch limit is read from the spans alone")

    preemptions = None
    counters = signals.get("preemptions_total") or []
    if counters:
        preemptions = math.fsum(max(0.0, s[-1][1] - s[0][1]) for s in counters if s)
    if not kv:
        notes.append("no KV-cache usage signal (kv_cache_usage_ratio): the KV pool is taken as unlimited; "
                     "KV usage and KV changes cannot be predicted")
    return Calibration(
        requests=requests, step_time=step_time, replicas=len(replica_names), num_kv_blocks=num_kv_blocks,
        block_size_tokens=block_size, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=DEFAULT_MAX_NUM_BATCHED_TOKENS, window_seconds=window_seconds,
        observed_kv_mean_ratio=kv_mean, observed_kv_max_ratio=kv_max, observed_preemptions=preemptions,
        sources=sources, notes=notes)


def _waited_at_peak(running, waiting, kv, peak: float) -> int:
    """Scrapes where running was at its peak, something waited and KV had room."""
    def asof(series_list, t):
        values = []
        for series in series_list:
            times = [x for x, _ in series]
            i = bisect.bisect_right(times, t) - 1
            if i >= 0:
                values.append(series[i][1])
        return values

    count = 0
    for series in running:
        for t, value in series:
            if value < peak:
                continue
            w = sum(asof(waiting, t))
            k = max(asof(kv, t), default=0.0)
            if w >= 1 and k < KV_FULL_RATIO:
                count += 1
    return count


def usable_blocks(values: Sequence[float], limit: int = 1 << 20) -> int | None:
    """The common denominator of KV usage ratios (used / usable blocks): the usable block
    count, or ``None`` when the values do not pin one down (fewer than 3 distinct nonzero
    values, or a denominator over ``limit``)."""
    distinct = sorted({v for v in values if 0 < v <= 1})
    if len(distinct) < 3:
        return None
    n = 1
    for v in distinct:
        d = Fraction(v).limit_denominator(limit).denominator
        n = n * d // math.gcd(n, d)
        if n > limit:
            return None
    return n


def _kv_pool(kv, requests, concurrency, intervals, start_s, notes, sources) -> tuple[int | None, int]:
    if not kv:
        return None, DEFAULT_BLOCK_SIZE_TOKENS
    # Tokens in KV of each running request at each scrape (prompt + tokens emitted so far).
    by_replica: dict[int, list[TraceRequest]] = {}
    for q in requests:
        by_replica.setdefault(q.replica_index, []).append(q)
    samples: list[tuple[float, list[int]]] = []  # (usage, tokens of each running request)
    values = [usage for series in kv for _, usage in series]
    for index, series in enumerate(kv):
        k = index if len(kv) == len(by_replica) else 0
        mine = sorted(by_replica.get(k, requests), key=lambda q: q.engine_arrival_seconds + q.observed_queue_seconds)
        starts = [q.engine_arrival_seconds + q.observed_queue_seconds for q in mine]
        longest = max((q.observed_ttft_seconds + (q.observed_itl_seconds or 0.0) * q.output_tokens for q in mine),
                      default=0.0)
        stride = max(1, len(series) // _KV_SAMPLES)  # enough scrapes to pin the block size down
        for t_ns, usage in series[::stride]:
            t = t_ns / 1e9 - start_s
            tokens = []
            lo, hi = bisect.bisect_left(starts, t - longest), bisect.bisect_right(starts, t)
            for q in mine[lo:hi]:
                scheduled = q.engine_arrival_seconds + q.observed_queue_seconds
                first = q.arrival_seconds + q.observed_ttft_seconds
                end = first + (q.observed_itl_seconds or 0.0) * (q.output_tokens - 1)
                if scheduled <= t < end:
                    done = 0 if t < first else 1 + int((t - first) / max(q.observed_itl_seconds or 1e-9, 1e-9))
                    tokens.append(q.prompt_tokens + min(done, q.output_tokens))
            if tokens and usage > 0:
                samples.append((usage, tokens))
    blocks = usable_blocks(values)
    if not samples:
        notes.append("KV usage was never nonzero while requests ran: the KV pool cannot be calibrated "
                     "and is taken as unlimited")
        return None, DEFAULT_BLOCK_SIZE_TOKENS
    if blocks is None:
        # Capacity in tokens from usage against tokens in flight, in blocks of the default size.
        capacity = quantile([sum(tokens) / usage for usage, tokens in samples], 0.5)
        blocks = max(1, round(capacity / DEFAULT_BLOCK_SIZE_TOKENS))
        sources["kv_blocks"] = (f"tokens in flight / KV usage over {len(samples)} scrapes: {capacity:.0f} tokens, "
                                f"in blocks of {DEFAULT_BLOCK_SIZE_TOKENS} (assumed)")
        return blocks, DEFAULT_BLOCK_SIZE_TOKENS
    best, best_error = DEFAULT_BLOCK_SIZE_TOKENS, math.inf
    for size in BLOCK_SIZES:
        error = math.fsum(abs(sum(-(-t // size) for t in tokens) - usage * blocks) for usage, tokens in samples)
        if error < best_error:
            best, best_error = size, error
    sources["kv_blocks"] = (f"{blocks} usable blocks (the common denominator of {len(set(values))} KV usage "
                            f"values) of {best} tokens (best match of the tokens in flight at {len(samples)} scrapes)")
    return blocks, best


def fetch_calibration(store: Any, start: datetime, end: datetime) -> Calibration:
    """:func:`calibrate` over the stored window ``[start, end)``: its ``ok`` request rows and the
    engine gauges sampled inside it. Raises :class:`InsufficientSignalsError` (see there)."""
    from inferpath.analysis.breakdown import fetch_request_rows
    from inferpath.analysis.signals import fetch_series

    rows = fetch_request_rows(store, start=start, end=end, columns=ROW_COLUMNS)
    start_ns, end_ns = round(start.timestamp() * 1e9), round(end.timestamp() * 1e9)
    signals: dict[str, list[list[tuple[int, float]]]] = {}
    for name, table in (("running_requests", "otel_metrics_gauge"), ("queue_depth", "otel_metrics_gauge"),
                        ("kv_cache_usage_ratio", "otel_metrics_gauge"), ("preemptions_total", "otel_metrics_sum")):
        found = []
        for key, series in sorted(fetch_series(store, name, start, end, table=table).items()):
            if any(k == "inferpath.combined" for k, _ in key[2]):
                continue
            points = [(t, v) for t, v in zip(series.times_ns, series.values) if start_ns <= t < end_ns]
            if points:
                found.append(points)
        signals[name] = found
    return calibrate(rows, signals, window_start=start, window_end=end)


__all__ = ["Calibration", "fetch_calibration", "InsufficientSignalsError", "ROW_COLUMNS", "StepTimeModel", "TraceRequest", "calibrate",
           "usable_blocks"]
