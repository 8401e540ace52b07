-- The newest generation before the published one that was live once and whose rows are still retained.
SELECT generation, model_id FROM corpusync.generations
WHERE generation < %(published)s AND status = 'superseded'
ORDER BY generation DESC LIMIT 1
