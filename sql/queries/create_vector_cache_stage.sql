-- The session's staging table for vector-cache writes (emptied at every commit): a batch is COPYed here,
-- then inserted with ON CONFLICT DO NOTHING (COPY itself cannot skip rows that are already cached).
CREATE TEMP TABLE IF NOT EXISTS vector_cache_stage (
    model_id     integer NOT NULL,
    text_sha256  text NOT NULL,
    dense        halfvec NOT NULL,
    sparse       sparsevec
) ON COMMIT DELETE ROWS
