-- Insert deduplication for the tables that OTLP exports land in: the receiver gives each
-- export's insert an insert_deduplication_token derived from the body, so a client that
-- retries an export whose insert committed (the 200 was lost, e.g. the server was killed
-- between commit and answer) stores nothing twice. Replicated tables deduplicate by
-- default (replicated_deduplication_window); plain MergeTree needs this window (number
-- of recent insert blocks whose tokens are remembered, on disk, across restarts).

ALTER TABLE `{database}`.otel_traces MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE `{database}`.otel_metrics_gauge MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE `{database}`.otel_metrics_sum MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE `{database}`.otel_metrics_histogram MODIFY SETTING non_replicated_deduplication_window = 10000;
