-- The rollup refresher asks every pass (10 s) which minutes hold request rows updated since
-- its watermark. Rows are written in time order, so a min-max index on updated_at lets that
-- query skip every granule written before the watermark instead of reading the column of
-- the whole table. MATERIALIZE builds it for existing parts in the background.
-- Placeholders: {database} (validated identifier).

ALTER TABLE `{database}`.inferpath_requests ADD INDEX IF NOT EXISTS idx_updated_at updated_at TYPE minmax GRANULARITY 1;
ALTER TABLE `{database}`.inferpath_requests MATERIALIZE INDEX idx_updated_at;
