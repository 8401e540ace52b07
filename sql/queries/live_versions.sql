-- Document versions visible in generation %(generation)s.
SELECT v.document_id, v.id AS version_id, d.path, v.content_sha256, v.pipeline_fingerprint, v.chunk_count
FROM corpusync.document_versions v
JOIN corpusync.documents d ON d.id = v.document_id
WHERE corpusync.visible_in(v.gen_from, v.gen_to, %(generation)s)
ORDER BY d.path
