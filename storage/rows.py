# mypy: disable-error-code="misc"
# (mypy misses the slots SpanRow inherits from _StartNsCache under @dataclass(slots=True).)
"""Row shapes of inferpath's tables and their column orders.

The ``otel_*`` column lists are the OpenTelemetry Collector contrib ClickHouse exporter's
insert column orders (its Map-typed schema), so rows built here and rows written by that
exporter are interchangeable.

Strings the exporter writes (pdata ``SpanKind.String()`` / ``StatusCode.String()``, used by
its current versions; releases before the ``ScopeName`` column wrote ``SPAN_KIND_*`` /
``STATUS_CODE_*`` instead):

- ``SpanKind``: ``Unspecified``, ``Internal``, ``Server``, ``Client``, ``Producer``, ``Consumer``
- ``StatusCode``: ``Unset``, ``Ok``, ``Error``

Clocks and precision: ``timestamp`` values are wall-clock, timezone-aware UTC datetimes,
which hold microseconds; OTLP nanoseconds below a microsecond are truncated when building a
row (durations keep full nanoseconds in ``duration_ns``).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import Any

UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

SPAN_KINDS = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
STATUS_CODES = ("Unset", "Ok", "Error")

# Older exporter spellings, mapped to the current ones for readers that meet old data.
LEGACY_SPAN_KINDS = {f"SPAN_KIND_{k.upper()}": k for k in SPAN_KINDS}
LEGACY_STATUS_CODES = {f"STATUS_CODE_{c.upper()}": c for c in STATUS_CODES}

_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
_SPAN_ID = re.compile(r"^[0-9a-f]{16}$")

SPAN_COLUMNS: tuple[str, ...] = (
    "Timestamp",
    "TraceId",
    "SpanId",
    "ParentSpanId",
    "TraceState",
    "SpanName",
    "SpanKind",
    "ServiceName",
    "ResourceAttributes",
    "ScopeName",
    "ScopeVersion",
    "SpanAttributes",
    "Duration",
    "StatusCode",
    "StatusMessage",
    "Events.Timestamp",
    "Events.Name",
    "Events.Attributes",
    "Links.TraceId",
    "Links.SpanId",
    "Links.TraceState",
    "Links.Attributes",
)

_METRIC_HEAD: tuple[str, ...] = (
    "ResourceAttributes",
    "ResourceSchemaUrl",
    "ScopeName",
    "ScopeVersion",
    "ScopeAttributes",
    "ScopeDroppedAttrCount",
    "ScopeSchemaUrl",
    "ServiceName",
    "MetricName",
    "MetricDescription",
    "MetricUnit",
    "Attributes",
    "StartTimeUnix",
    "TimeUnix",
)
_EXEMPLARS: tuple[str, ...] = (
    "Exemplars.FilteredAttributes",
    "Exemplars.TimeUnix",
    "Exemplars.Value",
    "Exemplars.SpanId",
    "Exemplars.TraceId",
)
GAUGE_COLUMNS: tuple[str, ...] = _METRIC_HEAD + ("Value", "Flags") + _EXEMPLARS
SUM_COLUMNS: tuple[str, ...] = GAUGE_COLUMNS + ("AggregationTemporality", "IsMonotonic")
HISTOGRAM_COLUMNS: tuple[str, ...] = (
    _METRIC_HEAD
    + ("Count", "Sum", "BucketCounts", "ExplicitBounds")
    + _EXEMPLARS
    + ("Flags", "Min", "Max", "AggregationTemporality")
)


def span_kind_name(kind: int) -> str:
    """The exporter's ``SpanKind`` string for an OTLP ``Span.SpanKind`` enum value (0..5).

    Unknown values map to ``"Unspecified"``.
    """
    return SPAN_KINDS[kind] if 0 <= kind < len(SPAN_KINDS) else SPAN_KINDS[0]


def status_code_name(code: int) -> str:
    """The exporter's ``StatusCode`` string for an OTLP ``Status.StatusCode`` (0..2).

    Unknown values map to ``"Unset"``.
    """
    return STATUS_CODES[code] if 0 <= code < len(STATUS_CODES) else STATUS_CODES[0]


_ONE_MICROSECOND = timedelta(microseconds=1)


def unix_ns_from_datetime(value: datetime) -> int:
    """Nanoseconds since the Unix epoch of an aware datetime (exact, integer arithmetic).

    Raises ``ValueError`` for a naive datetime or another type."""
    # A UTC datetime (every stored and decoded span, the assembler's hot path) needs no check.
    if not (value.__class__ is datetime and value.tzinfo is timezone.utc):
        _require_aware(value, "datetime")
    return (value - UNIX_EPOCH) // _ONE_MICROSECOND * 1000


def datetime_from_unix_ns(unix_ns: int) -> datetime:
    """Aware UTC datetime of ``unix_ns`` nanoseconds since the epoch (truncated to µs)."""
    return UNIX_EPOCH + timedelta(microseconds=int(unix_ns) // 1000)


def _require_aware(value: Any, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise ValueError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got naive {value!r}")
    return value.astimezone(timezone.utc)


class _StartNsCache:
    """Slots outside :class:`SpanRow`'s fields (so not in ``==``, ``repr`` or ``asdict``): its
    start in Unix ns and the ``timestamp`` object it was computed from. Assembly and the
    insert read the start of every span several times; a datetime → ns conversion each time
    was ~1/4 of assembling a trace."""

    __slots__ = ("_start_ns", "_start_ns_of")
    _start_ns: int | None
    _start_ns_of: datetime | None


@dataclass(slots=True)
class SpanRow(_StartNsCache):
    """One span as stored in ``otel_traces``.

    ``timestamp``: span start (aware; stored as UTC). ``trace_id``: 32 lowercase hex,
    ``span_id``: 16 lowercase hex, ``parent_span_id``: 16 hex or ``""`` for a root.
    ``span_kind`` / ``status_code``: the exporter's strings (module docstring).
    ``duration_ns``: end − start in nanoseconds (≥ 0). ``events``: sequence (a list, or
    the empty tuple from the OTLP decoder) of ``(timestamp, name, attributes)``; ``links``:
    sequence of ``(trace_id, span_id, trace_state, attributes)``. Attribute values are strings, as the
    exporter's Map(String, String) columns hold them.
    Raises ``ValueError`` naming the field on a malformed id, naive time or negative duration.
    """

    timestamp: datetime
    trace_id: str
    span_id: str
    parent_span_id: str = ""
    trace_state: str = ""
    span_name: str = ""
    span_kind: str = "Internal"
    service_name: str = ""
    resource_attributes: dict[str, str] = field(default_factory=dict)
    scope_name: str = ""
    scope_version: str = ""
    span_attributes: dict[str, str] = field(default_factory=dict)
    duration_ns: int = 0
    status_code: str = "Unset"
    status_message: str = ""
    events: Sequence[tuple[datetime, str, dict[str, str]]] = field(default_factory=list)
    links: Sequence[tuple[str, str, str, dict[str, str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.timestamp = _require_aware(self.timestamp, "timestamp")
        self._start_ns_of = None
        if not isinstance(self.trace_id, str) or not _TRACE_ID.match(self.trace_id):
            raise ValueError(f"trace_id must be 32 lowercase hex characters, got {self.trace_id!r}")
        if not isinstance(self.span_id, str) or not _SPAN_ID.match(self.span_id):
            raise ValueError(f"span_id must be 16 lowercase hex characters, got {self.span_id!r}")
        if self.parent_span_id and not _SPAN_ID.match(self.parent_span_id):
            raise ValueError(
                f"parent_span_id must be 16 lowercase hex characters or empty, got {self.parent_span_id!r}"
            )
        if isinstance(self.duration_ns, bool) or not isinstance(self.duration_ns, int) or self.duration_ns < 0:
            raise ValueError(f"duration_ns must be a non-negative int, got {self.duration_ns!r}")

    @classmethod
    def from_checked(
        cls,
        timestamp: datetime,
        trace_id: str,
        span_id: str,
        parent_span_id: str,
        trace_state: str,
        span_name: str,
        span_kind: str,
        service_name: str,
        resource_attributes: dict[str, str],
        scope_name: str,
        scope_version: str,
        span_attributes: dict[str, str],
        duration_ns: int,
        status_code: str,
        status_message: str,
        events: Sequence,
        links: Sequence,
        start_ns: int | None = None,
    ) -> SpanRow:
        """Build without the checks of ``__post_init__``, all fields given in declaration order.

        Only for values already checked by the caller: ``timestamp`` aware UTC, ids lowercase
        hex of the right length (e.g. ``bytes.hex()`` of 16/8-byte ids), ``duration_ns`` an int
        ≥ 0, and ``start_ns``, when given, exactly :func:`unix_ns_from_datetime` of
        ``timestamp``. The OTLP decoder validates every span this way; skipping the regex and
        timezone checks halves the cost of building a row on the ingest path.
        """
        row = cls.__new__(cls)
        row.timestamp, row.trace_id, row.span_id, row.parent_span_id = timestamp, trace_id, span_id, parent_span_id
        row.trace_state, row.span_name, row.span_kind, row.service_name = (
            trace_state,
            span_name,
            span_kind,
            service_name,
        )
        row.resource_attributes, row.scope_name, row.scope_version = resource_attributes, scope_name, scope_version
        row.span_attributes, row.duration_ns, row.status_code = span_attributes, duration_ns, status_code
        row.status_message, row.events, row.links = status_message, events, links
        row._start_ns_of = None if start_ns is None else timestamp
        row._start_ns = start_ns
        return row

    @property
    def start_ns(self) -> int:
        """Span start, Unix nanoseconds (µs resolution, see module docstring)."""
        timestamp = self.timestamp
        if self._start_ns_of is not timestamp:  # first read, or a new timestamp assigned
            self._start_ns = unix_ns_from_datetime(timestamp)
            self._start_ns_of = timestamp
        return self._start_ns  # type: ignore[return-value]  # set just above or with its timestamp

    @property
    def end_ns(self) -> int:
        """Span end, Unix nanoseconds: ``start_ns + duration_ns``."""
        return self.start_ns + self.duration_ns

    @property
    def is_root(self) -> bool:
        """True when the span has no parent span id."""
        return not self.parent_span_id

    def to_insert_row(self, *, timestamp_ns: bool = False) -> tuple:
        """Values in :data:`SPAN_COLUMNS` order, ready for ``Store.insert``.

        ``timestamp_ns``: give ``Timestamp`` as Unix nanoseconds, an int (ticks of its
        DateTime64(9) column), which the driver writes as it is; a datetime costs it a
        conversion per row (the ingest path). Every row of one insert must then be built
        the same way: the driver picks its conversion from a column's first value."""
        start = self.start_ns if timestamp_ns else self.timestamp
        events, links = self.events, self.links
        if not events and not links:
            # Most spans carry neither: skip the seven comprehensions (the ingest hot path). The
            # empty arrays are the shared empty tuple, not new lists: a tuple of strings, ints,
            # datetimes and string-only dicts is untracked by the garbage collector at its first
            # young collection, so rows waiting for their insert are not rescanned by every
            # later one (collections had taken ~1/3 of the server's CPU at 20k spans/s).
            return (
                start,
                self.trace_id,
                self.span_id,
                self.parent_span_id,
                self.trace_state,
                self.span_name,
                self.span_kind,
                self.service_name,
                self.resource_attributes,
                self.scope_name,
                self.scope_version,
                self.span_attributes,
                self.duration_ns,
                self.status_code,
                self.status_message,
                (),
                (),
                (),
                (),
                (),
                (),
                (),
            )
        return (
            start,
            self.trace_id,
            self.span_id,
            self.parent_span_id,
            self.trace_state,
            self.span_name,
            self.span_kind,
            self.service_name,
            self.resource_attributes,
            self.scope_name,
            self.scope_version,
            self.span_attributes,
            self.duration_ns,
            self.status_code,
            self.status_message,
            [e[0] for e in self.events],
            [e[1] for e in self.events],
            [e[2] for e in self.events],
            [link[0] for link in self.links],
            [link[1] for link in self.links],
            [link[2] for link in self.links],
            [link[3] for link in self.links],
        )

    @classmethod
    def from_db_row(cls, row: Sequence[Any]) -> SpanRow:
        """Build from a row selected in :data:`SPAN_COLUMNS` order.

        Legacy ``SPAN_KIND_*`` / ``STATUS_CODE_*`` strings are mapped to the current ones.
        """
        if len(row) != len(SPAN_COLUMNS):
            raise ValueError(f"span row must have {len(SPAN_COLUMNS)} values, got {len(row)}")
        (
            ts,
            trace_id,
            span_id,
            parent,
            state,
            name,
            kind,
            service,
            res_attrs,
            scope_name,
            scope_version,
            span_attrs,
            duration,
            status,
            status_message,
            ev_ts,
            ev_names,
            ev_attrs,
            l_trace,
            l_span,
            l_state,
            l_attrs,
        ) = row
        return cls(
            timestamp=ts,
            trace_id=trace_id,
            span_id=span_id,
            parent_span_id=parent,
            trace_state=state,
            span_name=name,
            span_kind=LEGACY_SPAN_KINDS.get(kind, kind),
            service_name=service,
            resource_attributes=dict(res_attrs or {}),
            scope_name=scope_name,
            scope_version=scope_version,
            span_attributes=dict(span_attrs or {}),
            duration_ns=int(duration),
            status_code=LEGACY_STATUS_CODES.get(status, status),
            status_message=status_message,
            events=[(t, n, dict(a or {})) for t, n, a in zip(ev_ts, ev_names, ev_attrs)],
            links=[(t, s, st, dict(a or {})) for t, s, st, a in zip(l_trace, l_span, l_state, l_attrs)],
        )


