"""Start-up repair of derived rows that a killed process can leave missing.

ClickHouse writes an insert's block to ``otel_traces`` and then, as a separate step, runs
the materialized view that fills ``otel_traces_trace_id_ts`` (a trace's time bounds, which
every trace lookup reads first, as the Collector exporter's documented query does). A
process killed between the two (the embedded store lives inside the server process) keeps
the spans but not their bounds, and a client's retry cannot fix it: the retried insert is
recognized as already committed and skipped, and with it the view. The trace then exists
but is never found. :func:`repair_trace_id_index` re-derives the missing bounds.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

__all__ = ["repair_trace_id_index"]


def repair_trace_id_index(store, *, window_seconds: float = 3600.0, now: datetime | None = None) -> int:
    """Insert ``otel_traces_trace_id_ts`` rows for traces with spans started in the last
    ``window_seconds`` whose stored bounds are missing or narrower than their spans.

    Returns the number of traces repaired. Extra bound rows are harmless (readers take
    ``min(Start)``/``max(End)`` per trace). Driver errors propagate.
    """
    since = (now or datetime.now(timezone.utc)) - timedelta(seconds=window_seconds)
    # Bounds are whole seconds (DateTime); a trace's index rows may start a day earlier.
    sql_spans = (
        "SELECT TraceId, min(Timestamp) AS first, max(Timestamp) AS last FROM otel_traces"
        " WHERE Timestamp >= {since:DateTime64(9, 'UTC')} AND TraceId != '' GROUP BY TraceId"
    )
    sql_index = (
        "SELECT TraceId, min(Start) AS indexed_first, max(End) AS indexed_last"
        " FROM otel_traces_trace_id_ts WHERE Start >= {index_since:DateTime('UTC')} GROUP BY TraceId"
    )
    missing = (
        f"SELECT s.TraceId, s.first, s.last FROM ({sql_spans}) AS s LEFT JOIN ({sql_index}) AS i"
        " ON i.TraceId = s.TraceId"
        " WHERE i.TraceId = '' OR i.indexed_first > toDateTime(s.first) OR i.indexed_last < toDateTime(s.last)"
    )
    params = {"since": since, "index_since": since - timedelta(days=1)}
    count = int(store.query(f"SELECT count() FROM ({missing})", params)[0][0])
    if count:
        store.command(
            "INSERT INTO otel_traces_trace_id_ts (TraceId, Start, End)"
            f" SELECT TraceId, toDateTime(first), toDateTime(last) FROM ({missing})",
            params,
        )
    return count
