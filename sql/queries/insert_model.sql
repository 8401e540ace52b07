INSERT INTO corpusync.embedding_models (identity_hash, name, revision, weights_sha256, dimension, pooling,
                                        normalized, sparse_trained, sparse_dim, max_tokens)
VALUES (%(identity_hash)s, %(name)s, %(revision)s, %(weights_sha256)s, %(dimension)s, %(pooling)s,
        %(normalized)s, %(sparse_trained)s, %(sparse_dim)s, %(max_tokens)s)
ON CONFLICT (identity_hash) DO UPDATE SET max_tokens = EXCLUDED.max_tokens
RETURNING id
