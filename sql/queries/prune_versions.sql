-- Physically delete versions (and, by cascade, their chunks and vectors; their lexical postings here)
-- that no retained generation shows.
WITH postings AS (
    DELETE FROM corpusync.postings
    WHERE version_id IN (SELECT id FROM corpusync.document_versions
                         WHERE gen_to IS NOT NULL AND gen_to <= %(oldest_retained)s)
)
DELETE FROM corpusync.document_versions WHERE gen_to IS NOT NULL AND gen_to <= %(oldest_retained)s
RETURNING id, chunk_count
