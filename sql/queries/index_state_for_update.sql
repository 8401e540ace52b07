SELECT published_generation, model_id FROM corpusync.index_state FOR UPDATE
