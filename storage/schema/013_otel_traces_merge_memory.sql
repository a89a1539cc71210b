-- Merges of otel_traces write wide parts: one compressed stream per column, Map key/value
-- and Nested subcolumn, each with a buffer of max_compress_block_size (1 MiB by default).
-- With this table's ~40 streams a merge held ~200 MB (system.merges memory_usage, 120k-row
-- merges of 20k-row inserts on embedded chDB), the server's largest and most variable
-- share of memory under a steady OTLP load. 256 KiB blocks cut that to ~100 MB; a granule
-- of spans (8192 rows) still spans several blocks, so compression is barely affected.
-- Placeholders: {database} (validated identifier).

ALTER TABLE `{database}`.otel_traces MODIFY SETTING max_compress_block_size = 262144;
