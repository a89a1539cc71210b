-- Where a request row's TTFT came from, and why a measure is missing (docs/interop.md,
-- server/sources.py): ttft_source names the source of the TTFT readers show
-- (client_ttft_ns, else ttft_ns), e.g. 'inferpath', 'engine', 'openllmetry.chunk_events';
-- missing_measures holds "measure: reason" entries joined by "; " (e.g. "ttft:
-- opentelemetry-instrumentation-openai-v2 (util-genai) records no per-chunk timing; ...").
-- Rows stored before this migration hold '' in both.
-- AFTER keeps the table's column order equal to rows.REQUEST_COLUMNS.
-- Placeholders: {database} (validated identifier).

ALTER TABLE `{database}`.inferpath_requests ADD COLUMN IF NOT EXISTS ttft_source LowCardinality(String) AFTER network_ttft_ns;
ALTER TABLE `{database}`.inferpath_requests ADD COLUMN IF NOT EXISTS missing_measures LowCardinality(String) AFTER ttft_source;
