-- The chunks of one generation with their lineage columns, for the Parquet export (corpusync.analytics);
-- columns: the chunks_at columns as psycopg.sql.Identifier("x", name).
SELECT {columns} FROM corpusync.chunks_at(%(generation)s) x ORDER BY x.source_path, x.ordinal, x.chunk_id
