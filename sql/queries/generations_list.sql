-- Recent generations with their status (db status): which can be searched with --generation N.
SELECT g.generation, g.status, g.run_id, g.created_at, g.published_at, m.name AS model_name
FROM corpusync.generations g
JOIN corpusync.embedding_models m ON m.id = g.model_id
ORDER BY g.generation DESC
LIMIT 10
