-- Per-minute rollup of inferpath_requests, for reads over wide windows (hours to days):
-- per (minute, endpoint class, endpoint, status) the request count and, per measure, the
-- number of rows that measured it, their sum (ns) and a DDSketch of the values
-- (quantilesDD with 0.5 % relative accuracy: any quantile read from a merge of minutes is
-- within 0.5 % of a value of that rank). Measures: every *_ns duration of the request row,
-- plus ttft_best / e2e_best = the client's value when measured, else the gateway's.
--
-- The server's rollup refresher (storage/rollup.py) rebuilds every minute that holds a
-- request row updated since its last pass, from inferpath_requests FINAL; a rebuilt minute
-- is a new row with a later rolled_at, and ReplacingMergeTree keeps the latest, so readers
-- select with FINAL. inferpath_rollup_state holds the refresher's watermark: every request
-- row updated before it is reflected here. Both are derived data: dropping them loses
-- nothing, the next pass rebuilds them.
-- Placeholders: {database} (validated identifier), {ttl_days} (validated positive integer).

CREATE TABLE IF NOT EXISTS `{database}`.inferpath_requests_1m (
    minute DateTime('UTC') CODEC(Delta, ZSTD(1)),
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
PARTITION BY toDate(minute)
ORDER BY (minute, endpoint_class, endpoint, status)
TTL minute + toIntervalDay({ttl_days})
SETTINGS index_granularity = 8192;

CREATE TABLE IF NOT EXISTS `{database}`.inferpath_rollup_state (
    name LowCardinality(String),
    watermark DateTime64(9, 'UTC'),
    updated_at DateTime64(9, 'UTC')
) ENGINE = ReplacingMergeTree(updated_at)
ORDER BY name
TTL toDateTime(updated_at) + toIntervalDay({ttl_days});
