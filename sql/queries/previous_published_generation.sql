-- The newest generation before one that was live at some point and not rolled back (what was live before
-- it), and whether its rows can still be searched (expired: pruned).
SELECT generation, status, status IN ('published', 'superseded') AS searchable
FROM corpusync.generations
WHERE generation < %(generation)s AND published_at IS NOT NULL AND status <> 'rolled_back'
ORDER BY generation DESC
LIMIT 1
