-- Generations that must stay restorable: the published one and the newest %(retention)s superseded ones.
SELECT generation FROM corpusync.generations
WHERE generation = %(published)s
   OR generation IN (SELECT generation FROM corpusync.generations
                     WHERE status = 'superseded' AND generation < %(published)s
                     ORDER BY generation DESC LIMIT %(retention)s)
ORDER BY generation
