"""What if: replay a stored window through the engine model under a changed configuration.

The engine model is the continuous-batching scheduler of :mod:`inferpath.analysis.continuous_batching`
with vLLM V1's policy (chunked prefill: decodes and prompt chunks share each step under a
token budget; the newest running sequence is preempted when KV blocks run out), run on a
virtual clock by :mod:`.whatif_engine`, with the step-time law, KV pool and batch limit
calibrated from the window itself (:mod:`.whatif_calibration`):

1. Every answer first replays the OBSERVED configuration (the same arrivals, on the same
   replicas) and compares it with what was observed: TTFT p50/p99, queue time and ITL per
   endpoint class. The largest relative error is the calibration error; over
   :data:`MAX_CALIBRATION_ERROR` the answer is refused (:class:`WhatIfRefused`), because a
   model that cannot reproduce the window cannot be trusted to change it.
2. Then the change (:class:`Change`: replicas, batch slots, KV blocks, batch window, arrival
   rate) is replayed with the same calibration, and its figures are put beside the observed.
3. The change is replayed again with every engine step :data:`STEP_TIME_SENSITIVITY` faster
   and slower (:attr:`WhatIf.sensitivity`). Near saturation the queue, and so TTFT, turns on
   a few percent of engine speed: predicting real vLLM at 4 slots from its run at 8 gives
   TTFT p50 0.03 s, 0.04 s, 0.57 s or 0.93 s with its steps taken 10 % faster, as fitted,
   10 % slower or 20 % slower (the real run at 4 slots: 2.47 s).
   Where that band moves a TTFT figure by more than :data:`SENSITIVE_ERROR`, the answer says
   so (a warning naming the range): the figure is then a range, not a number.

Definitions (as the request rows store them, vLLM's intervals): TTFT = arrival at the engine's
API → first token; queue = waiting for the first schedule; ITL = decode time / (output − 1).
A request's API-side time before it reaches the scheduler (``ttft − queue − prefill``) is kept
per request and added to its simulated TTFT unchanged.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from inferpath.analysis.percentiles import quantile, quantiles
from inferpath.analysis.whatif_calibration import Calibration, InsufficientSignalsError, TraceRequest
from inferpath.analysis.whatif_engine import EngineSettings, run_engine

MAX_CALIBRATION_ERROR = 0.30
"""The replay of the observed configuration must come within 30 % of what was observed."""
EXTRAPOLATION_FACTOR = 1.5
"""A change that takes a quantity beyond 1.5x the largest value observed is an extrapolation."""
KV_CHECK_MIN_RATIO = 0.10
"""Mean KV usage observed below which the replay's KV usage is not checked (a nearly empty
pool: relative errors of it mean nothing)."""
QUEUE_FLOOR_SECONDS = 0.05
"""TTFT figures under 50 ms (mean queue times under ten times that) are compared in absolute
terms (a relative error of a near-zero figure says nothing): both under it agree."""
STEP_TIME_SENSITIVITY = 0.10
"""How much faster and slower the engine's steps are taken for :attr:`WhatIf.sensitivity`:
the calibration's own uncertainty, as measured on real vLLM. The step law fitted from the
spans of one run was 12 % off that engine's iteration counters at a batch the run rarely
held (8 slots → batch 4), and two runs of one configuration on one machine stepped 0-7 %
apart at the same batch (tests/data/whatif_recordings)."""
SENSITIVE_ERROR = 0.25
"""A predicted TTFT figure that moves by more than this (relative, with the
:data:`QUEUE_FLOOR_SECONDS` floor) within the sensitivity band is reported as a range."""


MAX_REPLICAS = 1024
"""Engines a change may ask for, in all (``replicas``, or the sum of ``split_endpoint_classes``)."""
MAX_NUM_SEQS = 65_536
"""Batch slots per engine a change may ask for."""
MAX_FACTOR = 1000.0
"""The largest rate factor (``rate``) and KV-pool factor (``kv_blocks`` ``xK``)."""
MAX_BATCH_WINDOW_MS = 60_000.0
MAX_STEP_TOKEN_BUDGET = 1_048_576
"""The largest per-step token budget a change may give (as the observed one's bound)."""
"""The longest batch window a change may ask for, milliseconds."""
MAX_SIMULATED_REQUESTS = 1_000_000
"""A replay simulates at most this many requests (the observed window's, or the change's with
its rate factor); more is refused before anything is simulated. The engine replays 1 h at
50 req/s (180,000 requests) in under 10 s, so the limit is about a minute of replay."""

NO_PREDICTION = "no prediction"
"""How a refusal of a valid question starts (``no prediction: calibration off by...``), in
the read API's 422 and the CLI alike; a bad input starts with the input's name instead."""

API_NAMES: Mapping[str, str] = {
    name: name
    for name in (
        "start",
        "end",
        "replicas",
        "max_num_seqs",
        "kv_blocks",
        "batch_window_ms",
        "rate",
        "split_endpoint_classes",
        "max_calibration_error",
        "max_num_batched_tokens",
        "step_token_budget",
    )
}
"""The inputs of a what-if by their read-API parameter names (``GET /api/v1/whatif``): what
the ``{name}`` fields of a :attr:`WhatIfRefused.template` stand for there. The CLI formats
the same templates with its option names (``--rate``, ``--from``...)."""


def _literal(text: str) -> str:
    """``text`` (a user's input) safe inside a :attr:`WhatIfRefused.template`."""
    return text.replace("{", "{{").replace("}", "}}")


class WhatIfRefused(ValueError):
    """The prediction cannot be trusted or made; the message says why (exit 2 in the CLI,
    422 from the read API).

    ``template``: the message with each input it names written as a ``{name}`` field of
    :data:`API_NAMES` (e.g. ``{max_calibration_error}``), so that the read API names its
    parameters and the CLI its options in the same sentence; ``str()`` is the read API's.
    """

    def __init__(self, template: str) -> None:
        self.template = template
        super().__init__(self.text())

    def text(self, names: Mapping[str, str] = API_NAMES) -> str:
        """The message with each input named as ``names`` maps it (default the read API's)."""
        return self.template.format_map(names)


class WhatIfInputError(WhatIfRefused):
    """A bad input, not a refusal of a valid question: ``param`` is the read-API parameter at
    fault, and the message starts with its name (``{rate}: at most x1000, got 'x1e5'``).
    A subclass of :class:`WhatIfRefused`, so that one ``except`` catches both."""

    def __init__(self, param: str, problem: str) -> None:
        self.param = param
        super().__init__(f"{{{param}}}: {problem}")


@dataclass(frozen=True)
class Change:
    """A configuration change to predict. ``None`` keeps the observed value.

    ``replicas``: engines behind a round-robin gateway; ``max_num_seqs``: batch slots per
    engine; ``kv_blocks`` / ``kv_blocks_factor``: the KV pool per engine in blocks, absolute or
    as a multiple of the calibrated one; ``batch_window_seconds``: how long the queue head is
    held for more requests to join its prefill; ``rate_factor``: arrivals k times as dense (the
    window's pattern compressed by k and repeated to fill the same length);
    ``split_classes``: each endpoint class on engines of its own, ``((class, replicas), ...)``
    (every class of the window must be given; not with ``replicas``), the other settings
    the same for all; ``max_num_batched_tokens``: the engine's per-step token budget (vLLM's
    ``--max-num-batched-tokens``, at least the batch slots, as vLLM requires).

    Bounds (``ValueError`` naming the field otherwise): ``replicas`` and the replicas of
    ``split_classes`` in all at most :data:`MAX_REPLICAS`, ``max_num_seqs`` at most
    :data:`MAX_NUM_SEQS`, the factors above 0 and at most :data:`MAX_FACTOR`. The inputs as
    people write them are read by :func:`parse_change`.
    """

    replicas: int | None = None
    max_num_seqs: int | None = None
    kv_blocks: int | None = None
    kv_blocks_factor: float | None = None
    batch_window_seconds: float | None = None
    rate_factor: float | None = None
    split_classes: tuple[tuple[str, int], ...] | None = None
    max_num_batched_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("replicas", "max_num_seqs", "kv_blocks", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        for name, most in (
            ("replicas", MAX_REPLICAS),
            ("max_num_seqs", MAX_NUM_SEQS),
            ("max_num_batched_tokens", MAX_STEP_TOKEN_BUDGET),
        ):
            value = getattr(self, name)
            if value is not None and value > most:
                raise ValueError(f"{name}: must be at most {most}, got {value!r}")
        for name in ("kv_blocks_factor", "rate_factor"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value <= 0 or value > MAX_FACTOR):
                raise ValueError(f"{name}: must be a number > 0 and <= {MAX_FACTOR:g}, got {value!r}")
        if self.batch_window_seconds is not None and (
            not math.isfinite(self.batch_window_seconds) or self.batch_window_seconds < 0
        ):
            raise ValueError(f"batch_window_seconds: must be >= 0, got {self.batch_window_seconds!r}")
        if self.kv_blocks is not None and self.kv_blocks_factor is not None:
            raise ValueError("kv_blocks: give a block count or a factor, not both")
        if self.split_classes is not None:
            if self.replicas is not None:
                raise ValueError("split_classes: give replicas per class, not replicas as well")
            names = [name for name, _ in self.split_classes]
            if not names or len(set(names)) != len(names) or any(not name for name in names):
                raise ValueError(f"split_classes: each class once, by name, got {self.split_classes!r}")
            for name, count in self.split_classes:
                if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                    raise ValueError(f"split_classes: {name} needs an integer >= 1 replicas, got {count!r}")
            if sum(count for _, count in self.split_classes) > MAX_REPLICAS:
                raise ValueError(f"split_classes: at most {MAX_REPLICAS} replicas in all, got {self.split_classes!r}")

    @property
    def is_empty(self) -> bool:
        """True when nothing is changed (the answer is the replay alone)."""
        return all(getattr(self, f) is None for f in self.__dataclass_fields__)

    def describe(self) -> str:
        """The change as its inputs are written (:data:`API_NAMES`), e.g. ``replicas 2,
        kv_blocks x2, rate x0.5, batch_window_ms 5``."""
        shown = {
            "kv_blocks_factor": ("kv_blocks", "x{:g}"),
            "batch_window_seconds": ("batch_window_ms", "{:g}"),
            "rate_factor": ("rate", "x{:g}"),
            "max_num_batched_tokens": ("step_token_budget", "{}"),
        }
        parts = []
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if value is None:
                continue
            if name == "split_classes":
                parts.append("classes on their own engines: " + ", ".join(f"{c} {n}" for c, n in value))
            elif name in shown:
                label, form = shown[name]
                parts.append(f"{label} " + form.format(value * 1000 if name == "batch_window_seconds" else value))
            else:
                parts.append(f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}")
        return ", ".join(parts) or "none (the observed configuration)"


@dataclass(slots=True)
class SimulatedRequest:
    """One replayed request: its class and the simulated intervals, seconds."""

    endpoint_class: str
    ttft_seconds: float
    queue_seconds: float
    itl_seconds: float | None
    preemptions: int
    tokens: int = 1
    prefill_seconds: float = 0.0


@dataclass
class SimulationResult:
    """What a replay produced: per request figures, ``kv_usage_mean_ratio`` (time-weighted
    over the busy engines' run, the fullest engine's pool) and ``kv_usage_max_ratio``,
    ``preemptions_total``, ``rejected`` (requests that could never fit one engine's pool),
    ``unfinished`` (still running when the simulation stopped) and ``steps`` run."""

    requests: list[SimulatedRequest]
    kv_usage_mean_ratio: float
    kv_usage_max_ratio: float
    preemptions_total: int
    rejected: int
    unfinished: int
    steps: int
    token_weighted_itl_seconds: float | None = None
    busy_seconds: float = 0.0
    prefill_tokens: int = 0
    max_batch: int = 0


def simulate(
    requests: Sequence[TraceRequest],
    settings: EngineSettings,
    calibration: Calibration,
    *,
    replicas: int,
    assignment: Sequence[int] | None = None,
    horizon_seconds: float | None = None,
) -> SimulationResult:
    """Replay ``requests`` (arrival seconds from the window start, tokens) on ``replicas``
    engines of ``settings`` on a virtual clock; step times from ``calibration.step_time``
    (:func:`inferpath.analysis.whatif_engine.run_engine`, vLLM V1's scheduling).

    ``assignment``: the replica of each request (the observed routing); ``None`` routes round
    robin in arrival order. Routing does not depend on the engines' state, so each engine
    runs its own requests alone. Requests whose prompt and output can never fit one pool are
    rejected (counted), as vLLM rejects them. ``horizon_seconds`` stops the clock (default:
    20x the window, enough to drain any queue that drains at all).
    """
    step_seconds = calibration.step_time.step_seconds
    horizon = horizon_seconds if horizon_seconds is not None else 20 * max(calibration.window_seconds, 1.0) + 60
    arrivals = [r.engine_arrival_seconds for r in requests]
    order: Sequence[int] = range(len(requests))
    if any(a > b for a, b in zip(arrivals, arrivals[1:])):
        order = sorted(order, key=arrivals.__getitem__)
    per_engine: list[list[int]] = [[] for _ in range(replicas)]
    for turn, i in enumerate(order):
        per_engine[assignment[i] % replicas if assignment is not None else turn % replicas].append(i)
    out: list[SimulatedRequest] = []
    rejected = unfinished = steps = preemptions = prefill_tokens = decoded = max_batch = 0
    busy = decode_time = 0.0
    kv_means, kv_maxes = [], []
    for mine in per_engine:
        if not mine:
            continue
        run = run_engine(
            [arrivals[i] for i in mine],
            [requests[i].prompt_tokens for i in mine],
            [requests[i].output_tokens for i in mine],
            settings,
            step_seconds,
            horizon_s=horizon,
            cached_tokens=[calibration.cached_tokens(requests[i].prompt_tokens) for i in mine],
        )
        steps += run.steps
        busy += run.busy_seconds
        prefill_tokens += run.prefill_tokens
        max_batch = max(max_batch, run.max_batch)
        preemptions += sum(run.preemptions)
        kv_means.append(run.kv_usage_mean_ratio)
        kv_maxes.append(run.kv_usage_max_ratio)
        for j, i in enumerate(mine):
            if run.rejected[j]:
                rejected += 1
                continue
            first_token, finished, scheduled = run.first_token_s[j], run.finished_s[j], run.first_scheduled_s[j]
            if finished is None or first_token is None or scheduled is None:
                unfinished += 1
                continue
            request = requests[i]
            arrival = arrivals[i]
            tokens = request.output_tokens
            itl = None
            if tokens > 1:
                decode_time += finished - first_token
                decoded += tokens - 1
                itl = (finished - first_token) / (tokens - 1)
            out.append(
                SimulatedRequest(
                    request.endpoint_class,
                    request.api_seconds + first_token - arrival,
                    scheduled - arrival,
                    itl,
                    run.preemptions[j],
                    tokens,
                    first_token - scheduled,
                )
            )
    return SimulationResult(
        requests=out,
        kv_usage_mean_ratio=max(kv_means, default=0.0),
        kv_usage_max_ratio=max(kv_maxes, default=0.0),
        preemptions_total=preemptions,
        rejected=rejected,
        unfinished=unfinished,
        steps=steps,
        token_weighted_itl_seconds=decode_time / decoded if decoded else None,
        busy_seconds=busy,
        prefill_tokens=prefill_tokens,
        max_batch=max_batch,
    )


# --------------------------------------------------------------------------- figures


@dataclass
class ClassFigures:
    """Latency figures of one endpoint class (seconds): TTFT p50/p99, mean queue time,
    median ITL, and the request count."""

    requests: int
    ttft_p50_seconds: float | None
    ttft_p99_seconds: float | None
    queue_mean_seconds: float | None
    itl_p50_seconds: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "ttft_p50_seconds": self.ttft_p50_seconds,
            "ttft_p99_seconds": self.ttft_p99_seconds,
            "queue_mean_seconds": self.queue_mean_seconds,
            "itl_p50_seconds": self.itl_p50_seconds,
        }


ALL_CLASSES = "all"


def figures(
    ttft: Sequence[tuple[str, float]], queue: Sequence[tuple[str, float]], itl: Sequence[tuple[str, float]]
) -> dict[str, ClassFigures]:
    """Per class figures (and ``all``) from (class, seconds) pairs."""
    classes = sorted({c for c, _ in ttft}) + [ALL_CLASSES]
    out: dict[str, ClassFigures] = {}
    for cls in classes:
        if cls != ALL_CLASSES and len(classes) == 2:
            continue  # one class: "all" says it

        def pick(pairs: Sequence[tuple[str, float]], cls: str = cls) -> list[float]:
            return [v for c, v in pairs if cls == ALL_CLASSES or c == cls]

        t, q, i = pick(ttft), pick(queue), pick(itl)
        ttft_q = quantiles(t, (0.5, 0.99)) if t else {}
        out[cls] = ClassFigures(
            len(t),
            ttft_q.get(0.5),
            ttft_q.get(0.99),
            math.fsum(q) / len(q) if q else None,
            quantile(i, 0.5) if i else None,
        )
    return out


def simulated_figures(result: SimulationResult) -> dict[str, ClassFigures]:
    """:func:`figures` of a simulation."""
    reqs = result.requests
    return figures(
        [(r.endpoint_class, r.ttft_seconds) for r in reqs],
        [(r.endpoint_class, r.queue_seconds) for r in reqs],
        [(r.endpoint_class, r.itl_seconds) for r in reqs if r.itl_seconds is not None],
    )


def observed_figures(calibration: Calibration) -> dict[str, ClassFigures]:
    """:func:`figures` of the window as observed."""
    reqs = calibration.requests
    return figures(
        [(r.endpoint_class, r.observed_ttft_seconds) for r in reqs],
        [(r.endpoint_class, r.observed_queue_seconds) for r in reqs],
        [(r.endpoint_class, r.observed_itl_seconds) for r in reqs if r.observed_itl_seconds is not None],
    )


def relative_error(predicted: float | None, observed: float | None, floor: float = 0.0) -> float | None:
    """``(predicted − observed) / max(observed, floor)``; ``None`` when either is missing.
    With a ``floor`` both are compared above it, so two near-zero figures agree."""
    if predicted is None or observed is None:
        return None
    if floor and predicted < floor and observed < floor:
        return 0.0
    return (predicted - observed) / max(observed, floor, 1e-12)


AGREEMENT_FLOORS = {
    "ttft_p50_seconds": QUEUE_FLOOR_SECONDS,
    "ttft_p99_seconds": QUEUE_FLOOR_SECONDS,
    "queue_mean_seconds": 10 * QUEUE_FLOOR_SECONDS,
}
"""Figure → seconds under which a replayed and an observed value both count as agreeing."""


def calibration_errors(
    replayed: Mapping[str, ClassFigures], observed: Mapping[str, ClassFigures]
) -> dict[str, dict[str, float]]:
    """Relative error of each replayed figure against the observed, per class."""
    out: dict[str, dict[str, float]] = {}
    for cls, obs in observed.items():
        rep = replayed.get(cls)
        if rep is None:
            continue
        errors = {
            name.removesuffix("_seconds"): relative_error(getattr(rep, name), getattr(obs, name), floor)
            for name, floor in AGREEMENT_FLOORS.items()
        }
        errors["itl_p50"] = relative_error(rep.itl_p50_seconds, obs.itl_p50_seconds)
        out[cls] = {k: v for k, v in errors.items() if v is not None}
    return out


# --------------------------------------------------------------------------- the answer


@dataclass
class WhatIf:
    """The answer: the change, the calibration (its source and notes), observed / replayed /
    predicted figures per class, the replay's errors, KV usage, warnings."""

    change: Change
    calibration: Calibration
    observed: dict[str, ClassFigures]
    replayed: dict[str, ClassFigures]
    predicted: dict[str, ClassFigures]
    errors: dict[str, dict[str, float]]
    max_error: float
    kv: dict[str, float | None]
    settings: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    simulated_steps: int = 0
    sensitivity: dict[str, tuple[ClassFigures, ClassFigures]] = field(default_factory=dict)
    """Per class, the change's figures with engine steps :data:`STEP_TIME_SENSITIVITY`
    faster and slower (empty for an empty change), over the first
    :attr:`sensitivity_requests` requests of the window (all of them up to
    :data:`LEVEL_SAMPLE_REQUESTS`)."""
    sensitivity_requests: int = 0


def rate_scaled_count(requests: Sequence[TraceRequest], factor: float, window_seconds: float) -> int:
    """How many requests :func:`rate_scaled` returns, without building them: per copy, a
    binary search of the sorted arrivals (``ceil(factor)`` copies, at most 1000 for a
    :class:`Change`'s factor)."""
    if factor == 1.0:
        return len(requests)
    arrivals = sorted(r.engine_arrival_seconds for r in requests)
    length = window_seconds / factor
    total = 0
    for copy in range(math.ceil(factor)):
        shift = copy * length

        def outside(arrival: float, shift: float = shift) -> bool:
            return arrival / factor + shift >= window_seconds  # rate_scaled's test, as it computes it

        total += bisect_left(arrivals, True, key=outside)
    return total


def rate_scaled(requests: Sequence[TraceRequest], factor: float, window_seconds: float) -> list[TraceRequest]:
    """Arrivals ``factor`` times as dense over the same window: the pattern compressed by the
    factor, then repeated (each copy shifted by the compressed length) until the window is full
    (:func:`rate_scaled_count` requests)."""
    if factor == 1.0:
        return list(requests)
    length = window_seconds / factor
    copies = math.ceil(factor)
    out = []
    for copy in range(copies):
        for r in requests:
            at = r.engine_arrival_seconds / factor + copy * length
            if at < window_seconds:
                out.append(
                    replace(r, arrival_seconds=r.arrival_seconds / factor + copy * length, engine_arrival_seconds=at)
                )
    return out


LEVEL_ROUNDS = 2
LEVEL_TOLERANCE = 0.02
LEVEL_SAMPLE_REQUESTS = 20_000
"""A longer window sets the level on its first requests (a replay of the window's beginning,
from the same empty engines), then replays the whole window once."""


def check_replay_size(cal: Calibration, change: Change) -> int:
    """The most requests one replay of ``change`` simulates (the observed window's, or the
    change's with its rate factor: :func:`rate_scaled_count`). Raises
    :class:`WhatIfInputError` when that is more than :data:`MAX_SIMULATED_REQUESTS`, saying
    how many and what to do; it names ``rate`` when the window alone is within the limit, else
    ``start`` (the window)."""
    window = len(cal.requests)
    scaled = (
        window
        if change.rate_factor is None
        else rate_scaled_count(cal.requests, change.rate_factor, cal.window_seconds)
    )
    most = max(window, scaled)
    if most <= MAX_SIMULATED_REQUESTS:
        return most
    by_rate = window <= MAX_SIMULATED_REQUESTS
    what = (
        f"{window:,} requests of the window at rate x{change.rate_factor:g}"
        if by_rate
        else f"{window:,} requests in the window"
    )
    raise WhatIfInputError(
        "rate" if by_rate else "start",
        f"the replay would simulate {most:,} requests ({what}), more than the {MAX_SIMULATED_REQUESTS:,} a "
        f"what-if replays (about a minute); narrow the window ({{start}}, {{end}}) or lower {{rate}}",
    )


def fit_decode_level(
    cal: Calibration, settings: EngineSettings, observed: Mapping[str, ClassFigures]
) -> SimulationResult:
    """Fit the step law's level by replay, and return the replay.

    The robust fit gives how a step grows with the batch and the prompt tokens; its per-step
    and per-sequence parts are then scaled until the replay's token-weighted ITL is within
    :data:`LEVEL_TOLERANCE` of the observed one (at most :data:`LEVEL_ROUNDS` rounds), by the
    factor that puts the whole gap on them: the prompt tokens' share of the replay's step time
    stays as it was. Why:
    the fit sees each request's own prompt, not the recompute of preempted ones nor the
    chunks of long prompts it shares steps with, while the replay runs them all; matching
    the mean step of the replay keeps the engine's throughput what it was.
    ``cal.step_time`` is updated. A window of more than :data:`LEVEL_SAMPLE_REQUESTS`
    requests sets the level on its first ones.
    """
    requests = cal.requests
    if len(requests) > LEVEL_SAMPLE_REQUESTS:
        cut = sorted(r.engine_arrival_seconds for r in requests)[LEVEL_SAMPLE_REQUESTS]
        requests = [r for r in requests if r.engine_arrival_seconds < cut]
    assignment = [r.replica_index for r in requests]
    replay = simulate(requests, settings, cal, replicas=cal.replicas, assignment=assignment)
    # Throughput follows the mean step, not the median: the token-weighted mean ITL is matched.
    decoding = [r for r in requests if r.observed_itl_seconds is not None]
    target = (
        math.fsum(r.observed_itl_seconds * (r.output_tokens - 1) for r in decoding)  # type: ignore[operator]
        / max(1, sum(r.output_tokens - 1 for r in decoding))
    )
    for _ in range(LEVEL_ROUNDS):
        got = replay.token_weighted_itl_seconds
        if not target or not got or abs(got / target - 1) < LEVEL_TOLERANCE:
            break
        token_share = (
            min(0.9, cal.step_time.per_prefill_token_seconds * replay.prefill_tokens / replay.busy_seconds)
            if replay.busy_seconds > 0
            else 0.0
        )
        factor = 1 + (target - got) / (got * (1 - token_share))
        cal.step_time = cal.step_time.scaled_decode(min(4.0, max(0.25, factor)))
        replay = simulate(requests, settings, cal, replicas=cal.replicas, assignment=assignment)
    if requests is not cal.requests:
        replay = simulate(
            cal.requests, settings, cal, replicas=cal.replicas, assignment=[r.replica_index for r in cal.requests]
        )
    return replay


def what_if(calibration: Calibration, change: Change, *, max_error: float = MAX_CALIBRATION_ERROR) -> WhatIf:
    """Replay the observed configuration, check it against the observed figures, then replay
    the change (module docstring). Raises :class:`WhatIfRefused` naming the figure and class
    when the replay is off by more than ``max_error``, or naming the missing signal when the
    change needs one the window lacks (e.g. ``kv_blocks`` without a KV-usage gauge).
    Raises :class:`WhatIfInputError` before simulating anything when a replay would simulate
    more than :data:`MAX_SIMULATED_REQUESTS` requests (naming ``rate`` when the window alone
    would not, else ``start``)."""
    cal = calibration
    check_replay_size(cal, change)
    if (change.kv_blocks is not None or change.kv_blocks_factor is not None) and cal.num_kv_blocks is None:
        raise WhatIfRefused(
            "cannot predict a KV change: the window has no KV-cache signal "
            "(kv_cache_config_info or kv_cache_usage_ratio) to calibrate the pool from"
        )
    observed_settings = cal.engine_settings()
    observed = observed_figures(cal)
    replay = fit_decode_level(cal, observed_settings, observed)
    replayed = simulated_figures(replay)
    errors = calibration_errors(replayed, observed)
    worst = max((abs(v) for e in errors.values() for v in e.values()), default=0.0)
    if worst > max_error:
        name, cls = max(((k, c) for c, e in errors.items() for k in e), key=lambda kc: abs(errors[kc[1]][kc[0]]))
        raise WhatIfRefused(
            f"calibration off by {errors[cls][name] * 100:+.0f}% on {name} ({_literal(cls)}): the replay of the observed "
            f"configuration gives {_figure(replayed[cls], name)}, observed {_figure(observed[cls], name)}; "
            f"a prediction from it cannot be trusted (limit ±{max_error * 100:.0f}%). Try a window of "
            f"steady traffic"
            + (
                ""
                if cal.sources.get("max_num_batched_tokens") == "given"
                else f", give the engine's token budget per step if it is not vLLM's default "
                f"{cal.max_num_batched_tokens} ({{max_num_batched_tokens}})"
            )
            + ", or accept a larger error ({max_calibration_error}) and read the prediction with it"
        )

    settings = replace(observed_settings)
    warnings: list[str] = []
    if change.max_num_seqs is not None:
        settings.max_num_seqs = change.max_num_seqs
    if change.kv_blocks is not None:
        settings.num_kv_blocks = change.kv_blocks
    elif change.kv_blocks_factor is not None:
        settings.num_kv_blocks = max(1, round(settings.num_kv_blocks * change.kv_blocks_factor))
    if change.batch_window_seconds is not None:
        settings.batch_window_seconds = change.batch_window_seconds
    if change.max_num_batched_tokens is not None:
        settings.max_num_batched_tokens = change.max_num_batched_tokens
        if cal.sources.get("max_num_batched_tokens") != "given":
            warnings.append(
                f"the observed engine's step-token budget is assumed ({cal.max_num_batched_tokens}, vLLM's default; "
                "engines do not export it): give the engine's own (--max-num-batched-tokens, max_num_batched_tokens "
                "in the read API), or this compares "
                f"{change.max_num_batched_tokens} with a budget the engine may not have had"
            )
    replicas = change.replicas or cal.replicas
    requests = cal.requests
    if change.rate_factor is not None:
        requests = rate_scaled(cal.requests, change.rate_factor, cal.window_seconds)
    if change.split_classes is not None:
        replicas = sum(n for _, n in change.split_classes)

    def run_change(calibration: Calibration, notes: list[str], which: Sequence[TraceRequest]) -> SimulationResult:
        if change.split_classes is not None:
            return _split_run(which, settings, calibration, dict(change.split_classes), notes)
        assignment = None if (change.replicas or change.rate_factor) else [r.replica_index for r in which]
        return simulate(which, settings, calibration, replicas=replicas, assignment=assignment)

    sensitivity: dict[str, tuple[ClassFigures, ClassFigures]] = {}
    band_requests = 0
    if change.is_empty:
        predicted_run = replay
    else:
        predicted_run = run_change(cal, warnings, requests)
        warnings += _extrapolation_warnings(cal, predicted_run, settings, replicas, change)
        # The band of a long window is read on its first requests, as the level is.
        sample, point = requests, simulated_figures(predicted_run)
        if len(requests) > LEVEL_SAMPLE_REQUESTS:
            cut = sorted(r.engine_arrival_seconds for r in requests)[LEVEL_SAMPLE_REQUESTS]
            sample = [r for r in requests if r.engine_arrival_seconds < cut]
            point = simulated_figures(run_change(cal, [], sample))
        faster, slower = (
            simulated_figures(run_change(replace(cal, step_time=cal.step_time.scaled(factor)), [], sample))
            for factor in (1 - STEP_TIME_SENSITIVITY, 1 + STEP_TIME_SENSITIVITY)
        )
        sensitivity = {cls: (faster[cls], slower[cls]) for cls in faster if cls in slower}
        band_requests = len(sample)
        warnings += _sensitivity_warnings(point, sensitivity, None if sample is requests else len(sample))
    more_capacity = (
        replicas > cal.replicas
        or settings.max_num_seqs > observed_settings.max_num_seqs
        or settings.num_kv_blocks > observed_settings.num_kv_blocks
    )
    longest_wait = max((q.observed_queue_seconds for q in cal.requests), default=None)
    if more_capacity and change.rate_factor is None and longest_wait is not None and longest_wait < QUEUE_FLOOR_SECONDS:
        # Nothing waited in the engine: more of it shortens no wait (the diagnosis' "adding GPUs
        # will not help"); the time before the engine is replayed as it was observed.
        warnings.append(
            f"no request waited in the engine (the longest queue time {longest_wait * 1000:.0f} ms): more engine "
            "capacity shortens no wait; the time before the engine (a queue in front of it, the network, the "
            "caller) is replayed as observed, and `inferpath diagnose` names where it goes"
        )
    if predicted_run.unfinished:
        warnings.append(
            f"{predicted_run.unfinished} requests had not finished when the simulation stopped "
            f"(the queue grows without bound): their TTFT is missing from the figures"
        )
    if predicted_run.rejected:
        warnings.append(f"{predicted_run.rejected} requests never fit one engine's KV pool and were rejected")
    observed_kv = cal.observed_kv_mean_ratio
    if cal.num_kv_blocks and observed_kv is not None and observed_kv >= KV_CHECK_MIN_RATIO:
        # The refusal reads TTFT and queue time only: a replay can match them with the queue
        # made for another reason than the KV pool, and then say nothing true of KV changes.
        off = replay.kv_usage_mean_ratio / observed_kv - 1
        if abs(off) > max_error:
            warnings.append(
                f"KV replay off: the replay's mean KV usage is {replay.kv_usage_mean_ratio:.2f} against "
                f"{observed_kv:.2f} observed ({off:+.0%}); the KV pool or the tokens each request holds are not "
                "the engine's, so what this says of KV usage and of KV changes cannot be trusted"
            )
    return WhatIf(
        change=change,
        calibration=cal,
        observed=observed,
        replayed=replayed,
        predicted=simulated_figures(predicted_run),
        errors=errors,
        max_error=worst,
        kv={
            "observed_mean_ratio": cal.observed_kv_mean_ratio,
            "observed_max_ratio": cal.observed_kv_max_ratio,
            "replayed_mean_ratio": replay.kv_usage_mean_ratio if cal.num_kv_blocks else None,
            "replayed_max_ratio": replay.kv_usage_max_ratio if cal.num_kv_blocks else None,
            "predicted_mean_ratio": predicted_run.kv_usage_mean_ratio if cal.num_kv_blocks else None,
            "predicted_max_ratio": predicted_run.kv_usage_max_ratio if cal.num_kv_blocks else None,
            "observed_preemptions": cal.observed_preemptions,
            "replayed_preemptions": replay.preemptions_total,
            "predicted_preemptions": predicted_run.preemptions_total,
        },
        settings={
            "replicas": replicas,
            "max_num_seqs": settings.max_num_seqs,
            "replicas_by_class": dict(change.split_classes) if change.split_classes else None,
            "num_kv_blocks": settings.num_kv_blocks if cal.num_kv_blocks else None,
            "block_size_tokens": settings.block_size_tokens if cal.num_kv_blocks else None,
            "batch_window_seconds": settings.batch_window_seconds,
            "max_num_batched_tokens": settings.max_num_batched_tokens,
            "rate_factor": change.rate_factor or 1.0,
        },
        warnings=warnings,
        notes=list(cal.notes),
        simulated_steps=replay.steps + (0 if predicted_run is replay else predicted_run.steps),
        sensitivity=sensitivity,
        sensitivity_requests=band_requests,
    )


def _sensitivity_warnings(
    predicted: Mapping[str, ClassFigures],
    sensitivity: Mapping[str, tuple[ClassFigures, ClassFigures]],
    sample: int | None = None,
) -> list[str]:
    """One warning per class whose predicted TTFT p50 or p99 moves by more than
    :data:`SENSITIVE_ERROR` within the sensitivity band, naming the range (read on the
    window's first ``sample`` requests when given)."""
    out = []
    for cls, (faster, slower) in sensitivity.items():
        point = predicted.get(cls)
        if point is None:
            continue
        moved = []
        for name, attr in (("p50", "ttft_p50_seconds"), ("p99", "ttft_p99_seconds")):
            at, low, high = getattr(point, attr), getattr(faster, attr), getattr(slower, attr)
            errors = [relative_error(v, at, QUEUE_FLOOR_SECONDS) for v in (low, high)]
            if any(e is not None and abs(e) > SENSITIVE_ERROR for e in errors):
                moved.append(f"TTFT {name} {low:.2f}-{high:.2f} s")
        if moved:
            where = "" if cls == ALL_CLASSES else f" ({cls})"
            on = "" if sample is None else f" on the window's first {sample} requests"
            out.append(
                f"sensitive{where}: with engine steps {STEP_TIME_SENSITIVITY:.0%} faster or slower{on} the "
                f"prediction gives {', '.join(moved)}; near saturation the queue turns on a few percent of "
                f"engine speed, so read these as ranges"
            )
    return out


def _split_run(
    requests: Sequence[TraceRequest],
    settings: EngineSettings,
    cal: Calibration,
    replicas_by_class: Mapping[str, int],
    warnings: list[str],
) -> SimulationResult:
    """Each class on its own engines (round robin among them), the runs put together."""
    classes = {r.endpoint_class for r in requests}
    unclassified = sum(1 for r in requests if not r.endpoint_class)
    if unclassified:
        raise WhatIfRefused(
            f"cannot split by endpoint class: {unclassified} requests of the window carry no endpoint "
            f"class (inferpath.endpoint_class)"
        )
    missing = sorted(classes - set(replicas_by_class))
    if missing:
        raise WhatIfRefused(
            f"cannot split by endpoint class: the window also has {_literal(', '.join(missing))} requests; "
            f"give every class its replicas ({{split_endpoint_classes}})"
        )
    runs = []
    for cls, count in replicas_by_class.items():
        mine = [r for r in requests if r.endpoint_class == cls]
        if not mine:
            warnings.append(f"no {cls} request in the window: its {count} replicas stay idle")
            continue
        runs.append(simulate(mine, settings, cal, replicas=count))
    out = [r for run in runs for r in run.requests]
    decoding = [r for r in out if r.itl_seconds is not None]
    tokens = sum(r.tokens - 1 for r in decoding)
    return SimulationResult(
        requests=out,
        kv_usage_mean_ratio=max((run.kv_usage_mean_ratio for run in runs), default=0.0),
        kv_usage_max_ratio=max((run.kv_usage_max_ratio for run in runs), default=0.0),
        preemptions_total=sum(run.preemptions_total for run in runs),
        rejected=sum(run.rejected for run in runs),
        unfinished=sum(run.unfinished for run in runs),
        steps=sum(run.steps for run in runs),
        max_batch=max((run.max_batch for run in runs), default=0),
        token_weighted_itl_seconds=(math.fsum(r.itl_seconds * (r.tokens - 1) for r in decoding) / tokens)  # type: ignore[operator]
        if tokens
        else None,
    )


def parse_class_split(text: str) -> tuple[tuple[str, int], ...]:
    """``"interactive=2,bulk=1"`` → ``(("interactive", 2), ("bulk", 1))``: replicas per
    endpoint class, each class once, at most :data:`MAX_REPLICAS` (1024) in all. Raises
    :class:`WhatIfInputError` naming ``split_endpoint_classes`` for anything else."""
    out = []
    for part in text.split(","):
        name, sep, count = part.strip().partition("=")
        name, count = name.strip(), count.strip()
        if not sep or not name or not _COUNT.fullmatch(count) or int(count) < 1:
            raise WhatIfInputError(
                "split_endpoint_classes",
                f"expected CLASS=REPLICAS,... like interactive=2,bulk=1 (each count at least 1), "
                f"got {_literal(repr(text))}",
            )
        out.append((name, int(count)))
    names = [name for name, _ in out]
    if len(set(names)) != len(names):
        raise WhatIfInputError("split_endpoint_classes", f"each class once, got {_literal(repr(text))}")
    total = sum(n for _, n in out)
    if total > MAX_REPLICAS:
        raise WhatIfInputError(
            "split_endpoint_classes", f"at most {MAX_REPLICAS} replicas in all, got {total} in {_literal(repr(text))}"
        )
    return tuple(out)


def predict(
    store: Any,
    start: Any,
    end: Any,
    change: Change,
    *,
    max_error: float = MAX_CALIBRATION_ERROR,
    max_num_batched_tokens: int | None = None,
) -> WhatIf:
    """Calibrate from the stored window ``[start, end)`` (aware datetimes) and answer
    :func:`what_if`. ``max_num_batched_tokens``: the engine's prompt-token budget per step
    as configured (vLLM's ``--max-num-batched-tokens``, which it does not export; default
    the calibration's, vLLM's 2048). Raises :class:`WhatIfRefused` (a missing signal, or calibration off), and
    :class:`WhatIfInputError` before any row is read: naming ``start`` when the window holds
    more than :data:`MAX_SIMULATED_REQUESTS` requests (counted without ``FINAL``: an upper
    bound), ``split_endpoint_classes`` when it leaves out a class the window's requests have."""
    from inferpath.analysis.breakdown import request_filter
    from inferpath.analysis.whatif_calibration import fetch_calibration

    where, parameters = request_filter(start=start, end=end)
    stored = store.query(f"SELECT count() FROM inferpath_requests WHERE {where}", parameters)[0][0]
    if stored > MAX_SIMULATED_REQUESTS:  # before reading them: rows of a day at 1,000 req/s fill the memory
        raise WhatIfInputError(
            "start",
            f"the window holds {stored:,} requests, more than the {MAX_SIMULATED_REQUESTS:,} a what-if replays "
            "(about a minute); narrow the window ({start}, {end})",
        )
    if change.split_classes is not None:  # a class left out is the input's fault: said before calibrating
        rows = store.query(f"SELECT DISTINCT endpoint_class FROM inferpath_requests WHERE {where}", parameters)
        classes = sorted(str(row[0]) for row in rows if row[0])
        missing = [name for name in classes if name not in dict(change.split_classes)]
        if missing:
            given = ",".join(f"{name}={count}" for name, count in change.split_classes)
            raise WhatIfInputError(
                "split_endpoint_classes",
                f"the window's requests are of the classes {_literal(', '.join(classes))}: give each its replicas "
                f"(like {_literal(','.join(f'{name}=1' for name in classes))}), got {_literal(repr(given))}",
            )
    try:
        calibration = fetch_calibration(store, start, end)
    except InsufficientSignalsError as exc:
        raise WhatIfRefused(_literal(str(exc))) from None
    if max_num_batched_tokens is not None:
        calibration = replace(
            calibration,
            max_num_batched_tokens=max_num_batched_tokens,
            sources={**calibration.sources, "max_num_batched_tokens": "given"},
        )
    return what_if(calibration, change, max_error=max_error)


_COUNT = re.compile(r"[0-9]+")
_FACTOR = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]+)?")


