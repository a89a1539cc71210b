-- Hourly tier of the request rollup: the same columns as inferpath_requests_1m, one row per
-- (hour, endpoint class, endpoint, status), built by the refresher from the hour's minute
-- rows (quantilesDDMergeState) in the same pass that rebuilt them. A day-long read merges
-- 24 of these instead of 1440 minute rows.
-- Placeholders: {database} (validated identifier), {ttl_days} (validated positive integer).

CREATE TABLE IF NOT EXISTS `{database}`.inferpath_requests_1h (
    hour DateTime('UTC') CODEC(Delta, ZSTD(1)),
    endpoint_class LowCardinality(String),
    endpoint LowCardinality(String),
    status LowCardinality(String),
    requests UInt64,
    client_ttft_count UInt64,
    client_ttft_sum_ns Float64,
    client_ttft_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    client_e2e_count UInt64,
    client_e2e_sum_ns Float64,
    client_e2e_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    ttft_count UInt64,
    ttft_sum_ns Float64,
    ttft_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    e2e_count UInt64,
    e2e_sum_ns Float64,
    e2e_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    itl_count UInt64,
    itl_sum_ns Float64,
    itl_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    gateway_count UInt64,
    gateway_sum_ns Float64,
    gateway_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    tokenize_count UInt64,
    tokenize_sum_ns Float64,
    tokenize_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    retrieval_count UInt64,
    retrieval_sum_ns Float64,
    retrieval_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    queue_count UInt64,
    queue_sum_ns Float64,
    queue_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    prefill_count UInt64,
    prefill_sum_ns Float64,
    prefill_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    decode_count UInt64,
    decode_sum_ns Float64,
    decode_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    model_count UInt64,
    model_sum_ns Float64,
    model_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    network_count UInt64,
    network_sum_ns Float64,
    network_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    postprocess_count UInt64,
    postprocess_sum_ns Float64,
    postprocess_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    ttft_best_count UInt64,
    ttft_best_sum_ns Float64,
    ttft_best_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    e2e_best_count UInt64,
    e2e_best_sum_ns Float64,
    e2e_best_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    rolled_at DateTime64(9, 'UTC')
) ENGINE = ReplacingMergeTree(rolled_at)
PARTITION BY toYYYYMM(hour)
ORDER BY (hour, endpoint_class, endpoint, status)
TTL hour + toIntervalDay({ttl_days})
SETTINGS index_granularity = 8192;
