-- The TTFT-phase parts of the gateway's self time and of the network overhead
-- (docs/telemetry-contract.md): gateway_ns and network_ns are measured over the whole call,
-- so for a streamed response most of them fall after the first token; the TTFT breakdown
-- reads these instead. Rows written before this migration hold NULL here, and the breakdown
-- falls back to the whole-call column for them (an upper bound, as before).
-- AFTER keeps the table's column order equal to rows.REQUEST_COLUMNS.
-- Placeholders: {database} (validated identifier).

ALTER TABLE `{database}`.inferpath_requests ADD COLUMN IF NOT EXISTS gateway_ttft_ns Nullable(Int64) AFTER postprocess_ns;
ALTER TABLE `{database}`.inferpath_requests ADD COLUMN IF NOT EXISTS network_ttft_ns Nullable(Int64) AFTER gateway_ttft_ns;
