-- One row per trace (request), derived by the server's request assembler from the spans
-- of that trace (docs/telemetry-contract.md). The assembler re-derives and re-inserts the
-- row whenever late spans change it; ReplacingMergeTree keeps the row with the greatest
-- updated_at, so readers select with FINAL. Every duration is in nanoseconds; NULL means
-- "not measured in this trace", never zero.
-- Placeholders: {database} (validated identifier), {ttl_days} (validated positive integer).

CREATE TABLE IF NOT EXISTS `{database}`.inferpath_requests (
    timestamp DateTime64(9, 'UTC') CODEC(Delta, ZSTD(1)),
    trace_id String CODEC(ZSTD(1)),
    service_name LowCardinality(String),
    endpoint LowCardinality(String),
    endpoint_class LowCardinality(String),
    model LowCardinality(String),
    model_version LowCardinality(String),
    replica LowCardinality(String),
    status LowCardinality(String),
    http_status_code Int32,
    input_tokens Nullable(UInt32),
    output_tokens Nullable(UInt32),
    client_ttft_ns Nullable(Int64),
    client_e2e_ns Nullable(Int64),
    ttft_ns Nullable(Int64),
    e2e_ns Nullable(Int64),
    itl_ns Nullable(Int64),
    gateway_ns Nullable(Int64),
    tokenize_ns Nullable(Int64),
    retrieval_ns Nullable(Int64),
    queue_ns Nullable(Int64),
    prefill_ns Nullable(Int64),
    decode_ns Nullable(Int64),
    model_ns Nullable(Int64),
    network_ns Nullable(Int64),
    postprocess_ns Nullable(Int64),
    span_count UInt32,
    updated_at DateTime64(9, 'UTC') CODEC(Delta, ZSTD(1)),
    INDEX idx_timestamp timestamp TYPE minmax GRANULARITY 1
) ENGINE = ReplacingMergeTree(updated_at)
-- Hourly partitions: rows are ordered by trace_id (the replacing key), so a time-window read
-- cannot skip granules inside a partition; an hour's partition is what a query of the last
-- hour reads with FINAL, instead of the whole day. (A row re-derived with an earlier
-- timestamp in the previous hour leaves its old version there: readers FINAL-merge inside
-- partitions only, see storage/README.md.)
PARTITION BY toStartOfHour(timestamp)
ORDER BY trace_id
TTL toDateTime(timestamp) + toIntervalDay({ttl_days})
SETTINGS index_granularity = 8192;