def _now_utc() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class RequestRow:
    """One request (trace) as stored in ``inferpath_requests``; see docs/telemetry-contract.md.

    ``timestamp``: earliest span start (aware). Every ``*_ns`` field is a duration in
    nanoseconds or ``None`` when the trace did not measure it. ``gateway_ttft_ns`` /
    ``network_ttft_ns``: the parts of ``gateway_ns`` / ``network_ns`` that fall before the
    first token (schema 012; ``None`` when ``ttft_ns`` is). ``ttft_source``: where the TTFT
    readers show (``client_ttft_ns``, else ``ttft_ns``) came from, ``missing_measures``: why
    a measure is missing, ``"measure: reason"`` joined by ``"; "`` (schema 015, see
    ``server/sources.py``; ``""`` in rows stored before). ``engine_send_ns``: the trip out of
    the hop into the engine, its caller's start to the engine span's start (schema 016;
    ``None`` without that hop). ``status``: ``ok``,
    ``error`` or ``incomplete``. ``updated_at``: version for ReplacingMergeTree (newest
    wins under ``FINAL``); defaults to now.
    """

    timestamp: datetime
    trace_id: str
    service_name: str = ""
    endpoint: str = ""
    endpoint_class: str = ""
    model: str = ""
    model_version: str = ""
    replica: str = ""
    status: str = ""
    http_status_code: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    client_ttft_ns: int | None = None
    client_e2e_ns: int | None = None
    ttft_ns: int | None = None
    e2e_ns: int | None = None
    itl_ns: int | None = None
    gateway_ns: int | None = None
    tokenize_ns: int | None = None
    retrieval_ns: int | None = None
    queue_ns: int | None = None
    prefill_ns: int | None = None
    decode_ns: int | None = None
    model_ns: int | None = None
    network_ns: int | None = None
    postprocess_ns: int | None = None
    gateway_ttft_ns: int | None = None
    network_ttft_ns: int | None = None
    ttft_source: str = ""
    missing_measures: str = ""
    engine_send_ns: int | None = None
    span_count: int = 0
    updated_at: datetime = field(default_factory=_now_utc)

    def __post_init__(self) -> None:
        self.timestamp = _require_aware(self.timestamp, "timestamp")
        self.updated_at = _require_aware(self.updated_at, "updated_at")
        if not isinstance(self.trace_id, str) or not _TRACE_ID.match(self.trace_id):
            raise ValueError(f"trace_id must be 32 lowercase hex characters, got {self.trace_id!r}")

    def to_insert_row(self) -> tuple:
        """Values in :data:`REQUEST_COLUMNS` order."""
        return _REQUEST_VALUES(self)

    @classmethod
    def from_db_row(cls, row: Sequence[Any]) -> RequestRow:
        """Build from a row selected in :data:`REQUEST_COLUMNS` order."""
        if len(row) != len(REQUEST_COLUMNS):
            raise ValueError(f"request row must have {len(REQUEST_COLUMNS)} values, got {len(row)}")
        return cls(*row)


