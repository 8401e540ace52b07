CREATE INDEX IF NOT EXISTS {index_name} ON corpusync.chunks
USING hnsw ((sparse::sparsevec({dim})) sparsevec_ip_ops) WHERE model_id = {model_id} AND sparse IS NOT NULL
