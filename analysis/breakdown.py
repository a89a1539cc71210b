"""Where each request's time went: stage shares of TTFT and E2E, per endpoint and per band.

Input rows are dicts shaped like ``inferpath_requests`` (docs/telemetry-contract.md): every
``*_ns`` value a duration in nanoseconds or ``None`` when the trace did not measure it.

Which stages count toward which measure:

- E2E (request start → last token): every stage in
  :data:`~inferpath.vocabulary.BREAKDOWN_STAGES`.
- TTFT (request start → first content token): every stage except ``decode``, which by
  definition happens after the first token. ``gateway`` and ``network`` read their
  TTFT-phase columns (``gateway_ttft_ns``, ``network_ttft_ns``: the parts before the first
  token, docs/telemetry-contract.md), because the whole-call ``gateway_ns`` / ``network_ns``
  of a streamed response include the relaying of every later token. Rows stored before
  those columns existed hold NULL there and fall back to the whole-call value, an upper
  bound (:data:`~inferpath.vocabulary.TTFT_PHASE_COLUMNS`, :func:`stage_columns`).

``rest`` is the measure minus the sum of its stages: time no span explained (client-side
work, unmeasured hops, scheduling gaps). It is negative when stages overlap (e.g. retrieval
running while the request is already queued); it is reported as it is, never clipped,
because a large negative rest says the stage spans are wrong.

Aggregates use time-weighted shares (sum of a stage's time / sum of the measure), not the
mean of per-request ratios, so the shares of a group add up to 1 and a few tiny requests
cannot dominate them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from inferpath.analysis.percentiles import quantiles
from inferpath.vocabulary import (
    BREAKDOWN_MEASURES,
    BREAKDOWN_STAGES,
    ENGINE_SEND_COLUMN,
    TTFT_PHASE_COLUMNS,
    TTFT_STAGES,
    client_first_ns,
)

REST = "rest"

BANDS: tuple[tuple[str, float, float], ...] = (
    ("p0-50", 0.0, 0.5),
    ("p50-90", 0.5, 0.9),
    ("p90-99", 0.9, 0.99),
    ("p99+", 0.99, 1.0),
)
"""Percentile bands of the measure: (name, lower quantile, upper quantile)."""


def measure_stages(measure: str) -> tuple[str, ...]:
    """The stages that make up ``measure`` (``"ttft"`` or ``"e2e"``); ``ValueError`` otherwise."""
    if measure == "e2e":
        return BREAKDOWN_STAGES
    if measure == "ttft":
        return TTFT_STAGES
    raise ValueError(f"measure must be one of {BREAKDOWN_MEASURES}, got {measure!r}")


def stage_columns(measure: str, stage: str) -> tuple[str, ...]:
    """The columns of ``stage``'s time in ``measure``, first non-NULL wins (``coalesce``):
    ``("gateway_ttft_ns", "gateway_ns")`` for ``gateway`` in TTFT, ``("<stage>_ns",)``
    otherwise. The one definition that :func:`request_breakdown` and the in-database
    aggregates (:mod:`inferpath.analysis.band_query`) both read. ``ValueError`` for an unknown
    measure or a stage not in ``measure``."""
    if stage not in measure_stages(measure):
        raise ValueError(f"stage {stage!r} is not a stage of {measure!r}: {measure_stages(measure)}")
    whole = f"{stage}_ns"
    if measure == "ttft" and stage in TTFT_PHASE_COLUMNS:
        return (TTFT_PHASE_COLUMNS[stage], whole)
    return (whole,)


def stage_sql(measure: str, stage: str) -> str:
    """SQL of ``stage``'s time in ``measure`` (ns, unmeasured = 0), e.g.
    ``coalesce(gateway_ttft_ns, gateway_ns, 0)``; column names from :func:`stage_columns`."""
    return f"coalesce({', '.join(stage_columns(measure, stage))}, 0)"


def _stage_value(row: Mapping[str, Any], measure: str, stage: str) -> int:
    for column in stage_columns(measure, stage):
        value = row.get(column)
        if value is not None:
            return _duration(value, column)
    return 0


@dataclass(frozen=True)
class RequestBreakdown:
    """One request's ``measure`` split into stages.

    ``total_ns``: the measure (TTFT or E2E). ``stage_ns``: stage -> nanoseconds (0 for a
    stage the trace did not measure), plus ``"rest"`` = total − sum of stages.
    """

    trace_id: str
    endpoint: str
    endpoint_class: str
    measure: str
    total_ns: int
    stage_ns: dict[str, int]

    def shares(self) -> dict[str, float]:
        """stage -> share of ``total_ns`` (ratio; sums to 1 with ``rest``); empty for total 0."""
        if self.total_ns <= 0:
            return {}
        return {stage: ns / self.total_ns for stage, ns in self.stage_ns.items()}


def request_breakdown(row: Mapping[str, Any], measure: str = "e2e") -> RequestBreakdown | None:
    """Split one request row into stages of ``measure``; ``None`` if the row lacks the measure.

    The measure is the client's (``client_ttft_ns``) when the row has it, else the server's
    (:func:`~inferpath.vocabulary.client_first_ns`): what the end user waited for, of which
    the hop from the client to the first server is the ``network`` stage.

    A stage's value is the first non-NULL of :func:`stage_columns` (a missing key counts as
    NULL), else 0. Raises ``ValueError`` for an unknown measure or a negative duration (naming the column).
    """
    stages = measure_stages(measure)
    total = client_first_ns(row, measure)
    if total is None:
        return None
    total = _duration(total, f"{measure}_ns")
    stage_ns = {stage: _stage_value(row, measure, stage) for stage in stages}
    stage_ns[REST] = total - sum(stage_ns.values())
    return RequestBreakdown(
        trace_id=str(row.get("trace_id", "")),
        endpoint=str(row.get("endpoint", "")),
        endpoint_class=str(row.get("endpoint_class", "")),
        measure=measure,
        total_ns=total,
        stage_ns=stage_ns,
    )


def _duration(value: Any, column: str) -> int:
    ns = int(value)
    if ns < 0:
        raise ValueError(f"{column} must be a non-negative duration in ns, got {value!r}")
    return ns


@dataclass
class StageSummary:
    """Stage breakdown of a group of requests.

    ``group``: the endpoint, endpoint class or band name (``""`` for all requests).
    ``count``: requests in the group. ``total_mean_ns``: mean of the measure.
    ``stage_mean_ns``: stage -> mean nanoseconds (``rest`` included). ``stage_share``:
    stage -> time-weighted share of the measure (ratio). ``stage_p99_ns``: stage -> exact
    p99 of that stage over the group (``rest`` excluded: it is a difference, not a stage).
    ``lower_ns`` / ``upper_ns``: the measure's range for a band, else ``None``.
    """

    group: str
    measure: str
    count: int
    total_mean_ns: float
    stage_mean_ns: dict[str, float] = field(default_factory=dict)
    stage_share: dict[str, float] = field(default_factory=dict)
    stage_p99_ns: dict[str, float] = field(default_factory=dict)
    lower_ns: float | None = None
    upper_ns: float | None = None


def summarize(breakdowns: Sequence[RequestBreakdown], group: str = "") -> StageSummary:
    """Aggregate request breakdowns of one measure into a :class:`StageSummary`.

    Raises ``ValueError`` for an empty input or mixed measures.
    """
    if not breakdowns:
        raise ValueError("breakdowns is empty: nothing to summarize")
    measure = breakdowns[0].measure
    if any(b.measure != measure for b in breakdowns):
        raise ValueError("breakdowns mix measures; summarize TTFT and E2E separately")
    count = len(breakdowns)
    total_sum = sum(b.total_ns for b in breakdowns)
    names = [*measure_stages(measure), REST]
    stage_sum = {name: sum(b.stage_ns[name] for b in breakdowns) for name in names}
    return StageSummary(
        group=group,
        measure=measure,
        count=count,
        total_mean_ns=total_sum / count,
        stage_mean_ns={name: stage_sum[name] / count for name in names},
        stage_share={name: (stage_sum[name] / total_sum if total_sum else 0.0) for name in names},
        stage_p99_ns={
            name: quantiles([b.stage_ns[name] for b in breakdowns], (0.99,))[0.99] for name in measure_stages(measure)
        },
    )


def breakdown_by(
    rows: Iterable[Mapping[str, Any]], *, measure: str = "e2e", group_by: str | None = "endpoint"
) -> list[StageSummary]:
    """Stage summaries per ``group_by`` value (``"endpoint"``, ``"endpoint_class"`` or ``None``
    for one summary of all rows), largest group first; rows without the measure are skipped.

    Raises ``ValueError`` for an unknown ``group_by`` or measure.
    """
    if group_by not in (None, "endpoint", "endpoint_class"):
        raise ValueError(f"group_by must be 'endpoint', 'endpoint_class' or None, got {group_by!r}")
    groups: dict[str, list[RequestBreakdown]] = {}
    for row in rows:
        breakdown = request_breakdown(row, measure)
        if breakdown is None:
            continue
        key = "" if group_by is None else getattr(breakdown, group_by)
        groups.setdefault(key, []).append(breakdown)
    summaries = [summarize(items, group) for group, items in groups.items()]
    return sorted(summaries, key=lambda s: (-s.count, s.group))


def breakdown_by_band(rows: Iterable[Mapping[str, Any]], *, measure: str = "e2e") -> list[StageSummary]:
    """Stage summaries per percentile band of ``measure`` (:data:`BANDS`, fastest first).

    Band edges are exact quantiles of the measure over ``rows``; a request sits in the band
    whose range [lower, upper) holds it (the last band includes its upper edge). Bands
    without requests are left out. Shows whether the slow tail differs in *kind* (e.g.
    queueing only in p99+) or only in size from the median request.
    """
    breakdowns = [b for b in (request_breakdown(row, measure) for row in rows) if b is not None]
    if not breakdowns:
        return []
    edges = quantiles([b.total_ns for b in breakdowns], sorted({q for _, lo, hi in BANDS for q in (lo, hi)}))
    summaries = []
    for position, (name, low_q, high_q) in enumerate(BANDS):
        low, high = edges[low_q], edges[high_q]
        last = position == len(BANDS) - 1
        members = [b for b in breakdowns if low <= b.total_ns and (b.total_ns < high or (last and b.total_ns <= high))]
        if members:
            summary = summarize(members, name)
            summary.lower_ns, summary.upper_ns = low, high
            summaries.append(summary)
    return summaries


FINAL_SETTINGS = " SETTINGS do_not_merge_across_partitions_select_final = 1"
"""Ends every read of ``inferpath_requests FINAL`` here. The versions of a request row share
its partition (the day of its ``timestamp``, the request's start), so they never need
merging across partitions, and a partition already merged into one part is then read
without merging at all: over a merged day this makes a one-hour read about 10× faster,
because the table is ordered by ``trace_id`` and a time filter cannot skip its key
columns. A trace whose re-assembly moved its start across midnight would count twice."""

REQUEST_QUERY_COLUMNS: tuple[str, ...] = (
    "timestamp",
    "trace_id",
    "service_name",
    "endpoint",
    "endpoint_class",
    "model",
    "replica",
    "status",
    "input_tokens",
    "output_tokens",
    "ttft_ns",
    "e2e_ns",
    "client_ttft_ns",
    "client_e2e_ns",
    "itl_ns",
    *(f"{stage}_ns" for stage in BREAKDOWN_STAGES),
    "model_ns",
    "postprocess_ns",
    *TTFT_PHASE_COLUMNS.values(),
    ENGINE_SEND_COLUMN,
)


def fetch_request_rows(
    store: Any,
    *,
    start: datetime,
    end: datetime,
    endpoint: str | None = None,
    endpoint_class: str | None = None,
    status: str | None = "ok",
    columns: Sequence[str] = REQUEST_QUERY_COLUMNS,
) -> list[dict[str, Any]]:
    """Request rows with ``start ≤ timestamp < end`` from ``inferpath_requests`` (``FINAL``,
    so a re-assembled trace counts once), oldest first, as dicts of
    :data:`REQUEST_QUERY_COLUMNS`.

    ``endpoint`` / ``endpoint_class`` / ``status`` filter when not ``None``; the default
    keeps only ``ok`` requests, because failed ones end early and would look fast.
    ``start``/``end`` must be timezone-aware (``ValueError`` otherwise, from the store).
    ``columns``: a subset of :data:`REQUEST_QUERY_COLUMNS` to read (``ValueError`` naming an
    unknown one); fewer columns read an hour of traffic faster.
    """
    unknown = [c for c in columns if c not in REQUEST_QUERY_COLUMNS]
    if unknown:
        raise ValueError(f"columns: unknown request column(s) {unknown}")
    where, parameters = request_filter(
        start=start, end=end, endpoint=endpoint, endpoint_class=endpoint_class, status=status
    )
    sql = f"SELECT {', '.join(columns)} FROM inferpath_requests FINAL WHERE {where} ORDER BY timestamp{FINAL_SETTINGS}"
    return store.query_dicts(sql, parameters)


def request_filter(
    *,
    start: datetime,
    end: datetime,
    endpoint: str | None = None,
    endpoint_class: str | None = None,
    status: str | None = "ok",
    columns: dict[str, str] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The ``WHERE`` condition (SQL text with ``{name:Type}`` placeholders) and its parameters
    selecting request rows with ``start ≤ timestamp < end`` and the given ``endpoint`` /
    ``endpoint_class`` / ``status`` (each ignored when ``None``), as :func:`fetch_request_rows`
    and the in-database aggregates (:mod:`inferpath.analysis.band_query`,
    :mod:`inferpath.analysis.timeline_query`) read them. ``columns``: further exact-match
    filters on ``service_name`` / ``model`` / ``replica`` (column → value, as
    :func:`inferpath.storage.reader.row_filters` gives). Values are bound, never pasted."""
    from inferpath.storage.reader import row_filter_sql

    conditions = ["timestamp >= {start:DateTime64(9)}", "timestamp < {end:DateTime64(9)}"]
    parameters: dict[str, Any] = {"start": start, "end": end}
    for column, value in (("endpoint", endpoint), ("endpoint_class", endpoint_class), ("status", status)):
        if value is not None:
            conditions.append(f"{column} = {{{column}:String}}")
            parameters[column] = value
    return " AND ".join(conditions) + row_filter_sql(columns, parameters), parameters


__all__ = [
    "BANDS",
    "FINAL_SETTINGS",
    "REQUEST_QUERY_COLUMNS",
    "REST",
    "RequestBreakdown",
    "StageSummary",
    "breakdown_by",
    "breakdown_by_band",
    "fetch_request_rows",
    "measure_stages",
    "request_breakdown",
    "request_filter",
    "stage_columns",
    "stage_sql",
    "summarize",
]
