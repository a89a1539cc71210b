"""Calibrating the what-if's engine model from a stored window: no vendor profile, only what
the window itself recorded.

- **Arrivals and tokens**: one :class:`TraceRequest` per request row (``timestamp``,
  ``input_tokens``, ``output_tokens``, ``endpoint_class``, ``replica``), with its observed
  TTFT and E2E (the client's where the caller is instrumented, else the server's:
  ``vocabulary.client_first_ns``, as the diagnosis and the views read them), ``queue_ns``,
  ``prefill_ns``, ``decode_ns``. The time before the scheduler saw it (``ttft − queue −
  prefill``: the client's hop, the gateway, HTTP, tokenization, IPC) is kept per request, so a
  prediction is of the TTFT the end user waits for.
- **Step times** (:class:`StepTimeModel`): vLLM V1 runs decodes and prompt chunks in the same
  steps, so one law for every step: ``step ≈ base + per_sequence·sequences + per_token·prompt
  tokens``. Robust least squares (Huber weights, no coefficient below 0) over two kinds of
  equations, one per request: its prefill time is the steps that computed its prompt (the
  sequences are those running then; the prompt tokens are all those computed meanwhile, each
  request's prompt spread evenly over its own prefill interval, so that prompts admitted in
  the same step and the chunks of a long prompt count; a step takes at most the token budget),
  and its mean ITL is the mean step over its decode (the mean running batch then, plus the
  prompt tokens computed meanwhile spread over its tokens). The weights keep outliers of that
  law from pulling it: a preempted request's ITL counts its wait back in the
  queue, a prefill may share its step with another request's prompt chunk.
  The running batch is counted from the rows themselves (requests between their first
  schedule and their last token, per replica), so the fit needs engine spans but no gauges.
  How a step grows with the batch is only measured over the batches the window saw; a
  window whose batch stayed put (always at its limit) cannot tell, and says so in a note.
- **Prefix caching**: vLLM V1 keeps computed prompt blocks and reuses them for prompts that
  start the same way (on by default). Its counters (``prefix_cache_queries_total``,
  ``prefix_cache_hits_total``, tokens) give the window's hit ratio, and the step law and the
  replay count only the rest of each prompt as computed. On a real vLLM at a 32-token step
  budget (92-98 % of prompt tokens cached), replaying every prompt token put the replay off by
  +83,000 %; with the hit ratio, +8 %. A cached prefix still holds its KV blocks in the replay
  (shared blocks are not modeled).
- **KV pool**: from the engine when it says: ``vllm:cache_config_info`` (signal
  ``kv_cache_config_info``) carries ``num_gpu_blocks`` and ``block_size`` as labels; vLLM
  reserves one of the blocks (the null block), so ``num_gpu_blocks − 1`` are usable. Otherwise
  from the usage gauge: vLLM's ``kv_cache_usage_perc`` is ``used blocks / usable blocks``, so
  its values are fractions whose common denominator is the number of usable blocks; the block
  size is the power of two whose block counts of the tokens in flight (from the rows, at each
  scrape) best match ``usage × blocks``. Without either the pool is unlimited and KV changes
  cannot be predicted.
- **Batch limit**: the peak of ``running_requests`` when requests waited at it while KV had
  room (the limit was reached); otherwise the limit was never binding and vLLM's default
  (256) is assumed, with a note. The step's token budget is vLLM's default for its
  OpenAI server (2048; ``max_num_batched_tokens`` is not exported), unless the caller
  gives the engine's own.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from fractions import Fraction
from typing import Any

from inferpath.analysis.percentiles import quantile
from inferpath.analysis.whatif_engine import EngineSettings
from inferpath.vocabulary import (
    KV_CACHE_CONFIG_INFO,
    PREFIX_CACHE_HITS_TOTAL,
    PREFIX_CACHE_QUERIES_TOTAL,
    client_first_ns,
)

DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default --max-num-seqs
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # vLLM V1's default prompt-token budget per step
DEFAULT_BLOCK_SIZE_TOKENS = 16  # vLLM's default --block-size
BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
KV_FULL_RATIO = 0.9
_KV_SAMPLES = 300
MIN_REQUESTS = 20

ROW_COLUMNS = (
    "timestamp",
    "endpoint_class",
    "replica",
    "input_tokens",
    "output_tokens",
    "ttft_ns",
    "e2e_ns",
    "client_ttft_ns",
    "client_e2e_ns",
    "queue_ns",
    "prefill_ns",
    "decode_ns",
    "itl_ns",
)


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
    """Engine step time, seconds: ``base_seconds + per_sequence_seconds · sequences +
    per_prefill_token_seconds · prompt tokens`` for a step that computes one token for each
    decoding sequence and prompt (or recompute) chunks for the others (linear beyond the
    observed range too), with the range of running batches it was fitted on."""

    base_seconds: float
    per_sequence_seconds: float
    per_prefill_token_seconds: float
    min_batch_observed: float
    max_batch_observed: float
    max_prompt_tokens_observed: int

    def step_seconds(self, num_seqs: int, prefill_tokens: int) -> float:
        """Seconds of one step over ``num_seqs`` sequences, ``prefill_tokens`` of them prompt tokens."""
        return (
            self.base_seconds + self.per_sequence_seconds * num_seqs + self.per_prefill_token_seconds * prefill_tokens
        )

    def scaled(self, factor: float) -> StepTimeModel:
        """The same model with every step ``factor`` times as long."""
        return replace(
            self,
            base_seconds=self.base_seconds * factor,
            per_sequence_seconds=self.per_sequence_seconds * factor,
            per_prefill_token_seconds=self.per_prefill_token_seconds * factor,
        )

    def scaled_decode(self, factor: float) -> StepTimeModel:
        """The same model with the per-step and per-sequence parts ``factor`` times as long."""
        return replace(
            self, base_seconds=self.base_seconds * factor, per_sequence_seconds=self.per_sequence_seconds * factor
        )


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
    prefix_cache_hit_ratio: float = 0.0
    """Share of the window's prompt tokens the engine found in its prefix cache (vLLM's
    ``prefix_cache_hits_total`` / ``prefix_cache_queries_total``); 0 when not exported. The
    replay computes only the rest of each prompt (:meth:`cached_tokens`)."""
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def cached_tokens(self, prompt_tokens: int) -> int:
        """Tokens of a ``prompt_tokens`` prompt taken as found in the prefix cache: the window's
        hit ratio of it, at most all but one (the engine computes the last prompt token)."""
        return max(0, min(prompt_tokens - 1, round(prompt_tokens * self.prefix_cache_hit_ratio)))

    def engine_settings(self) -> EngineSettings:
        """The observed configuration of one engine; an unknown KV pool is unlimited."""
        blocks = self.num_kv_blocks or 1 << 40
        return EngineSettings(blocks, self.block_size_tokens, self.max_num_seqs, self.max_num_batched_tokens)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (not the requests)."""
        st = self.step_time
        return {
            "requests": len(self.requests),
            "window_seconds": self.window_seconds,
            "replicas": self.replicas,
            "num_kv_blocks": self.num_kv_blocks,
            "block_size_tokens": self.block_size_tokens if self.num_kv_blocks else None,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "prefix_cache_hit_ratio": self.prefix_cache_hit_ratio,
            "step_base_seconds": st.base_seconds,
            "step_per_sequence_seconds": st.per_sequence_seconds,
            "step_per_prefill_token_seconds": st.per_prefill_token_seconds,
            "min_batch_observed": st.min_batch_observed,
            "max_batch_observed": st.max_batch_observed,
            "sources": self.sources,
            "notes": self.notes,
        }