def parse_factor_or_count(text: str, name: str, *, counts: bool = True) -> tuple[int | None, float | None]:
    """The documented forms of a KV pool or a rate: a count ``N`` (``"96"`` → (96, None)), or
    a factor ``xK`` / ``×K`` (``"x2"`` or ``"×1.5"`` → (None, 2.0) or (None, 1.5)); with
    ``counts`` false a bare number is a factor too (``"2"`` → (None, 2.0)). A count is an
    integer ≥ 1, a factor a decimal number above 0 and at most :data:`MAX_FACTOR` (1000).
    Anything else (``"3x"``, ``"x"``, ``"1_000"``, ``"inf"``) raises :class:`WhatIfInputError`
    naming ``name`` (a read-API parameter) and the forms it takes."""
    value = text.strip().lower()
    factor_text = value[1:].strip() if value[:1] in ("x", "×") else (None if counts else value)
    takes = "a count of at least 1 like 96 or a factor above 0 like x2" if counts else "a factor above 0 like x2"
    if factor_text is not None and _FACTOR.fullmatch(factor_text):
        factor = float(factor_text)
        if factor <= 0:
            raise WhatIfInputError(name, f"expected {takes}, got {_literal(repr(text))}")
        if factor > MAX_FACTOR:
            raise WhatIfInputError(name, f"at most x{MAX_FACTOR:g}, got {_literal(repr(text))}")
        return None, factor
    if factor_text is None and _COUNT.fullmatch(value) and int(value) >= 1:
        return int(value), None
    raise WhatIfInputError(name, f"expected {takes}, got {_literal(repr(text))}")


