-- The latest evaluation of a gold set on one generation (same modes evaluated), if any.
SELECT id, generation, goldset_sha256, metrics, created_at
FROM corpusync.evaluations
WHERE goldset = %(goldset)s AND generation = %(generation)s AND %(mode)s = ANY(modes)
ORDER BY created_at DESC, id DESC
LIMIT 1