def _solve(gram: Sequence[Sequence[float]], moments: Sequence[float], columns: Sequence[int]) -> list[float] | None:
    """The normal equations restricted to ``columns`` (Gaussian elimination with pivoting);
    ``None`` when they are singular."""
    k = len(columns)
    a = [[gram[i][j] for j in columns] for i in columns]
    b = [moments[i] for i in columns]
    for c in range(k):
        pivot = max(range(c, k), key=lambda r: abs(a[r][c]))
        if abs(a[pivot][c]) < 1e-18:
            return None
        a[c], a[pivot], b[c], b[pivot] = a[pivot], a[c], b[pivot], b[c]
        for r in range(k):
            if r != c:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c])]
                b[r] -= f * b[c]
    return [b[i] / a[i][i] for i in range(k)]


def fit_nonnegative(
    rows: Sequence[Sequence[float]], ys: Sequence[float], weights: Sequence[float] | None = None
) -> list[float]:
    """Least squares ``y ≈ rows · x`` with every ``x ≥ 0`` (a step never costs less with more
    work), each equation weighted by ``weights`` (default 1): the best of the unconstrained
    fits over every subset of the columns that comes out nonnegative (few columns, so all
    subsets); zeros when none does."""
    n = len(rows[0]) if rows else 0
    w = weights if weights is not None else [1.0] * len(rows)
    gram = [[math.fsum(wi * r[i] * r[j] for r, wi in zip(rows, w)) for j in range(n)] for i in range(n)]
    moments = [math.fsum(wi * r[i] * y for r, y, wi in zip(rows, ys, w)) for i in range(n)]
    best: tuple[float, list[float]] | None = None
    for size in range(n, 0, -1):
        for columns in itertools.combinations(range(n), size):
            coefficients = _solve(gram, moments, columns)
            if coefficients is None or min(coefficients) < 0:
                continue
            x = [0.0] * n
            for c, v in zip(columns, coefficients):
                x[c] = v
            # |y - Ax|^2 = y'y - 2 x'A'y + x'A'Ax; y'y is the same for every candidate
            error = math.fsum(x[i] * x[j] * gram[i][j] for i in range(n) for j in range(n)) - 2 * math.fsum(
                x[i] * moments[i] for i in range(n)
            )
            if best is None or error < best[0]:
                best = (error, x)
    return best[1] if best else [0.0] * n


