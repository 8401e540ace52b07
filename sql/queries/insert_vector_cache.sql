-- The staged batch into the vector cache; a text already cached for the model keeps its row.
INSERT INTO corpusync.vector_cache (model_id, text_sha256, dense, sparse)
SELECT model_id, text_sha256, dense, sparse FROM pg_temp.vector_cache_stage
ON CONFLICT (model_id, text_sha256) DO NOTHING
