-- The chunks (id, path, text, page span) of the given documents in a generation, in document order.
SELECT c.id AS chunk_id, d.path, c.text, c.page_start, c.page_end
FROM corpusync.document_versions v
JOIN corpusync.documents d ON d.id = v.document_id
JOIN corpusync.chunks c ON c.version_id = v.id
WHERE corpusync.visible_in(v.gen_from, v.gen_to, %(generation)s) AND d.path = ANY(%(paths)s)
ORDER BY d.path, c.ordinal
