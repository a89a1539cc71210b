"""The OpenTelemetry Collector contrib ClickHouse exporter's insert column lists, written out
here independently of inferpath's own column tuples (``inferpath.storage.rows``), for the
tests that hold the two equal: opentelemetry-collector-contrib,
``exporter/clickhouseexporter/internal/sqltemplates/traces_insert.sql`` and
``internal/sql_templates/metrics_{gauge,sum,histogram}_insert.sql``."""

from __future__ import annotations

_METRIC_HEAD = [
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
]
_EXEMPLARS = [
    "Exemplars.FilteredAttributes",
    "Exemplars.TimeUnix",
    "Exemplars.Value",
    "Exemplars.SpanId",
    "Exemplars.TraceId",
]
EXPORTER_INSERT_COLUMNS = {
    "traces": [
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
    ],
    "gauge": _METRIC_HEAD + ["Value", "Flags"] + _EXEMPLARS,
    "sum": _METRIC_HEAD + ["Value", "Flags"] + _EXEMPLARS + ["AggregationTemporality", "IsMonotonic"],
    "histogram": _METRIC_HEAD
    + ["Count", "Sum", "BucketCounts", "ExplicitBounds"]
    + _EXEMPLARS
    + ["Flags", "Min", "Max", "AggregationTemporality"],
}
