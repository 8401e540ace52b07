-- Crash/rollback recovery: versions born in a generation that was never published (or was rolled back),
-- with their chunks (by cascade) and their lexical postings.
WITH postings AS (
    DELETE FROM corpusync.postings
    WHERE version_id IN (SELECT id FROM corpusync.document_versions WHERE gen_from > %(published)s)
)
DELETE FROM corpusync.document_versions WHERE gen_from > %(published)s
