-- Per-minute rollup of gauge samples, for the signal reads of wide windows (hours to days):
-- per (metric, minute, series) the time and value of the series' latest sample in that
-- minute, and its minimum and maximum value. A series is (ServiceName, ResourceAttributes,
-- Attributes), as the readers tell series apart. A day of 2-second samples of 15 series
-- is 648k rows in otel_metrics_gauge and 21.6k here.
--
-- The latest sample of every series as of a minute's end is exactly what aligning a gauge
-- on a grid of whole minutes needs (analysis/timeline_query.py), so those reads give the
-- same values from the rollup as from the samples. A materialized view fills it on every
-- insert: gauge samples are never re-derived (unlike request rows), and every kept
-- aggregate (max, argMax, min) is unchanged by a sample stored twice, so a retried insert
-- or the one-time backfill of samples stored before this view existed
-- (storage/gauge_rollup.py) cannot make it wrong. Derived data: dropping it loses nothing.
-- Placeholders: {database} (validated identifier), {ttl_days} (validated positive integer).

CREATE TABLE IF NOT EXISTS `{database}`.otel_metrics_gauge_1m (
    MetricName LowCardinality(String) CODEC(ZSTD(1)),
    Minute DateTime('UTC') CODEC(Delta, ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Attributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    LastTimeNs SimpleAggregateFunction(max, Int64),
    LastValue AggregateFunction(argMax, Float64, Int64),
    MinValue SimpleAggregateFunction(min, Float64),
    MaxValue SimpleAggregateFunction(max, Float64)
) ENGINE = AggregatingMergeTree()
PARTITION BY toDate(Minute)
ORDER BY (MetricName, Minute, ServiceName, ResourceAttributes, Attributes)
TTL Minute + toIntervalDay({ttl_days})
SETTINGS index_granularity = 8192;

CREATE MATERIALIZED VIEW IF NOT EXISTS `{database}`.otel_metrics_gauge_1m_mv
TO `{database}`.otel_metrics_gauge_1m
AS SELECT
    MetricName,
    toDateTime(intDiv(toUnixTimestamp64Nano(TimeUnix), 60000000000) * 60, 'UTC') AS Minute,
    ServiceName,
    ResourceAttributes,
    Attributes,
    max(toUnixTimestamp64Nano(TimeUnix)) AS LastTimeNs,
    argMaxState(Value, toUnixTimestamp64Nano(TimeUnix)) AS LastValue,
    min(Value) AS MinValue,
    max(Value) AS MaxValue
FROM `{database}`.otel_metrics_gauge
GROUP BY MetricName, Minute, ServiceName, ResourceAttributes, Attributes;
