-- Retire versions from the candidate generation on (readers of older generations still see them).
UPDATE corpusync.document_versions SET gen_to = %(generation)s
WHERE id = ANY(%(version_ids)s) AND gen_to IS NULL
RETURNING id, chunk_count
