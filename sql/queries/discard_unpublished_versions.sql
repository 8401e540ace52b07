-- Crash/rollback recovery: versions born in a generation that was never published (or was rolled back).
DELETE FROM corpusync.document_versions WHERE gen_from > %(published)s
