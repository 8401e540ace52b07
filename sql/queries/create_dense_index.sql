-- One partial HNSW index per embedding model (dimensions differ between models).
CREATE INDEX IF NOT EXISTS {index_name} ON corpusync.chunks
USING hnsw ((dense::halfvec({dim})) halfvec_cosine_ops) WHERE model_id = {model_id}
