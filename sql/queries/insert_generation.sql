INSERT INTO corpusync.generations (generation, run_id, model_id) VALUES (%(generation)s, %(run_id)s, %(model_id)s)
