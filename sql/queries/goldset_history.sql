-- Metric history of one gold set (by key; rows stored before keys existed: by name) in one mode, oldest
-- first (for the report's plot).
SELECT e.id AS evaluation_id, e.created_at, e.generation, x.key AS metric, (x.value)::double precision AS value,
       e.passed
FROM corpusync.evaluations e
CROSS JOIN LATERAL jsonb_each(e.metrics -> %(mode)s) AS x(key, value)
WHERE e.goldset_key = %(goldset_key)s OR (e.goldset_key IS NULL AND e.goldset = %(goldset)s)
ORDER BY e.created_at, e.id