HUBER_K = 1.345
"""Huber's constant: equations off by more than this many robust standard deviations weigh
less (95 % efficiency when the noise is normal)."""
ROBUST_ROUNDS = 8
MAX_FIT_EQUATIONS = 10_000
"""A longer window is fitted on an even sample of its equations (enough to pin three numbers)."""


def fit_robust(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """:func:`fit_nonnegative` with Huber weights, iteratively reweighted: a preempted
    request's ITL (its wait back in the queue counted in) or a prefill that shared its step
    with another request's prompt chunk is an outlier of the step law, and must not pull it.
    More than :data:`MAX_FIT_EQUATIONS` equations are thinned evenly first; the rounds stop
    once no coefficient moves by 0.1 %."""
    if len(rows) > MAX_FIT_EQUATIONS:
        stride = len(rows) / MAX_FIT_EQUATIONS
        picked = [int(i * stride) for i in range(MAX_FIT_EQUATIONS)]
        rows, ys = [rows[i] for i in picked], [ys[i] for i in picked]
    weights = [1.0] * len(rows)
    x = fit_nonnegative(rows, ys, weights)
    for _ in range(ROBUST_ROUNDS):
        previous = x
        residuals = [y - math.fsum(v * c for v, c in zip(r, x)) for r, y in zip(rows, ys)]
        center = quantile(residuals, 0.5)
        scale = 1.4826 * quantile([abs(e - center) for e in residuals], 0.5)
        if scale <= 0:
            break
        limit = HUBER_K * scale
        weights = [1.0 if abs(e) <= limit else limit / abs(e) for e in residuals]
        x = fit_nonnegative(rows, ys, weights)
        if all(abs(a - b) <= 1e-3 * max(abs(b), 1e-12) for a, b in zip(x, previous)):
            break
    return x


class _Concurrency:
    """The running batch of one replica over time, from request intervals [scheduled, end):
    a step function with its running integral, so a mean over any interval costs two searches.
    With ``rates`` each interval adds its own rate instead of 1 (prompt tokens per second)."""

    def __init__(self, intervals: Sequence[tuple[float, float]], rates: Sequence[float] | None = None) -> None:
        events: list[tuple[float, float]]
        if rates is None:
            events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
        else:
            events = sorted(
                [(s, r) for (s, _), r in zip(intervals, rates)] + [(e, -r) for (_, e), r in zip(intervals, rates)]
            )
        self.times: list[float] = []
        self.counts: list[float] = []
        self.integral: list[float] = []
        count, area, last = 0.0, 0.0, None
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

    def total(self, start: float, end: float) -> float:
        """Integral over [start, end) (request-seconds, or prompt tokens with rates)."""
        return self._area(end) - self._area(start) if end > start else 0.0

    def at(self, t: float) -> float:
        """Running count just after ``t``."""
        i = bisect.bisect_right(self.times, t) - 1
        return self.counts[i] if i >= 0 else 0

    def peak(self) -> int:
        return round(max(self.counts, default=0))


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value) / 1e9


