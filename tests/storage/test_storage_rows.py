"""Row dataclasses: validation, clocks, and a round trip of real vLLM OTLP spans."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from inferpath.storage.reader import Reader
from inferpath.storage.rows import (
    REQUEST_COLUMNS,
    SPAN_COLUMNS,
    RequestRow,
    SpanRow,
    datetime_from_unix_ns,
    span_kind_name,
    status_code_name,
    unix_ns_from_datetime,
)
from inferpath.storage.store import Store

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def _any_value_text(value) -> str:
    # The exporter stores attribute values as their string form.
    kind = value.WhichOneof("value")
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    return str(getattr(value, kind)) if kind else ""


def _spans_from_otlp(body: bytes) -> list[SpanRow]:
    request = ExportTraceServiceRequest.FromString(body)
    rows = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _any_value_text(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                rows.append(
                    SpanRow(
                        timestamp=datetime_from_unix_ns(span.start_time_unix_nano),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        trace_state=span.trace_state,
                        span_name=span.name,
                        span_kind=span_kind_name(span.kind),
                        service_name=resource.get("service.name", ""),
                        resource_attributes=resource,
                        scope_name=scope_spans.scope.name,
                        scope_version=scope_spans.scope.version,
                        span_attributes={kv.key: _any_value_text(kv.value) for kv in span.attributes},
                        duration_ns=span.end_time_unix_nano - span.start_time_unix_nano,
                        status_code=status_code_name(span.status.code),
                        status_message=span.status.message,
                    )
                )
    return rows


def test_unix_ns_conversions_are_exact_to_the_microsecond() -> None:
    ns = 1_796_037_503_452_302_592
    assert unix_ns_from_datetime(datetime_from_unix_ns(ns)) == ns // 1000 * 1000
    assert unix_ns_from_datetime(T0) == 1_735_732_800 * 10**9
    span = SpanRow(T0, "a" * 32, "b" * 16, duration_ns=7)
    assert (span.start_ns, span.end_ns, span.is_root) == (1_735_732_800 * 10**9, 1_735_732_800 * 10**9 + 7, True)
    # Other zones and datetime subclasses take the checked path; naive values are refused.
    assert unix_ns_from_datetime(T0.astimezone(timezone(timedelta(hours=-8)))) == 1_735_732_800 * 10**9
    assert unix_ns_from_datetime(_DatetimeSubclass(2025, 1, 1, 12, tzinfo=timezone.utc)) == 1_735_732_800 * 10**9
    with pytest.raises(ValueError, match="timezone-aware"):
        unix_ns_from_datetime(datetime(2025, 1, 1, 12))
    with pytest.raises(ValueError, match="must be a datetime"):
        unix_ns_from_datetime("2025-01-01T12:00:00Z")  # type: ignore[arg-type]


class _DatetimeSubclass(datetime):
    """A datetime subclass, as pandas' Timestamp is."""


def test_timestamp_in_another_zone_is_stored_as_utc() -> None:
    berlin_noon = T0.astimezone(timezone(timedelta(hours=1)))
    assert SpanRow(berlin_noon, "a" * 32, "b" * 16).timestamp.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("trace_id", "A" * 32, "trace_id"),
        ("trace_id", "a" * 31, "trace_id"),
        ("span_id", "zz" * 8, "span_id"),
        ("parent_span_id", "123", "parent_span_id"),
        ("duration_ns", -1, "duration_ns"),
        ("duration_ns", 1.5, "duration_ns"),
        ("timestamp", datetime(2025, 1, 1), "timezone-aware"),
    ],
)
def test_span_row_validation_names_the_field(field: str, value, message: str) -> None:
    values = dict(timestamp=T0, trace_id="a" * 32, span_id="b" * 16)
    values[field] = value
    with pytest.raises(ValueError, match=message):
        SpanRow(**values)


def test_enum_names_and_legacy_strings() -> None:
    assert [span_kind_name(k) for k in range(7)] == [
        "Unspecified",
        "Internal",
        "Server",
        "Client",
        "Producer",
        "Consumer",
        "Unspecified",
    ]
    assert [status_code_name(c) for c in range(4)] == ["Unset", "Ok", "Error", "Unset"]
    legacy = list(SpanRow(T0, "a" * 32, "b" * 16).to_insert_row())
    legacy[SPAN_COLUMNS.index("SpanKind")] = "SPAN_KIND_CLIENT"
    legacy[SPAN_COLUMNS.index("StatusCode")] = "STATUS_CODE_ERROR"
    row = SpanRow.from_db_row(legacy)
    assert (row.span_kind, row.status_code) == ("Client", "Error")


def test_request_row_round_trip(store: Store) -> None:
    row = RequestRow(
        T0,
        secrets.token_hex(16),
        endpoint="/v1/chat/completions",
        endpoint_class="interactive",
        status="ok",
        http_status_code=200,
        input_tokens=389,
        output_tokens=21,
        ttft_ns=66_268_920,
        e2e_ns=306_124_448,
        queue_ns=12_418,
        span_count=4,
    )
    assert len(row.to_insert_row()) == len(REQUEST_COLUMNS)
    store.insert("inferpath_requests", [row.to_insert_row()], REQUEST_COLUMNS)
    back = store.query(f"SELECT {', '.join(REQUEST_COLUMNS)} FROM inferpath_requests FINAL")
    assert [RequestRow.from_db_row(r) for r in back] == [row]
    with pytest.raises(ValueError, match="updated_at"):
        RequestRow(T0, "a" * 32, updated_at=datetime(2025, 1, 1))


def test_real_vllm_spans_round_trip(store: Store, shared_data: Path) -> None:
    capture = shared_data / "vllm_live_capture"
    spans = [s for f in sorted((capture / "otlp").glob("*.pb")) for s in _spans_from_otlp(f.read_bytes())]
    startup = [s for f in sorted((capture / "startup_otlp").glob("*.pb")) for s in _spans_from_otlp(f.read_bytes())]
    requests = [s for s in spans if s.span_name == "llm_request"]
    assert len(requests) > 100 and all(s.span_kind == "Server" for s in requests)
    store.insert("otel_traces", [s.to_insert_row() for s in spans + startup], SPAN_COLUMNS)

    assert store.query("SELECT count() FROM otel_traces")[0][0] == len(spans) + len(startup)
    reader = Reader(store)
    sample = requests[len(requests) // 2]
    expected = sorted((s for s in spans if s.trace_id == sample.trace_id), key=lambda s: (s.timestamp, s.span_id))
    assert reader.trace_spans(sample.trace_id) == expected
    assert float(sample.span_attributes["gen_ai.latency.e2e"]) > 0
    assert sample.resource_attributes["service.name"] == "vllm-tiny"

    # The three requests that carried a W3C traceparent kept its trace id and parent.
    propagated = reader.trace_spans("0AF7651916CD43DD8448EB211C80319C")
    assert len(propagated) == 3
    assert {s.parent_span_id for s in propagated} == {"b7ad6b7169203331"}

    # vLLM's start-up trace: one root ('Overall Loading') enclosing its children.
    loading = reader.trace_spans(next(s.trace_id for s in startup if s.span_name == "Overall Loading"))
    roots = [s for s in loading if s.is_root]
    assert [r.span_name for r in roots] == ["Overall Loading"]
    assert all(roots[0].start_ns <= s.start_ns and s.end_ns <= roots[0].end_ns + 1000 for s in loading)
