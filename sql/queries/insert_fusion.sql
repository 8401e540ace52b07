INSERT INTO corpusync.fusions (model_id, method, weights, rrf_k, goldset, goldset_sha256, generation, folds, report)
VALUES (%(model_id)s, %(method)s, %(weights)s::jsonb, %(rrf_k)s, %(goldset)s, %(goldset_sha256)s, %(generation)s,
        %(folds)s, %(report)s::jsonb)
RETURNING id, created_at
