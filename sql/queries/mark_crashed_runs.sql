-- Runs still marked running while we hold the writer lock died without finishing (kill -9, power loss).
-- A run that died after its publish committed did publish: it is recorded with its generation.
UPDATE corpusync.runs r
SET status = CASE WHEN g.published_at IS NOT NULL THEN 'published' ELSE 'crashed' END,
    finished_at = now(),
    generation = CASE WHEN g.published_at IS NOT NULL THEN g.generation ELSE r.generation END,
    published = g.published_at IS NOT NULL,
    message = coalesce(r.message, CASE
        WHEN g.published_at IS NOT NULL THEN 'the process ended after publishing generation ' || g.generation
             || ' and before the run was recorded as finished (its counts and timings are missing)'
        WHEN g.generation IS NOT NULL THEN 'the process ended before the run finished; its candidate '
             || 'generation ' || g.generation || ' was discarded'
        ELSE 'the process ended before the run finished' END)
FROM corpusync.runs r2
LEFT JOIN corpusync.generations g ON g.run_id = r2.id
WHERE r2.id = r.id AND r.status = 'running' AND r.kind = 'refresh' AND r.id <> %(run_id)s
RETURNING r.id, r.status
