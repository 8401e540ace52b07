-- The embedding model and status of one generation (for a search pinned to it).
SELECT g.generation AS published_generation, g.status, g.model_id, m.identity_hash, m.name AS model_name,
       m.dimension, m.sparse_trained, m.sparse_dim
FROM corpusync.generations g
JOIN corpusync.embedding_models m ON m.id = g.model_id
WHERE g.generation = %(generation)s
