-- Per-minute rollup of hop overheads, for the Breakdown page over wide windows (hours to
-- days): per (minute of the caller's CLIENT span start, caller service, callee service,
-- callee SERVER span name) the number of (client span, server span) pairs of the same call,
-- the integer sum of their overheads (client duration - server duration, ns; negative under
-- clock skew) and a DDSketch of them (quantilesDD with 0.5 % relative accuracy, the request
-- rollups' sketch: a quantile read from a merge of minutes is within 0.5 % of a value of
-- that rank).
--
-- The server's rollup refresher (storage/hop_rollup.py) rebuilds every minute holding a
-- span of a trace whose request row was updated since its last pass (late spans re-derive
-- the row), with its own watermark in inferpath_rollup_state; a rebuilt minute is written
-- with a later rolled_at and readers keep each minute's latest rebuild only. Derived data:
-- dropping it loses nothing, the next pass after a watermark reset rebuilds it.
-- Placeholders: {database} (validated identifier), {ttl_days} (validated positive integer).

CREATE TABLE IF NOT EXISTS `{database}`.inferpath_hops_1m (
    minute DateTime('UTC') CODEC(Delta, ZSTD(1)),
    caller_service LowCardinality(String),
    callee_service LowCardinality(String),
    callee_span LowCardinality(String),
    calls UInt64,
    overhead_sum_ns Int64,
    overhead_q AggregateFunction(quantilesDD(0.005, 0.5, 0.9, 0.95, 0.99), Int64),
    rolled_at DateTime64(9, 'UTC')
) ENGINE = ReplacingMergeTree(rolled_at)
PARTITION BY toDate(minute)
ORDER BY (minute, caller_service, callee_service, callee_span)
TTL minute + toIntervalDay({ttl_days})
SETTINGS index_granularity = 8192;