def calibrate(
    rows: Sequence[Mapping[str, Any]],
    signals: Mapping[str, Sequence[Sequence[tuple[int, float]]]],
    *,
    window_start: datetime,
    window_end: datetime,
    cache_configs: Sequence[Mapping[str, str]] = (),
) -> Calibration:
    """Build the :class:`Calibration` of a window.

    ``rows``: request rows with :data:`ROW_COLUMNS` (``ok`` requests of the window);
    ``signals``: per canonical signal (``running_requests``, ``queue_depth``,
    ``kv_cache_usage_ratio``, ``preemptions_total``) a list of series, one per engine, each
    a list of ``(unix ns, value)`` inside the window; ``cache_configs``: the attributes of each
    engine's ``kv_cache_config_info`` series (``num_gpu_blocks``, ``block_size``), when the
    engine exports them. Raises :class:`InsufficientSignalsError`
    naming what is missing: too few requests, or no engine spans (queue/prefill/decode times).
    """
    start_s = window_start.timestamp()
    window_seconds = max(1e-3, window_end.timestamp() - start_s)
    if len(rows) < MIN_REQUESTS:
        raise InsufficientSignalsError(
            f"insufficient data: {len(rows)} requests in the window, need {MIN_REQUESTS}; widen the window or wait "
            "for more traffic"
        )
    usable = [
        r
        for r in rows
        if r.get("prefill_ns") is not None
        and r.get("queue_ns") is not None
        and client_first_ns(r, "ttft") is not None
        and client_first_ns(r, "e2e") is not None
        and r.get("input_tokens")
        and r.get("output_tokens")
    ]
    if len(usable) < MIN_REQUESTS:
        raise InsufficientSignalsError(
            f"no engine spans: {len(usable)} of {len(rows)} requests carry the engine's queue and prefill times "
            f"and token counts (an llm_request span, vLLM's or the instrumented engine's); step times cannot be "
            f"calibrated without them"
        )
    notes: list[str] = []
    sources: dict[str, str] = {}
    if len(usable) < len(rows):
        notes.append(f"{len(rows) - len(usable)} requests without engine timings or token counts were left out")
    replica_names = sorted({str(r.get("replica") or "") for r in usable})
    replica_index = {name: i for i, name in enumerate(replica_names)}

    requests: list[TraceRequest] = []
    intervals: dict[int, list[tuple[float, float]]] = {}
    for r in usable:
        arrival = r["timestamp"].timestamp() - start_s
        # present on every usable row (checked above)
        ttft, queue, prefill = (
            client_first_ns(r, "ttft") / 1e9,
            float(r["queue_ns"]) / 1e9,
            float(r["prefill_ns"]) / 1e9,
        )
        e2e = client_first_ns(r, "e2e") / 1e9
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
        requests.append(
            TraceRequest(
                arrival,
                arrival + api,
                api,
                int(r["input_tokens"]),
                out_tokens,
                str(r.get("endpoint_class") or ""),
                k,
                ttft,
                queue,
                prefill,
                itl,
            )
        )

    # Prefix caching: only the prompt tokens the cache did not hold are computed.
    hit_ratio = _prefix_cache_hit_ratio(signals, sources)

    # Step times.
    concurrency = {k: _Concurrency(v) for k, v in intervals.items()}
    step_time = _fit_step_time(requests, concurrency, notes, sources, hit_ratio=hit_ratio)

    running_peak_rows = max(c.peak() for c in concurrency.values())
    running = signals.get("running_requests") or []
    waiting = signals.get("queue_depth") or []
    kv = signals.get("kv_cache_usage_ratio") or []

    # KV pool.
    pool = _configured_pool(cache_configs, notes, sources)
    num_kv_blocks: int | None
    if pool is not None:
        num_kv_blocks, block_size = pool
    else:
        num_kv_blocks, block_size = _kv_pool(kv, requests, concurrency, intervals, start_s, notes, sources)
    kv_values = [v for series in kv for _, v in series]
    kv_max = max(kv_values) if kv_values else None
    # The mean over the scrapes from the first arrival to the last request's end, the span the
    # replay's mean covers: a window of -30m around a two-minute load would otherwise compare
    # the load's own scrapes (0.74) with a replay averaged over half an hour (0.09).
    first = min(q.arrival_seconds for q in requests)
    last = max(end for spans in intervals.values() for _, end in spans)
    in_span = [v for series in kv for ts, v in series if first <= ts / 1e9 - start_s <= last]
    kv_mean_values = in_span or kv_values
    kv_mean = math.fsum(kv_mean_values) / len(kv_mean_values) if kv_mean_values else None

    # Batch limit.
    max_num_seqs = DEFAULT_MAX_NUM_SEQS
    if running:
        running_peak = max(v for series in running for _, v in series)
        at_limit = _waited_at_peak(running, waiting, kv, running_peak)
        if at_limit:
            max_num_seqs = max(1, round(running_peak))
            sources["max_num_seqs"] = (
                f"running_requests peak {running_peak:.0f} with requests waiting and KV below "
                f"{KV_FULL_RATIO:.0%} at {at_limit} scrapes"
            )
        else:
            notes.append(
                f"the batch limit was never reached (running peak {running_peak:.0f} without a queue "
                f"while KV had room): vLLM's default max_num_seqs {DEFAULT_MAX_NUM_SEQS} is assumed"
            )
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
    if num_kv_blocks is None:
        notes.append(
            "no KV-cache signal (kv_cache_config_info or kv_cache_usage_ratio): the KV pool is taken as "
            "unlimited; KV usage and KV changes cannot be predicted"
        )
    sources["max_num_batched_tokens"] = (
        f"vLLM's default ({DEFAULT_MAX_NUM_BATCHED_TOKENS}): engines do not export it; give the engine's own "
        "(--max-num-batched-tokens) if it differs"
    )
    return Calibration(
        requests=requests,
        step_time=step_time,
        replicas=len(replica_names),
        num_kv_blocks=num_kv_blocks,
        block_size_tokens=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        window_seconds=window_seconds,
        observed_kv_mean_ratio=kv_mean,
        observed_kv_max_ratio=kv_max,
        observed_preemptions=preemptions,
        prefix_cache_hit_ratio=hit_ratio,
        sources=sources,
        notes=notes,
    )


