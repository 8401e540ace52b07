COPY pg_temp.vector_cache_stage (model_id, text_sha256, dense, sparse) FROM STDIN WITH (FORMAT BINARY)
