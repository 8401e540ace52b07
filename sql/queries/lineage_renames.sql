-- The renames in a generation's lineage, oldest first: its own, and those of the generations published before
-- it (published, superseded or expired; a refused, discarded or rolled-back candidate's are not its history).
SELECT r.from_path, r.to_path
FROM corpusync.document_renames r
JOIN corpusync.generations g ON g.generation = r.generation
WHERE r.generation = %(generation)s
   OR (r.generation < %(generation)s AND g.status IN ('published', 'superseded', 'expired'))
ORDER BY r.generation, r.from_path