def _bounded(name: str, value: float | None, low: float, high: float, *, unit: str = "") -> None:
    """Raise :class:`WhatIfInputError` naming ``name`` unless ``value`` is ``None`` or a finite
    number in ``[low, high]``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WhatIfInputError(name, f"expected a number, got {_literal(repr(value))}")
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    if value < low:
        raise WhatIfInputError(name, f"at least {low:g}{unit}, got {shown}")
    if value > high:
        raise WhatIfInputError(name, f"at most {high:g}{unit}, got {shown}")


def parse_change(
    *,
    replicas: int | None = None,
    max_num_seqs: int | None = None,
    kv_blocks: str | None = None,
    batch_window_ms: float | None = None,
    rate: str | None = None,
    split_endpoint_classes: str | None = None,
    step_token_budget: int | None = None,
) -> Change:
    """The :class:`Change` of a what-if's inputs as the read API and the CLI take them
    (``None``: unchanged). Bounds: ``replicas`` 1-:data:`MAX_REPLICAS` (1024);
    ``max_num_seqs`` 1-:data:`MAX_NUM_SEQS` (65,536); ``kv_blocks`` a count ``N`` ≥ 1 or a
    factor ``xK`` / ``×K`` in (0, 1000]; ``batch_window_ms`` 0-:data:`MAX_BATCH_WINDOW_MS`
    (60,000 ms); ``rate`` a factor ``xK``, ``×K`` or ``K`` in (0, 1000]
    (:data:`MAX_FACTOR`); ``split_endpoint_classes`` ``CLASS=REPLICAS,...`` with at most
    1024 replicas in all, and not with ``replicas``; ``step_token_budget`` (the engine's
    per-step token budget to predict) 1-:data:`MAX_STEP_TOKEN_BUDGET`. Raises
    :class:`WhatIfInputError` naming the first input at fault by its read-API parameter
    (:data:`API_NAMES`)."""
    _bounded("replicas", replicas, 1, MAX_REPLICAS)
    _bounded("max_num_seqs", max_num_seqs, 1, MAX_NUM_SEQS)
    _bounded("step_token_budget", step_token_budget, 1, MAX_STEP_TOKEN_BUDGET)
    for name, value in (
        ("replicas", replicas),
        ("max_num_seqs", max_num_seqs),
        ("step_token_budget", step_token_budget),
    ):
        if value is not None and value != int(value):
            raise WhatIfInputError(name, f"expected an integer, got {value!r}")
    _bounded("batch_window_ms", batch_window_ms, 0, MAX_BATCH_WINDOW_MS, unit=" ms")
    blocks, blocks_factor = parse_factor_or_count(kv_blocks, "kv_blocks") if kv_blocks is not None else (None, None)
    rate_factor = parse_factor_or_count(rate, "rate", counts=False)[1] if rate is not None else None
    split = None
    if split_endpoint_classes is not None:
        split = parse_class_split(split_endpoint_classes)
        if replicas is not None:
            raise WhatIfInputError("split_endpoint_classes", "give replicas per class, not {replicas} as well")
    return Change(
        replicas=None if replicas is None else int(replicas),
        max_num_seqs=None if max_num_seqs is None else int(max_num_seqs),
        kv_blocks=blocks,
        kv_blocks_factor=blocks_factor,
        batch_window_seconds=None if batch_window_ms is None else batch_window_ms / 1000.0,
        rate_factor=rate_factor,
        split_classes=split,
        max_num_batched_tokens=None if step_token_budget is None else int(step_token_budget),
    )


def _figure(figs: ClassFigures, name: str) -> str:
    value = {
        "ttft_p50": figs.ttft_p50_seconds,
        "ttft_p99": figs.ttft_p99_seconds,
        "queue_mean": figs.queue_mean_seconds,
        "itl_p50": figs.itl_p50_seconds,
    }[name]
    return "-" if value is None else f"{value:.3f} s"


def _extrapolation_warnings(
    cal: Calibration, run: SimulationResult, settings: EngineSettings, replicas: int, change: Change
) -> list[str]:
    out = []
    per_engine_rate = (change.rate_factor or 1.0) / replicas * cal.replicas
    if per_engine_rate > EXTRAPOLATION_FACTOR:
        out.append(
            f"extrapolates: {per_engine_rate:.1f}x the observed arrival rate per engine; the step "
            f"times were fitted on the observed load only"
        )
    top = cal.step_time.max_batch_observed
    if run.max_batch > EXTRAPOLATION_FACTOR * top:
        out.append(
            f"extrapolates: the change runs up to {run.max_batch} sequences per step, the step time was "
            f"measured on batches of at most {top:.0f} (taken as linear in the batch beyond): how a step "
            f"grows with the batch decides this prediction"
        )
    if cal.num_kv_blocks and settings.num_kv_blocks > 4 * cal.num_kv_blocks:
        out.append(f"extrapolates: {settings.num_kv_blocks} KV blocks, more than 4x the calibrated {cal.num_kv_blocks}")
    return out


def what_if_to_dict(answer: WhatIf) -> dict[str, Any]:
    """The answer as JSON-ready data (the read API's body)."""
    cal = answer.calibration
    return {
        "change": {
            k: (dict(v) if k == "split_classes" and v is not None else v)
            for k in answer.change.__dataclass_fields__
            for v in (getattr(answer.change, k),)
        },
        "change_text": answer.change.describe(),
        "settings": answer.settings,
        "calibration": cal.as_dict(),
        "observed": {c: f.as_dict() for c, f in answer.observed.items()},
        "replayed": {c: f.as_dict() for c, f in answer.replayed.items()},
        "predicted": {c: f.as_dict() for c, f in answer.predicted.items()},
        "calibration_errors": answer.errors,
        "max_calibration_error": answer.max_error,
        "kv": answer.kv,
        "warnings": answer.warnings,
        "notes": answer.notes,
        "simulated_steps": answer.simulated_steps,
        "sensitivity": {
            "step_time_factor": STEP_TIME_SENSITIVITY,
            "requests": answer.sensitivity_requests,
            "faster": {c: f.as_dict() for c, (f, _) in answer.sensitivity.items()},
            "slower": {c: s.as_dict() for c, (_, s) in answer.sensitivity.items()},
        },
    }


__all__ = [
    "ALL_CLASSES",
    "Change",
    "ClassFigures",
    "EngineSettings",
    "InsufficientSignalsError",
    "API_NAMES",
    "MAX_BATCH_WINDOW_MS",
    "MAX_CALIBRATION_ERROR",
    "NO_PREDICTION",
    "MAX_FACTOR",
    "MAX_NUM_SEQS",
    "MAX_REPLICAS",
    "MAX_SIMULATED_REQUESTS",
    "SENSITIVE_ERROR",
    "STEP_TIME_SENSITIVITY",
    "SimulationResult",
    "WhatIf",
    "WhatIfInputError",
    "WhatIfRefused",
    "check_replay_size",
    "calibration_errors",
    "parse_change",
    "parse_class_split",
    "parse_factor_or_count",
    "predict",
    "rate_scaled",
    "rate_scaled_count",
    "simulate",
    "what_if",
    "what_if_to_dict",
]
