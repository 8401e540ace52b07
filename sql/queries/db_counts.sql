SELECT
  (SELECT count(*) FROM corpusync.documents) AS documents,
  (SELECT count(*) FROM corpusync.document_versions) AS versions,
  (SELECT count(*) FROM corpusync.chunks) AS chunks,
  (SELECT count(*) FROM corpusync.live_chunks) AS live_chunks,
  (SELECT count(*) FROM corpusync.documents_current WHERE status LIKE 'live%%') AS live_documents,
  (SELECT count(*) FROM corpusync.quarantine) AS quarantine_records,
  (SELECT count(*) FROM corpusync.runs) AS runs,
  (SELECT count(*) FROM corpusync.generations) AS generations
