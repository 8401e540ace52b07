-- Physically delete versions (and, by cascade, their chunks and vectors) that no retained generation shows.
DELETE FROM corpusync.document_versions WHERE gen_to IS NOT NULL AND gen_to <= %(oldest_retained)s
RETURNING id, chunk_count