def _prefix_cache_hit_ratio(
    signals: Mapping[str, Sequence[Sequence[tuple[int, float]]]], sources: dict[str, str]
) -> float:
    """Hits over lookups of the prefix-cache counters' increase within the window, summed over
    engines; 0 without them (every prompt token computed, as an engine without the cache)."""
    queried = math.fsum(max(0.0, s[-1][1] - s[0][1]) for s in signals.get("prefix_cache_queries_total") or [] if s)
    hits = math.fsum(max(0.0, s[-1][1] - s[0][1]) for s in signals.get("prefix_cache_hits_total") or [] if s)
    if queried <= 0:
        sources["prefix_cache_hit_ratio"] = "no prefix-cache counters in the window: every prompt token is computed"
        return 0.0
    ratio = min(1.0, hits / queried)
    sources["prefix_cache_hit_ratio"] = (
        f"prefix_cache_hits_total / prefix_cache_queries_total over the window: {hits:,.0f} of {queried:,.0f} "
        f"prompt tokens ({ratio:.0%})"
    )
    return ratio


NARROW_BATCH_RANGE = 1.5
"""A window whose mean running batches span less than this factor cannot tell how a step
grows with the batch."""


def _fit_step_time(
    requests: Sequence[TraceRequest],
    concurrency: Mapping[int, _Concurrency],
    notes: list[str],
    sources: dict[str, str],
    token_budget: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    *,
    hit_ratio: float = 0.0,
) -> StepTimeModel:
    """The step law from the window's spans (module docstring): one prefill equation and, for
    a request with two tokens or more, one ITL equation each, solved together. A prefill
    whose prompts exceed the step's ``token_budget`` spans that many steps. Prompt tokens
    count as computed only for the share the prefix cache missed (``1 - hit_ratio``)."""
    computed = 1.0 - hit_ratio
    by_replica: dict[int, list[TraceRequest]] = {}
    for q in requests:
        by_replica.setdefault(q.replica_index, []).append(q)
    prefill_rows: list[tuple[float, float, float]] = []
    prefill_ys: list[float] = []
    decode_rows: list[tuple[float, float, float]] = []
    decode_ys: list[float] = []
    batches: list[float] = []
    # Two equations per request at most: a long window gives an even sample of its requests.
    every = max(1, math.ceil(2 * len(requests) / MAX_FIT_EQUATIONS))
    for k, mine in by_replica.items():
        running = concurrency[k]
        # Prompt tokens computed over time: each request's prompt spread evenly over its
        # prefill interval (one step, or the steps of its chunks), so that a step shared with
        # other requests' prompts or chunks counts their tokens too.
        prefills = [
            (q.engine_arrival_seconds + q.observed_queue_seconds, q.arrival_seconds + q.observed_ttft_seconds)
            for q in mine
        ]
        prompts = _Concurrency(
            [(s, max(e, s + 1e-6)) for s, e in prefills],
            [computed * q.prompt_tokens / max(e - s, 1e-6) for q, (s, e) in zip(mine, prefills)],
        )
        for i, q in enumerate(mine):
            if i % every:
                continue
            at, first = prefills[i]
            batch = float(running.at(at + 1e-9))
            tokens = max(computed * q.prompt_tokens, prompts.total(at, max(first, at + 1e-6)))
            # a prompt longer than the step's budget is computed in chunks, one step each
            steps = max(1, math.ceil(tokens / max(1.0, token_budget - batch)))
            prefill_rows.append((float(steps), steps * batch, tokens))
            prefill_ys.append(q.observed_prefill_seconds)
            if q.observed_itl_seconds is None:
                continue
            end = first + q.observed_itl_seconds * (q.output_tokens - 1)
            batch = running.mean(first, end)
            decode_rows.append((1.0, batch, prompts.total(first, end) / (q.output_tokens - 1)))
            decode_ys.append(q.observed_itl_seconds)
            batches.append(batch)
    # The prompt tokens' cost from the prefill times (prompts of every size), the per-step and
    # per-sequence costs from the ITLs (batches of every size), each where it shows.
    base, per_sequence, per_token = fit_robust(prefill_rows, prefill_ys)
    if len(decode_rows) >= 3:
        base, per_sequence = fit_robust(
            [r[:2] for r in decode_rows], [y - per_token * r[2] for r, y in zip(decode_rows, decode_ys)]
        )
    low, high = (min(batches), max(batches)) if batches else (1.0, 1.0)
    sources["step_time"] = (
        f"robust least squares: the per-token cost over {len(prefill_ys)} prefill times, the "
        f"per-step and per-sequence costs over {len(batches)} requests' ITL against the running "
        f"batch ({low:.1f}-{high:.1f})"
    )
    if len(decode_rows) < 3:
        notes.append("too few multi-token outputs to see decode steps: the step law rests on prefill times alone")
    elif high < NARROW_BATCH_RANGE * max(low, 1.0):
        notes.append(
            f"the running batch stayed within {low:.1f}-{high:.1f} sequences: how a step grows with the "
            f"batch is barely measured, so changes that run other batch sizes are uncertain"
        )
    return StepTimeModel(base, per_sequence, per_token, low, high, max(q.prompt_tokens for q in requests))


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


