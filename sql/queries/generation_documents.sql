-- Paths of the documents visible in a generation.
SELECT d.path
FROM corpusync.document_versions v
JOIN corpusync.documents d ON d.id = v.document_id
WHERE corpusync.visible_in(v.gen_from, v.gen_to, %(generation)s)
