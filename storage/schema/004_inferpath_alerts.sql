-- Alert state changes written by the alert evaluator (alerts/evaluator.py): one row each time
-- an alert instance becomes pending, firing, resolved or inactive (a pending alert whose
-- condition stopped before `for` elapsed), or starts its keep_firing_for grace period. The
-- latest row per fingerprint is the alert's state; the evaluator restores pending and firing
-- alerts from it after a restart, so a restart neither re-notifies nor forgets.
-- Placeholders: {database} (validated identifier), {ttl_days} (validated positive integer).

CREATE TABLE IF NOT EXISTS `{database}`.inferpath_alerts (
    timestamp DateTime64(9, 'UTC') CODEC(Delta, ZSTD(1)),
    rule LowCardinality(String),
    fingerprint String CODEC(ZSTD(1)),
    state LowCardinality(String),
    labels Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    annotations Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    value Nullable(Float64),
    active_at DateTime64(9, 'UTC'),
    fired_at Nullable(DateTime64(9, 'UTC')),
    resolved_at Nullable(DateTime64(9, 'UTC')),
    keep_firing_since Nullable(DateTime64(9, 'UTC')),
    evidence String CODEC(ZSTD(1))
) ENGINE = MergeTree()
PARTITION BY toDate(timestamp)
ORDER BY (rule, fingerprint, timestamp)
TTL toDateTime(timestamp) + toIntervalDay({ttl_days})
SETTINGS index_granularity = 8192;
