"""Decode OTLP/HTTP export requests into storage rows.

``decode_trace_request`` turns an ``ExportTraceServiceRequest`` body (protobuf or OTLP/JSON,
optionally gzip) into :class:`~inferpath.storage.rows.SpanRow` values shaped like the
OpenTelemetry Collector's ClickHouse exporter writes them (``SpanKind`` ``"Server"``,
``StatusCode`` ``"Error"``, attributes flattened by :mod:`inferpath.server.attributes`).
``decode_metrics_request`` does the same for gauges, sums and histograms.

A malformed body raises :class:`OTLPDecodeError` (HTTP 400). A well-formed body with some
invalid items keeps the valid ones and counts the rest, for OTLP's ``partial_success``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from inferpath.server.attributes import attributes_to_map
from inferpath.server.otlp_body import (
    BodyTooLargeError,
    OTLPDecodeError,
    UnsupportedMediaTypeError,
    body_format,
    decompress,
    parse_message,
)
from inferpath.storage.rows import (
    SPAN_KINDS,
    STATUS_CODES,
    UNIX_EPOCH,
    GaugeRow,
    HistogramRow,
    SpanRow,
    SumRow,
    datetime_from_unix_ns,
)

__all__ = [
    "BodyTooLargeError",
    "OTLPDecodeError",
    "UnsupportedMediaTypeError",
    "DecodedSpans",
    "DecodedMetrics",
    "decode_trace_request",
    "decode_metrics_request",
    "SPAN_KIND_NAMES",
    "STATUS_CODE_NAMES",
]

# OTLP enum number → the name the Collector's exporter stores (pdata ``String()`` minus its prefix).
SPAN_KIND_NAMES = dict(enumerate(SPAN_KINDS))
STATUS_CODE_NAMES = dict(enumerate(STATUS_CODES))
# How many per-item reasons one partial_success message quotes before summarizing.
_MAX_REASONS = 5

_ZERO_TRACE_ID = bytes(16)
_ZERO_SPAN_ID = bytes(8)
# DateTime64(9) holds signed 64-bit nanoseconds: nothing after 2262-04-11T23:47:16Z fits.
MAX_STORABLE_UNIX_NS = 2**63 - 1


@dataclass(frozen=True)
class DecodedSpans:
    """Result of decoding one trace export: ``spans`` kept, ``rejected_spans`` counted, and
    ``error_message`` explaining the rejections and any warnings about kept spans (empty
    when none; OTLP's ``partial_success`` carries it, with a count of 0 for warnings alone)."""

    spans: list[SpanRow]
    rejected_spans: int = 0
    error_message: str = ""
    warned_spans: int = 0  # of ``spans``, those kept with a warning in ``error_message``


@dataclass(frozen=True)
class DecodedMetrics:
    """Result of decoding one metrics export: rows per table and rejected data points."""

    gauges: list[GaugeRow] = field(default_factory=list)
    sums: list[SumRow] = field(default_factory=list)
    histograms: list[HistogramRow] = field(default_factory=list)
    rejected_data_points: int = 0
    error_message: str = ""

    @property
    def data_points(self) -> int:
        """Data points kept across all three tables."""
        return len(self.gauges) + len(self.sums) + len(self.histograms)


#: Longest metric name kept (characters): the read API's bound on its ``metric`` parameter.
#: OpenTelemetry's instrument names stop at 255; scraped Prometheus names are shorter still.
MAX_METRIC_NAME_CHARS = 512


class _Rejections:
    """Counts rejected items and items kept with a warning (OTLP's ``partial_success``
    carries such warnings with a count of 0), keeping the first few reasons of each."""

    def __init__(self, noun: str) -> None:
        self.noun = noun  # plural: "spans", "data points"
        self.count = 0
        self.reasons: list[str] = []
        self._named = 0  # items that the kept reasons account for
        self.warned = 0
        self.warnings: list[str] = []

    def add(self, path: str, reason: str, count: int = 1) -> None:
        """``count`` items rejected for one ``reason`` (e.g. every point of one metric)."""
        self.count += count
        if len(self.reasons) < _MAX_REASONS:
            self.reasons.append(f"{path}: {reason}")
            self._named += count

    def warn(self, warning: str) -> None:
        """One kept item with ``warning`` (its path and what was taken instead)."""
        self.warned += 1
        if len(self.warnings) < _MAX_REASONS:
            self.warnings.append(warning)

    def _said(self, count: int, named: int, reasons: list[str], what: str) -> str:
        noun = self.noun if count != 1 else self.noun[:-1]
        return (
            f"{count} {noun} {what}: " + "; ".join(reasons) + (f"; and {count - named} more" if count > named else "")
        )

    def message(self) -> str:
        parts = [self._said(self.count, self._named, self.reasons, "rejected")] if self.count else []
        if self.warned:
            parts.append(self._said(self.warned, len(self.warnings), self.warnings, "kept with a warning"))
        return ". ".join(parts)


def _time_problem(name: str, unix_ns: int, oldest_unix_ns: int) -> str | None:
    if unix_ns > MAX_STORABLE_UNIX_NS:
        return f"{name} {unix_ns} is after 2262-04-11, the last time DateTime64(9) can hold"
    if unix_ns < oldest_unix_ns:
        return (
            f"{name} {unix_ns} ({_utc(unix_ns)}) is older than the store's retention: rows before "
            f"{_utc(oldest_unix_ns)} would be dropped by the table's TTL"
        )
    return None


def _utc(unix_ns: int) -> str:
    """``unix_ns`` as an ISO-8601 UTC time to the second, e.g. ``2018-01-01T00:00:00Z``."""
    return datetime.fromtimestamp(unix_ns // 1_000_000_000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _span_problem(span, path: str, oldest_unix_ns: int) -> str | None:
    """Why ``span`` (at ``path``) is rejected, or ``None``. Raises :class:`OTLPDecodeError`
    for an id of the wrong length, as the Collector fails the whole request on one."""
    ids = [("traceId", span.trace_id, 16), ("spanId", span.span_id, 8), ("parentSpanId", span.parent_span_id, 8)]
    for n, link in enumerate(span.links):
        ids += ((f"links[{n}].traceId", link.trace_id, 16), (f"links[{n}].spanId", link.span_id, 8))
    for name, raw, length in ids:
        if raw and len(raw) != length:  # empty means "unset"
            raise OTLPDecodeError(f"{path}.{name}: expected {length} bytes, got {len(raw)}")
    if not span.trace_id:
        return "traceId is missing"
    if span.trace_id == _ZERO_TRACE_ID:
        return "traceId is all zeros"
    if not span.span_id:
        return "spanId is missing"
    if span.span_id == _ZERO_SPAN_ID:
        return "spanId is all zeros"
    if span.start_time_unix_nano == 0:
        return "startTimeUnixNano is missing"
    if span.end_time_unix_nano < span.start_time_unix_nano:
        return "endTimeUnixNano is before startTimeUnixNano"
    problem = _time_problem("startTimeUnixNano", span.start_time_unix_nano, oldest_unix_ns) or _time_problem(
        "endTimeUnixNano", span.end_time_unix_nano, 0
    )
    if problem:
        return problem
    for n, event in enumerate(span.events):
        if event.time_unix_nano > MAX_STORABLE_UNIX_NS:
            return _time_problem(f"events[{n}].timeUnixNano", event.time_unix_nano, 0)
    return None


def decode_trace_request(
    body: bytes, *, content_type: str | None, content_encoding: str | None, oldest_unix_ns: int = 0
) -> DecodedSpans:
    """Decode an OTLP/HTTP ``/v1/traces`` body into span rows.

    ``content_type``: ``application/x-protobuf`` or ``application/json``; ``content_encoding``:
    ``gzip``, ``deflate`` or ``None``/``identity``. Raises :class:`UnsupportedMediaTypeError`
    for other (or no) media types or encodings, :class:`OTLPDecodeError` for a malformed body
    or an id of the wrong length (path given as ``resourceSpans[i].scopeSpans[j].spans[k].traceId``).
    Spans with a missing or all-zero id, no start time, end before start, a time after 2262
    (past DateTime64(9)) or a start before ``oldest_unix_ns`` (the store's retention: the TTL
    would drop the row silently) are rejected and counted, with the reason in
    ``error_message``. A span whose kind or status code OTLP does not define (a number, or
    an OTLP/JSON name) is kept with the default (``Unspecified``, ``Unset``) and a warning
    in ``error_message``.
    """
    fmt = body_format(content_type)
    payload = decompress(body, content_encoding)
    rejections = _Rejections("spans")
    # Warnings per span path from the OTLP/JSON checks; said only for spans that are kept.
    warnings: dict[str, list[str]] = {}
    request = parse_message(payload, fmt, ExportTraceServiceRequest(), "traces", warnings)
    spans: list[SpanRow] = []
    for i, resource_spans in enumerate(request.resource_spans):
        resource_attributes = attributes_to_map(resource_spans.resource.attributes)
        service_name = resource_attributes.get("service.name", "")
        for j, scope_spans in enumerate(resource_spans.scope_spans):
            scope_name, scope_version = scope_spans.scope.name, scope_spans.scope.version
            for k, span in enumerate(scope_spans.spans):
                # Each field read from the message builds a new Python object: read each once.
                trace_id, span_id, parent_span_id = span.trace_id, span.span_id, span.parent_span_id
                start_ns, end_ns = span.start_time_unix_nano, span.end_time_unix_nano
                events, links = span.events, span.links
                # The common case, decided in one expression: well-sized non-zero ids, times in
                # order and storable, no events or links. Anything else takes the full checks,
                # which name the field.
                if not (
                    len(trace_id) == 16
                    and len(span_id) == 8
                    and (not parent_span_id or len(parent_span_id) == 8)
                    and trace_id != _ZERO_TRACE_ID
                    and span_id != _ZERO_SPAN_ID
                    and 0 < start_ns <= end_ns <= MAX_STORABLE_UNIX_NS
                    and start_ns >= oldest_unix_ns
                    and not links
                    and not events
                ):
                    path = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                    problem = _span_problem(span, path, oldest_unix_ns)
                    if problem:
                        rejections.add(path, problem)
                        warnings.pop(path, None)
                        continue
                status = span.status
                kind, code = SPAN_KIND_NAMES.get(span.kind), STATUS_CODE_NAMES.get(status.code)
                if kind is None or code is None or warnings:
                    path = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                    found = warnings.pop(path, [])
                    if kind is None:  # a number OTLP does not define: stored as the default
                        kind = "Unspecified"
                        found.append(f"kind: unknown span kind {span.kind}, stored as the default")
                    if code is None:
                        code = "Unset"
                        found.append(f"status.code: unknown status code {status.code}, stored as the default")
                    if found:
                        rejections.warn("; ".join(f"{path}.{warning}" for warning in found))
                spans.append(
                    SpanRow.from_checked(  # every field checked above
                        UNIX_EPOCH + timedelta(microseconds=start_ns // 1000),  # datetime_from_unix_ns, inlined
                        trace_id.hex(),
                        span_id.hex(),
                        parent_span_id.hex(),
                        span.trace_state,
                        span.name,
                        kind,
                        service_name,
                        resource_attributes,
                        scope_name,
                        scope_version,
                        attributes_to_map(span.attributes),
                        end_ns - start_ns,
                        code,
                        status.message,
                        # No events or links (most spans): the shared empty tuple, which the
                        # garbage collector does not track, instead of two new lists per span.
                        [
                            (datetime_from_unix_ns(e.time_unix_nano), e.name, attributes_to_map(e.attributes))
                            for e in events
                        ]
                        if events
                        else (),
                        [
                            (
                                link.trace_id.hex(),
                                link.span_id.hex(),
                                link.trace_state,
                                attributes_to_map(link.attributes),
                            )
                            for link in links
                        ]
                        if links
                        else (),
                        start_ns // 1000 * 1000,
                    )
                )
    return DecodedSpans(spans, rejections.count, rejections.message(), warned_spans=rejections.warned)


# --- metrics -------------------------------------------------------------------------------


def _number_value(point) -> float:
    """A gauge or sum point's ``asDouble`` or ``asInt`` (0.0 when it has neither)."""
    return float(point.as_double if point.WhichOneof("value") == "as_double" else point.as_int)


def decode_metrics_request(
    body: bytes, *, content_type: str | None, content_encoding: str | None, oldest_unix_ns: int = 0
) -> DecodedMetrics:
    """Decode an OTLP/HTTP ``/v1/metrics`` body into gauge, sum and histogram rows.

    Same media types, encodings and errors as :func:`decode_trace_request`. Data points without
    a timestamp or value, with a NaN or infinite value (histograms: sum, min, max or bounds),
    with a time after 2262 or before ``oldest_unix_ns``, and
    exponential-histogram / summary points (no table for them), and the points of a metric
    whose name is empty or over :data:`MAX_METRIC_NAME_CHARS` characters, are rejected and
    counted. Exemplars, flags, scope attributes and schema URLs are not kept (the storage
    rows do not carry them; their columns are written empty).
    """
    fmt = body_format(content_type)
    payload = decompress(body, content_encoding)
    request = parse_message(payload, fmt, ExportMetricsServiceRequest(), "metrics")
    rejections = _Rejections("data points")
    out = DecodedMetrics()
    for i, resource_metrics in enumerate(request.resource_metrics):
        resource_attributes = attributes_to_map(resource_metrics.resource.attributes)
        service_name = resource_attributes.get("service.name", "")
        for j, scope_metrics in enumerate(resource_metrics.scope_metrics):
            scope = scope_metrics.scope
            for k, metric in enumerate(scope_metrics.metrics):
                path = f"resourceMetrics[{i}].scopeMetrics[{j}].metrics[{k}]"
                kind = metric.WhichOneof("data")
                if not metric.name or len(metric.name) > MAX_METRIC_NAME_CHARS:  # the read API could never ask for it
                    points = len(getattr(metric, kind).data_points) if kind else 0
                    if points:
                        name = (
                            f"{len(metric.name)} characters, at most {MAX_METRIC_NAME_CHARS}"
                            if metric.name
                            else "missing"
                        )
                        rejections.add(f"{path}.name", f"{name} (its {points} data point{'s' * (points != 1)})", points)
                    continue
                if kind is None:
                    rejections.add(path, "metric has no data (gauge, sum or histogram)")
                    continue
                data = getattr(metric, kind)
                if kind not in ("gauge", "sum", "histogram"):
                    json_name = metric.DESCRIPTOR.fields_by_name[kind].json_name
                    for n in range(len(data.data_points)):
                        rejections.add(f"{path}.{json_name}.dataPoints[{n}]", f"{json_name} points are not stored")
                    continue
                common = dict(
                    resource_attributes=resource_attributes,
                    service_name=service_name,
                    scope_name=scope.name,
                    scope_version=scope.version,
                    metric_name=metric.name,
                    description=metric.description,
                    unit=metric.unit,
                )
                for n, point in enumerate(data.data_points):
                    problem = _point_problem(point, kind, oldest_unix_ns)
                    if problem:
                        rejections.add(f"{path}.{kind}.dataPoints[{n}]", problem)
                        continue
                    # An unset OTLP start time (0) is stored as the epoch, as the exporter does.
                    fields = dict(
                        common,
                        attributes=attributes_to_map(point.attributes),
                        start_time=datetime_from_unix_ns(point.start_time_unix_nano),
                        time=datetime_from_unix_ns(point.time_unix_nano),
                    )
                    if kind == "gauge":
                        out.gauges.append(GaugeRow(**fields, value=_number_value(point)))
                    elif kind == "sum":
                        out.sums.append(
                            SumRow(
                                **fields,
                                value=_number_value(point),
                                aggregation_temporality=int(data.aggregation_temporality),
                                is_monotonic=bool(data.is_monotonic),
                            )
                        )
                    else:
                        out.histograms.append(
                            HistogramRow(
                                **fields,
                                count=int(point.count),
                                sum=float(point.sum),
                                bucket_counts=[int(c) for c in point.bucket_counts],
                                explicit_bounds=[float(b) for b in point.explicit_bounds],
                                min=float(point.min) if point.HasField("min") else None,
                                max=float(point.max) if point.HasField("max") else None,
                                aggregation_temporality=int(data.aggregation_temporality),
                            )
                        )
    return DecodedMetrics(out.gauges, out.sums, out.histograms, rejections.count, rejections.message())


def _point_problem(point, kind: str, oldest_unix_ns: int) -> str | None:
    """Why a ``kind`` (gauge, sum or histogram) data point is rejected, or ``None``."""
    if kind != "histogram":
        if point.WhichOneof("value") is None:
            return "no asDouble/asInt value"
        value = _number_value(point)
        if not math.isfinite(value):  # not a measurement; it would blank every aggregate
            return f"asDouble is {value!r}, not a finite number"
    if point.time_unix_nano == 0:
        return "timeUnixNano is missing"
    problem = _time_problem("timeUnixNano", point.time_unix_nano, oldest_unix_ns) or _time_problem(
        "startTimeUnixNano", point.start_time_unix_nano, 0
    )
    if problem or kind != "histogram":
        return problem
    if point.bucket_counts and len(point.bucket_counts) != len(point.explicit_bounds) + 1:
        return "bucketCounts must have one more entry than explicitBounds"
    numbers = (
        ("sum", [point.sum]),
        ("min", [point.min]),
        ("max", [point.max]),
        ("explicitBounds", point.explicit_bounds),
    )
    return next(
        (f"{name} is not a finite number" for name, values in numbers if not all(map(math.isfinite, values))), None
    )
