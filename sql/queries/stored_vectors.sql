-- Vectors already in the index for these chunk texts and this model (reused instead of recomputed).
SELECT DISTINCT ON (text_sha256) text_sha256, dense, sparse
FROM corpusync.chunks
WHERE model_id = %(model_id)s AND text_sha256 = ANY(%(hashes)s)
ORDER BY text_sha256, id
