"""Both ways with the OpenTelemetry Collector contrib ClickHouse exporter, on real chDB.

Rows inserted with exactly the exporter's insert column list (its ``traces_insert.sql`` and
``metrics_gauge_insert.sql`` templates) and value spellings are read by inferpath's reader
and request assembly; spans inferpath writes are found by the exporter README's
trace-by-id query, which goes through ``otel_traces_trace_id_ts``.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta, timezone

from otel_exporter_columns import EXPORTER_INSERT_COLUMNS

from inferpath.server.assembler import RequestAssembler
from inferpath.server.otlp import decode_trace_request
from inferpath.storage.reader import Reader
from inferpath.storage.rows import GAUGE_COLUMNS, SPAN_COLUMNS
from inferpath.storage.store import Store

T0 = datetime(2025, 6, 1, 9, 30, 0, 123456, tzinfo=timezone.utc)

EXPORTER_TRACE_INSERT_COLUMNS = tuple(EXPORTER_INSERT_COLUMNS["traces"])
EXPORTER_GAUGE_INSERT_COLUMNS = tuple(EXPORTER_INSERT_COLUMNS["gauge"])
# The exporter README's "find traces with traceID" query, verbatim but for the id.
EXPORTER_TRACE_LOOKUP = """
WITH
    '{trace_id}' as trace_id,
    (SELECT min(Start) FROM otel_traces_trace_id_ts WHERE TraceId = trace_id) as start,
    (SELECT max(End) + 1 FROM otel_traces_trace_id_ts WHERE TraceId = trace_id) as end
SELECT Timestamp as log_time,
       TraceId,
       SpanId,
       ParentSpanId,
       SpanName,
       SpanKind,
       ServiceName,
       Duration,
       StatusCode,
       StatusMessage,
       toString(SpanAttributes),
       toString(ResourceAttributes),
       toString(Events.Name),
       toString(Links.TraceId)
FROM otel_traces
WHERE TraceId = trace_id
  AND Timestamp >= start
  AND Timestamp <= end
