-- Documents with no version left and no quarantine record are forgotten.
DELETE FROM corpusync.documents d
WHERE NOT EXISTS (SELECT 1 FROM corpusync.document_versions v WHERE v.document_id = d.id)
  AND NOT EXISTS (SELECT 1 FROM corpusync.quarantine q WHERE q.document_id = d.id)
