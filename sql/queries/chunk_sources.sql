-- Source path and text of chunks by id (for reports).
SELECT c.id AS chunk_id, d.path, c.text
FROM corpusync.chunks c JOIN corpusync.documents d ON d.id = c.document_id
WHERE c.id = ANY(%(ids)s)