Limit 100;
"""


def _exporter_span(
    trace_id: str,
    span_id: str,
    parent: str,
    name: str,
    kind: str,
    start: datetime,
    duration_ns: int,
    attributes: dict[str, str],
    service: str = "gateway",
) -> tuple:
    # Values as the exporter's pushTraceData binds them: hex ids, pdata enum strings,
    # attributes flattened with AsString, events/links as parallel arrays.
    return (
        start,
        trace_id,
        span_id,
        parent,
        "",
        name,
        kind,
        service,
        {"service.name": service, "inferpath.endpoint_class": "interactive"},
        "io.opentelemetry.contrib",
        "1.0",
        attributes,
        duration_ns,
        "Unset",
        "",
        [start + timedelta(milliseconds=3)],
        ["first_token"],
        [{}],
        [],
        [],
        [],
        [],
    )


def test_exporter_column_lists_are_inferpaths() -> None:
    assert SPAN_COLUMNS == EXPORTER_TRACE_INSERT_COLUMNS
    assert GAUGE_COLUMNS == EXPORTER_GAUGE_INSERT_COLUMNS


def test_rows_written_like_the_exporter_are_read_and_assembled(store: Store) -> None:
    trace_id = secrets.token_hex(16)
    gateway, engine = secrets.token_hex(8), secrets.token_hex(8)
    rows = [
        _exporter_span(
            trace_id,
            gateway,
            "",
            "POST /v1/chat/completions",
            "Server",
            T0,
            900_000_000,
            {
                "inferpath.stage": "gateway",
                "http.response.status_code": "200",
                "inferpath.endpoint": "/v1/chat/completions",
                "gen_ai.response.time_to_first_chunk": "0.2",
            },
        ),
        # An older exporter release's spelling of the kind (SPAN_KIND_*), still readable.
        _exporter_span(
            trace_id,
            engine,
            gateway,
            "llm_request",
            "SPAN_KIND_SERVER",
            T0 + timedelta(milliseconds=50),
            800_000_000,
            {
                "gen_ai.latency.time_in_queue": "0.025",
                "gen_ai.latency.time_in_model_prefill": "0.1",
                "gen_ai.latency.time_in_model_decode": "0.6",
                "gen_ai.usage.prompt_tokens": "300",
                "gen_ai.usage.completion_tokens": "61",
            },
            service="vllm",
        ),
    ]
    store.insert("otel_traces", rows, EXPORTER_TRACE_INSERT_COLUMNS)
    spans = Reader(store).trace_spans(trace_id)
    assert [(s.span_name, s.span_kind) for s in spans] == [
        ("POST /v1/chat/completions", "Server"),
        ("llm_request", "Server"),
    ]
    assert spans[0].events[0][1] == "first_token"
    assembler = RequestAssembler(store, settle_seconds=0)
    try:
        assembler.note_trace_ids([trace_id])
        assert assembler.run_once(force=True) == 1
        assert assembler.writer.flush(10)
    finally:
        assembler.stop()
    request = Reader(store).requests(T0 - timedelta(minutes=1), T0 + timedelta(minutes=1))[0]
    assert request["trace_id"] == trace_id
    assert (request["queue_ns"], request["prefill_ns"], request["decode_ns"]) == (25_000_000, 100_000_000, 600_000_000)
    assert request["ttft_ns"] == 200_000_000 and request["e2e_ns"] == 900_000_000
    assert request["output_tokens"] == 61
    summary = {
        m["measure"]: m for m in Reader(store).latency_summary(T0 - timedelta(minutes=1), T0 + timedelta(minutes=1))
    }
    assert summary["queue"]["p50_seconds"] == 0.025


def test_gauges_written_like_the_exporter_are_read(store: Store) -> None:
    rows = [
        (
            {"service.name": "dcgm"},
            "",
            "otelcol/prometheusreceiver",
            "0.1",
            {},
            0,
            "",
            "dcgm",
            "gpu_utilization_ratio",
            "",
            "1",
            {"gpu": "0"},
            datetime(1970, 1, 1, tzinfo=timezone.utc),
            T0 + timedelta(seconds=i),
            value,
            0,
            [],
            [],
            [],
            [],
            [],
        )
        for i, value in enumerate((0.5, 0.7))
    ]
    store.insert("otel_metrics_gauge", rows, EXPORTER_GAUGE_INSERT_COLUMNS)
    points = Reader(store).gauge_timeseries(
        "gpu_utilization_ratio", T0 - timedelta(seconds=1), T0 + timedelta(seconds=59), step_seconds=60
    )
    assert [(p["service_name"], p["attributes"], p["value"]) for p in points] == [("dcgm", {"gpu": "0"}, 0.6)]


def test_spans_inferpath_writes_are_found_by_the_exporters_trace_lookup(store: Store, shared_data) -> None:
    capture = sorted((shared_data / "vllm_live_capture" / "startup_otlp").glob("*.pb"))
    spans = [
        span
        for path in capture
        for span in decode_trace_request(
            path.read_bytes(), content_type="application/x-protobuf", content_encoding=None
        ).spans
    ]
    store.insert("otel_traces", [s.to_insert_row() for s in spans], SPAN_COLUMNS)
    trace_id = "0af7651916cd43dd8448eb211c80319c"  # the traceparent the start-up capture's clients sent
    found = store.query(EXPORTER_TRACE_LOOKUP.replace("{trace_id}", trace_id))
    expected = sorted(s.span_id for s in spans if s.trace_id == trace_id)
    assert sorted(row[2] for row in found) == expected and len(expected) == 3
    for row in found:
        assert row[1] == trace_id and row[4] == "llm_request" and row[5] == "Server"
        assert "gen_ai.latency.time_in_queue" in row[10]
    # The lookup table holds the trace's bounds (per insert block, min/max across rows).
    start, end = store.query(
        "SELECT min(Start), max(End) FROM otel_traces_trace_id_ts WHERE TraceId = {t:String}", {"t": trace_id}
    )[0]
    assert start <= min(row[0] for row in found) and max(row[0] for row in found) < end + timedelta(seconds=1)
