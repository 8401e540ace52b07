-- The baseline for a standalone gate: the latest evaluation of the gold set on an earlier generation that
-- was published at some point.
SELECT e.id, e.generation, e.goldset_sha256, e.metrics, e.created_at
FROM corpusync.evaluations e
JOIN corpusync.generations g ON g.generation = e.generation
WHERE e.goldset = %(goldset)s AND e.generation < %(generation)s AND g.published_at IS NOT NULL
  AND %(mode)s = ANY(e.modes)
ORDER BY e.generation DESC, e.created_at DESC, e.id DESC
LIMIT 1
