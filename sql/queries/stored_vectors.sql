-- Vectors already computed for these chunk texts and this model, reused instead of recomputed: from chunks
-- (any retained version) or, for text no chunk holds, from the vector cache (batches a run embedded that were
-- never published: it was killed, failed or refused).
SELECT DISTINCT ON (text_sha256) text_sha256, dense, sparse
FROM (
    SELECT text_sha256, dense, sparse, 0 AS source, id
    FROM corpusync.chunks
    WHERE model_id = %(model_id)s AND text_sha256 = ANY(%(hashes)s)
    UNION ALL
    SELECT text_sha256, dense, sparse, 1 AS source, 0 AS id
    FROM corpusync.vector_cache
    WHERE model_id = %(model_id)s AND text_sha256 = ANY(%(hashes)s)
) found
ORDER BY text_sha256, source, id
