-- The fusion in force for a generation: the newest tuned for its model on that generation or an earlier one,
-- unless the generation it was tuned on was refused or discarded (then it never went live).
SELECT f.id, f.method, f.weights, f.rrf_k, f.goldset, f.goldset_sha256, f.generation, f.folds, f.report,
       f.created_at
FROM corpusync.fusions f
LEFT JOIN corpusync.generations g ON g.generation = f.generation
WHERE f.model_id = %(model_id)s
  AND (f.generation IS NULL OR (f.generation <= %(generation)s AND g.status NOT IN ('refused', 'discarded')))
ORDER BY f.created_at DESC, f.id DESC LIMIT 1
