-- Metric history of a gold set in one mode, oldest first (for the report's plot).
SELECT evaluation_id, created_at, generation, metric, value, passed
FROM corpusync.eval_results
WHERE goldset = %(goldset)s AND mode = %(mode)s
ORDER BY created_at, evaluation_id
