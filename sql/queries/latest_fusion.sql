-- The fusion tuned most recently for a model (corpusync eval --tune-fusion), if any.
SELECT id, method, weights, rrf_k, goldset, goldset_sha256, generation, folds, report, created_at
FROM corpusync.fusions WHERE model_id = %(model_id)s
ORDER BY created_at DESC, id DESC LIMIT 1
