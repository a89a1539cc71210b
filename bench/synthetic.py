"""A large synthetic store for read benchmarks, generated inside ClickHouse.

Filling 10M spans through Python takes hours on a small machine; here every table is filled
by one ``INSERT … SELECT … FROM numbers(N)`` per table, so 10M spans take about a minute.
The data has the shape the server writes:

- ``otel_traces``: ``spans // 10`` traces of 10 spans each (the replay client, the gateway
  SERVER span, tokenize, retrieval, the model-client CLIENT span, the engine SERVER span,
  vLLM's ``llm_request`` with its queue/prefill/decode attributes, and three engine-internal
  spans), a handful of attributes per span, evenly spread over ``[start, start + duration)``;
- ``inferpath_requests``: one row per trace, with log-normal stage times, 2 % errors, two
  endpoint classes (``interactive`` 80 %, ``bulk`` 20 %);
- ``otel_metrics_gauge`` / ``otel_metrics_sum``: one engine (queue depth, running requests,
  KV-cache usage, preemptions counter) and four GPUs (utilization, memory, power) sampled
  every ``sample_seconds``.

Between 55 % and 60 % of the window there is an incident: queue times ×8 and queue depth,
KV usage and preemptions up, so spike detection and the diagnosis have something to find.
Everything is deterministic: values are hash functions of the row number (Box-Muller for
the log-normal stage times), so two fills of the same size hold the same data.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

SPANS_PER_TRACE = 10
INCIDENT = (0.55, 0.60)
"""Fractions of the window holding the incident."""

_TRACE_ID = "lower(leftPad(hex(cityHash64(t, 17)), 16, '0') || leftPad(hex(t), 16, '0'))"
_SPAN_ID = "lower(leftPad(hex(cityHash64(t, k, 29)), 16, '0'))"

# (k, parent k, service, span name, kind, start offset ms, duration ms)
_SPANS: tuple[tuple[int, int, str, str, str, int, int], ...] = (
    (0, -1, "replay-client", "chat llama-2-70b", "Client", 0, 900),
    (1, 0, "gateway", "POST /v1/chat/completions", "Server", 2, 890),
    (2, 1, "gateway", "tokenize", "Internal", 3, 4),
    (3, 1, "gateway", "retrieval", "Internal", 8, 2),
    (4, 1, "gateway", "chat llama-2-70b", "Client", 11, 870),
    (5, 4, "engine", "POST /v1/chat/completions", "Server", 13, 860),
    (6, 5, "engine", "llm_request", "Internal", 14, 850),
    (7, 6, "engine", "queue", "Internal", 14, 30),
    (8, 6, "engine", "prefill", "Internal", 44, 60),
    (9, 6, "engine", "decode", "Internal", 104, 760),
)


def _incident(position: str) -> str:
    """SQL condition: ``position`` (0..1 through the window) is inside the incident."""
    return f"({position} >= {INCIDENT[0]} AND {position} < {INCIDENT[1]})"


def fill(store, *, spans: int, start: datetime, duration: timedelta, sample_seconds: int = 2) -> dict:
    """Fill ``store`` (an open, migrated :class:`~inferpath.storage.store.Store`) and return
    ``{"spans", "requests", "gauge_points", "sum_points", "seconds"}``.

    ``spans`` is rounded down to a multiple of 10; ``start`` must be timezone-aware.
    The tables should be empty (rows are appended, ids restart at 0).
    """
    traces = spans // SPANS_PER_TRACE
    if traces < 1:
        raise ValueError(f"spans must be at least {SPANS_PER_TRACE}, got {spans}")
    started = time.monotonic()
    window_ns = int(duration.total_seconds() * 1e9)
    params = {"start": start, "traces": traces, "window_ns": window_ns}
    # Float spacing: t * window_ns would overflow Int64 past ~100k traces a day.
    t_start_ns = (
        "toUnixTimestamp64Nano({start:DateTime64(9, 'UTC')}) + toInt64(t * ({window_ns:Int64} / {traces:UInt64}))"
    )
    case = (  # noqa: E731
        lambda column: (
            "multiIf("
            + ", ".join(f"k = {spec[0]}, {column(spec)}" for spec in _SPANS[:-1])
            + f", {column(_SPANS[-1])})"
        )
    )
    parent = "multiIf(" + ", ".join(f"k = {k}, {p}" for k, p, *_ in _SPANS) + ", -1)"
    slow = f"if({_incident('t / {traces:UInt64}')}, 8, 1)"
    store.command(
        "INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind,"
        " ServiceName, ResourceAttributes, ScopeName, SpanAttributes, Duration, StatusCode)"
        " SELECT fromUnixTimestamp64Nano(toInt64(ts_ns), 'UTC'), trace_id,"
        f" {_SPAN_ID}, if(pk < 0, '', lower(leftPad(hex(cityHash64(t, pk, 29)), 16, '0'))),"
        f" {case(lambda s: repr(s[3]))}, {case(lambda s: repr(s[4]))}, service,"
        " map('service.name', service, 'host.name', 'node-1', 'service.instance.id', concat(service, '-0')),"
        " 'inferpath',"
        " map('inferpath.endpoint', '/v1/chat/completions', 'inferpath.endpoint_class', klass,"
        "     'gen_ai.request.model', 'llama-2-70b', 'gen_ai.usage.input_tokens', toString(t % 2000 + 20),"
        "     'gen_ai.usage.output_tokens', toString(t % 300 + 10), 'inferpath.stage', 'stage'),"
        " toUInt64(dur_ms * 1000000 * jitter), if(t % 50 = 0 AND k = 1, 'Error', 'Ok')"
        " FROM (SELECT intDiv(number, 10) AS t, number % 10 AS k,"
        f" {parent} AS pk, {_TRACE_ID} AS trace_id,"
        f" {case(lambda s: repr(s[2]))} AS service,"
        " if(t % 5 = 0, 'bulk', 'interactive') AS klass,"
        " 0.5 + (cityHash64(t, 3) % 1000) / 1000 AS jitter,"
        f" {case(lambda s: str(s[6]))} * if(k IN (0, 1, 4, 5, 6, 7), {slow}, 1) AS dur_ms,"
        f" {t_start_ns} + {case(lambda s: str(s[5]))} * 1000000 AS ts_ns"
        " FROM numbers({rows:UInt64}))",
        {**params, "rows": traces * SPANS_PER_TRACE},
    )
    # Stage times in ns, log-normal around the span layout above; the client sees
    # everything plus two network hops.
    # A standard normal from two hashes of the row number (Box-Muller), so that every fill
    # of the same size holds the same values; the salt keeps the stages independent.
    uniform = "((cityHash64(t, {salt}) % 1000000000) + 0.5) / 1e9"
    normal = f"(sqrt(-2 * log({uniform.format(salt='{salt}1')})) * cos(2 * pi() * {uniform.format(salt='{salt}2')}))"
    lognormal = "exp({mu} + {sigma} * " + normal + ")"
    store.command(
        "INSERT INTO inferpath_requests (timestamp, trace_id, service_name, endpoint, endpoint_class,"
        " model, replica, status, http_status_code, input_tokens, output_tokens, client_ttft_ns,"
        " client_e2e_ns, ttft_ns, e2e_ns, itl_ns, gateway_ns, tokenize_ns, retrieval_ns, queue_ns,"
        " prefill_ns, decode_ns, model_ns, network_ns, postprocess_ns, span_count, updated_at)"
        " SELECT ts, trace_id, 'gateway', '/v1/chat/completions', klass, 'llama-2-70b', 'engine-0',"
        " if(t % 50 = 0, 'error', 'ok'), if(t % 50 = 0, 500, 200), toUInt32(t % 2000 + 20),"
        " toUInt32(out_tokens), ttft + 2000000, e2e + 3000000, ttft, e2e, itl, gateway, tokenize,"
        " retrieval, queue, prefill, decode, queue + prefill + decode, network, 300000,"
        f" {SPANS_PER_TRACE}, ts"
        " FROM (SELECT number AS t, " + _TRACE_ID + " AS trace_id,"
        f" fromUnixTimestamp64Nano(toInt64({t_start_ns}), 'UTC') AS ts,"
        " if(t % 5 = 0, 'bulk', 'interactive') AS klass,"
        f" toInt64({lognormal.format(salt=11, mu=15.2, sigma=0.5)}) AS tokenize,"  # ~4 ms
        f" toInt64({lognormal.format(salt=12, mu=14.5, sigma=0.4)}) AS retrieval,"  # ~2 ms
        f" toInt64({lognormal.format(salt=13, mu=16.6, sigma=0.3)}) AS gateway,"  # ~16 ms
        f" toInt64({lognormal.format(salt=14, mu=17.2, sigma=0.7)} * {slow}) AS queue,"  # ~30 ms
        f" toInt64({lognormal.format(salt=15, mu=17.9, sigma=0.3)}) AS prefill,"  # ~60 ms
        f" toInt64({lognormal.format(salt=16, mu=16.8, sigma=0.2)}) AS itl,"  # ~20 ms
        " t % 300 + 10 AS out_tokens, itl * (out_tokens - 1) AS decode,"
        f" toInt64({lognormal.format(salt=17, mu=14.9, sigma=0.5)}) AS network,"  # ~3 ms
        " gateway + tokenize + retrieval + network + queue + prefill AS ttft,"
        " ttft + decode AS e2e"
        " FROM numbers({traces:UInt64}))",
        params,
    )
    samples = max(1, int(duration.total_seconds() // sample_seconds))
    gauge_params = {**params, "samples": samples, "step_ns": sample_seconds * 1_000_000_000}
    sample_time = (
        "fromUnixTimestamp64Nano(toUnixTimestamp64Nano({start:DateTime64(9, 'UTC')})"
        " + toInt64(s) * {step_ns:Int64}, 'UTC')"
    )
    in_incident = _incident("s / {samples:UInt64}")
    engine_attributes = "map('engine', 'vllm', 'model_name', 'llama-2-70b')"
    engine_resource = "map('service.name', 'engine', 'host', 'node-1')"
    gauge_columns = (
        "(ResourceAttributes, ServiceName, MetricName, MetricUnit, Attributes, StartTimeUnix, TimeUnix, Value)"
    )
    store.command(
        f"INSERT INTO otel_metrics_gauge {gauge_columns}"
        f" SELECT {engine_resource}, 'engine', name, unit, {engine_attributes}, ts, ts, value"
        f" FROM (SELECT number AS s, {sample_time} AS ts, {in_incident} AS hot FROM numbers({{samples:UInt64}}))"
        " ARRAY JOIN"
        " ['queue_depth', 'running_requests', 'kv_cache_usage_ratio'] AS name,"
        " ['{request}', '{request}', '1'] AS unit,"
        " [if(hot, 12 + s % 5, s % 3), 24 + s % 8, if(hot, 0.97, 0.35 + (s % 20) / 100)] AS value",
        gauge_params,
    )
    store.command(
        f"INSERT INTO otel_metrics_gauge {gauge_columns}"
        " SELECT map('service.name', 'nvml', 'host', 'node-1'), 'nvml', name, unit,"
        " map('host', 'node-1', 'UUID', concat('GPU-0000000', toString(gpu)), 'gpu', toString(gpu),"
        "     'modelName', 'NVIDIA H100 80GB HBM3'), ts, ts, value"
        f" FROM (SELECT intDiv(number, 4) AS s, number % 4 AS gpu, {sample_time} AS ts,"
        f" {in_incident} AS hot FROM numbers({{samples:UInt64}} * 4))"
        " ARRAY JOIN"
        " ['gpu_utilization_ratio', 'gpu_memory_used_bytes', 'gpu_power_watts'] AS name,"
        " ['1', 'By', 'W'] AS unit,"
        " [0.6 + (s % 30) / 100, if(hot, 79e9, 62e9 + (s % 10) * 1e8), 420 + s % 50] AS value",
        gauge_params,
    )
    store.command(
        "INSERT INTO otel_metrics_sum (ResourceAttributes, ServiceName, MetricName, MetricUnit,"
        " Attributes, StartTimeUnix, TimeUnix, Value)"
        f" SELECT {engine_resource}, 'engine', 'preemptions_total', '{{preemption}}',"
        f" {engine_attributes}, {{start:DateTime64(9, 'UTC')}}, ts,"
        # Cumulative: +1 per sample during the incident.
        f" toFloat64(greatest(0, least(s, intDiv({{samples:UInt64}} * {INCIDENT[1] * 100:.0f}, 100))"
        f" - intDiv({{samples:UInt64}} * {INCIDENT[0] * 100:.0f}, 100)))"
        f" FROM (SELECT number AS s, {sample_time} AS ts FROM numbers({{samples:UInt64}}))",
        gauge_params,
    )
    # Request rows are read with FINAL, whose cost depends on the parts: merge them as a
    # settled store would have. Spans are left as inserted (no query merges them).
    store.command("OPTIMIZE TABLE inferpath_requests FINAL")
    return {
        "spans": traces * SPANS_PER_TRACE,
        "requests": traces,
        "gauge_points": samples * 15,
        "sum_points": samples,
        "seconds": time.monotonic() - started,
    }