REQUEST_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(RequestRow))
_REQUEST_VALUES = operator.attrgetter(*REQUEST_COLUMNS)  # one C call per row


@dataclass(slots=True)
class _MetricPoint:
    resource_attributes: dict[str, str]
    service_name: str
    metric_name: str
    description: str
    unit: str
    attributes: dict[str, str]
    start_time: datetime | None
    time: datetime

    def _head(self) -> tuple:
        start = UNIX_EPOCH if self.start_time is None else _require_aware(self.start_time, "start_time")
        return (
            self.resource_attributes,
            "",
            getattr(self, "scope_name", ""),
            getattr(self, "scope_version", ""),
            {},
            0,
            "",
            self.service_name,
            self.metric_name,
            self.description,
            self.unit,
            self.attributes,
            start,
            _require_aware(self.time, "time"),
        )


_NO_EXEMPLARS: tuple[list[Any], ...] = ([], [], [], [], [])


@dataclass(slots=True)
class GaugeRow(_MetricPoint):
    """A gauge data point for ``otel_metrics_gauge``.

    ``time``: observation time (aware). ``start_time``: ``None`` is stored as the epoch, as
    the exporter stores an unset OTLP start time. ``value``: float in the metric's ``unit``.
    """

    value: float = 0.0
    scope_name: str = ""
    scope_version: str = ""

    def to_insert_row(self) -> tuple:
        """Values in :data:`GAUGE_COLUMNS` order (no exemplars, flags 0)."""
        return self._head() + (float(self.value), 0) + _NO_EXEMPLARS