def _configured_pool(
    configs: Sequence[Mapping[str, str]], notes: list[str], sources: dict[str, str]
) -> tuple[int, int] | None:
    """Usable blocks and block size from the engines' own cache configuration (vLLM keeps one
    of ``num_gpu_blocks`` as its null block); ``None`` when no engine reports both."""
    pools = set()
    for config in configs:
        try:
            blocks, size = int(config["num_gpu_blocks"]), int(config["block_size"])
        except (KeyError, TypeError, ValueError):
            continue  # "None" before the engine sized its pool, or another engine's labels
        if blocks > 1 and size > 0:
            pools.add((blocks - 1, size))
    if not pools:
        return None
    blocks, size = min(pools)
    sources["kv_blocks"] = (
        f"{blocks} usable blocks of {size} tokens: the engine's cache_config_info "
        f"(num_gpu_blocks {blocks + 1}, one kept as vLLM's null block)"
    )
    if len(pools) > 1:
        notes.append(
            f"the engines report different KV pools ({', '.join(f'{b + 1}x{s}' for b, s in sorted(pools))}); "
            f"every simulated engine gets the smallest"
        )
    return blocks, size


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
        longest = max(
            (q.observed_ttft_seconds + (q.observed_itl_seconds or 0.0) * q.output_tokens for q in mine), default=0.0
        )
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
        notes.append(
            "KV usage was never nonzero while requests ran: the KV pool cannot be calibrated and is taken as unlimited"
        )
        return None, DEFAULT_BLOCK_SIZE_TOKENS
    if blocks is None:
        # Capacity in tokens from usage against tokens in flight, in blocks of the default size.
        capacity = quantile([sum(tokens) / usage for usage, tokens in samples], 0.5)
        blocks = max(1, round(capacity / DEFAULT_BLOCK_SIZE_TOKENS))
        sources["kv_blocks"] = (
            f"tokens in flight / KV usage over {len(samples)} scrapes: {capacity:.0f} tokens, "
            f"in blocks of {DEFAULT_BLOCK_SIZE_TOKENS} (assumed)"
        )
        return blocks, DEFAULT_BLOCK_SIZE_TOKENS
    best, best_error = DEFAULT_BLOCK_SIZE_TOKENS, math.inf
    for size in BLOCK_SIZES:
        error = math.fsum(abs(sum(-(-t // size) for t in tokens) - usage * blocks) for usage, tokens in samples)
        if error < best_error:
            best, best_error = size, error
    sources["kv_blocks"] = (
        f"{blocks} usable blocks (the common denominator of {len(set(values))} KV usage "
        f"values) of {best} tokens (best match of the tokens in flight at {len(samples)} scrapes)"
    )
    return blocks, best


def fetch_calibration(store: Any, start: datetime, end: datetime) -> Calibration:
    """:func:`calibrate` over the stored window ``[start, end)``: its ``ok`` request rows and the
    engine gauges sampled inside it. Raises :class:`InsufficientSignalsError` (see there)."""
    from inferpath.analysis.breakdown import fetch_request_rows
    from inferpath.analysis.signals import fetch_series

    rows = fetch_request_rows(store, start=start, end=end, columns=ROW_COLUMNS)
    start_ns, end_ns = round(start.timestamp() * 1e9), round(end.timestamp() * 1e9)
    signals: dict[str, list[list[tuple[int, float]]]] = {}
    for name, table in (
        ("running_requests", "otel_metrics_gauge"),
        ("queue_depth", "otel_metrics_gauge"),
        ("kv_cache_usage_ratio", "otel_metrics_gauge"),
        ("preemptions_total", "otel_metrics_sum"),
        (PREFIX_CACHE_QUERIES_TOTAL, "otel_metrics_sum"),
        (PREFIX_CACHE_HITS_TOTAL, "otel_metrics_sum"),
    ):
        found = []
        for key, series in sorted(fetch_series(store, name, start, end, table=table).items()):
            if any(k == "inferpath.combined" for k, _ in key[2]):
                continue
            points = [(t, v) for t, v in zip(series.times_ns, series.values) if start_ns <= t < end_ns]
            if points:
                found.append(points)
        signals[name] = found
    configs = [
        dict(key[2])
        for key, series in fetch_series(store, KV_CACHE_CONFIG_INFO, start, end).items()
        if not any(k == "inferpath.combined" for k, _ in key[2])
        and any(start_ns <= t < end_ns for t in series.times_ns)
    ]  # not an engine gone before the window
    if len(rows) < MIN_REQUESTS:
        from inferpath.analysis.engine_histograms import fetch_window_histograms

        first = fetch_window_histograms(store, start, end).get("ttft_ns")
        if first is not None and first.count >= MIN_REQUESTS:
            raise InsufficientSignalsError(
                f"no request spans: {len(rows)} in the window, where the engine's histograms counted "
                f"{first.count:.0f} first tokens; a replay needs each request's arrival and tokens: trace the "
                "engine (vLLM: --otlp-traces-endpoint) or instrument its caller"
            )
    return calibrate(rows, signals, window_start=start, window_end=end, cache_configs=configs)


__all__ = [
    "Calibration",
    "fetch_calibration",
    "InsufficientSignalsError",
    "ROW_COLUMNS",
    "StepTimeModel",
    "TraceRequest",
    "calibrate",
    "usable_blocks",
]
