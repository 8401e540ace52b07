SELECT s.published_generation, s.model_id, s.updated_at, m.identity_hash, m.name AS model_name,
       m.dimension, m.sparse_trained, m.sparse_dim, m.revision, m.weights_sha256, m.pooling
FROM corpusync.index_state s
LEFT JOIN corpusync.embedding_models m ON m.id = s.model_id
