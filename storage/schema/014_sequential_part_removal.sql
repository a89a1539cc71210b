-- Outdated parts (merged away) are removed sequentially. By default a MergeTree table with
-- at least concurrent_part_removal_threshold (100) outdated parts removes them on a pool of
-- up to max_parts_cleaning_thread_pool_size (128) threads, taken from the global thread
-- pool, which keeps them once idle (max_thread_pool_free_size is 1000, and embedded chDB
-- fixes its pool at start). Under a steady OTLP load, inserts every ~0.5 s leave hundreds
-- of outdated parts between cleanups: in the 20k spans/s soak of bench/server_soak.py each
-- such cleanup added 35-90 idle threads to the embedded store (57 -> 146 -> 181 threads in
-- 6 minutes), and the server's resident set grew with them. Sequential removal deletes the
-- same parts, on the cleanup thread.
-- Placeholders: {database} (validated identifier).

ALTER TABLE `{database}`.otel_traces MODIFY SETTING concurrent_part_removal_threshold = 1000000;
ALTER TABLE `{database}`.otel_traces_trace_id_ts MODIFY SETTING concurrent_part_removal_threshold = 1000000;
ALTER TABLE `{database}`.otel_metrics_gauge MODIFY SETTING concurrent_part_removal_threshold = 1000000;
ALTER TABLE `{database}`.otel_metrics_sum MODIFY SETTING concurrent_part_removal_threshold = 1000000;
ALTER TABLE `{database}`.otel_metrics_histogram MODIFY SETTING concurrent_part_removal_threshold = 1000000;
ALTER TABLE `{database}`.otel_metrics_gauge_1m MODIFY SETTING concurrent_part_removal_threshold = 1000000;
ALTER TABLE `{database}`.inferpath_requests MODIFY SETTING concurrent_part_removal_threshold = 1000000;
ALTER TABLE `{database}`.inferpath_requests_1m MODIFY SETTING concurrent_part_removal_threshold = 1000000;
ALTER TABLE `{database}`.inferpath_requests_1h MODIFY SETTING concurrent_part_removal_threshold = 1000000;
ALTER TABLE `{database}`.inferpath_hops_1m MODIFY SETTING concurrent_part_removal_threshold = 1000000;
ALTER TABLE `{database}`.inferpath_alerts MODIFY SETTING concurrent_part_removal_threshold = 1000000;
ALTER TABLE `{database}`.inferpath_rollup_state MODIFY SETTING concurrent_part_removal_threshold = 1000000;