@dataclass(slots=True)
class SumRow(_MetricPoint):
    """A sum (counter) data point for ``otel_metrics_sum``.

    ``aggregation_temporality``: OTLP enum (1 delta, 2 cumulative). ``is_monotonic``: counter.
    """

    value: float = 0.0
    aggregation_temporality: int = 2
    is_monotonic: bool = True
    scope_name: str = ""
    scope_version: str = ""

    def to_insert_row(self) -> tuple:
        """Values in :data:`SUM_COLUMNS` order."""
        return (
            self._head()
            + (float(self.value), 0)
            + _NO_EXEMPLARS
            + (int(self.aggregation_temporality), bool(self.is_monotonic))
        )


@dataclass(slots=True)
class HistogramRow(_MetricPoint):
    """An explicit-bucket histogram data point for ``otel_metrics_histogram``.

    ``bucket_counts`` has ``len(explicit_bounds) + 1`` entries (OTLP). ``min``/``max``:
    ``None`` stored as 0, as the exporter stores unset values.
    """

    count: int = 0
    sum: float = 0.0
    bucket_counts: list[int] = field(default_factory=list)
    explicit_bounds: list[float] = field(default_factory=list)
    min: float | None = None
    max: float | None = None
    aggregation_temporality: int = 2
    scope_name: str = ""
    scope_version: str = ""

    def to_insert_row(self) -> tuple:
        """Values in :data:`HISTOGRAM_COLUMNS` order."""
        if self.bucket_counts and len(self.bucket_counts) != len(self.explicit_bounds) + 1:
            raise ValueError(
                f"bucket_counts must have len(explicit_bounds) + 1 = {len(self.explicit_bounds) + 1} "
                f"entries, got {len(self.bucket_counts)}"
            )
        return (
            self._head()
            + (
                int(self.count),
                float(self.sum),
                [int(c) for c in self.bucket_counts],
                [float(b) for b in self.explicit_bounds],
            )
            + _NO_EXEMPLARS
            + (0, float(self.min or 0.0), float(self.max or 0.0), int(self.aggregation_temporality))
        )
