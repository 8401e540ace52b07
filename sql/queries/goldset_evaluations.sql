-- The stored evaluations of one gold set (by key; rows stored before keys existed: by name) on one
-- generation in one mode, newest first: the gate takes the first that scored the same question set.
SELECT id, generation, goldset_sha256, n_questions, question_limit, created_at
FROM corpusync.evaluations
WHERE generation = %(generation)s AND %(mode)s = ANY(modes)
  AND (goldset_key = %(goldset_key)s OR (goldset_key IS NULL AND goldset = %(goldset)s))
ORDER BY created_at DESC, id DESC
