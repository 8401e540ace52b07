SELECT id FROM corpusync.embedding_models WHERE identity_hash = %(identity_hash)s
