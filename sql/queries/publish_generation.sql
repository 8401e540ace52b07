UPDATE corpusync.index_state SET published_generation = %(generation)s, model_id = %(model_id)s, updated_at = now()
