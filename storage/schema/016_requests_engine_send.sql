-- The trip out of the hop into the engine (docs/telemetry-contract.md): from the start of the
-- CLIENT span that called the engine to the start of the engine's request span, in ns. It
-- holds the wire, anything that held the call in front of the engine (a client connection
-- pool, a concurrency limit, a proxy) and the engine's server before its span; the
-- diagnosis reads it to tell a queue in front of the engine from a late read on the way back.
-- Rows stored before this migration, and traces without such a hop, hold NULL.
-- AFTER keeps the table's column order equal to rows.REQUEST_COLUMNS.
-- Placeholders: {database} (validated identifier).

ALTER TABLE `{database}`.inferpath_requests ADD COLUMN IF NOT EXISTS engine_send_ns Nullable(Int64) AFTER missing_measures;
