-- Record a quarantined file; its document identity is registered too, so documents_current lists it.
WITH doc AS (
    INSERT INTO corpusync.documents (path, first_run_id) VALUES (%(path)s, %(run_id)s)
    ON CONFLICT (path) DO UPDATE SET path = EXCLUDED.path
    RETURNING id
)
INSERT INTO corpusync.quarantine (run_id, document_id, path, content_sha256, pipeline_fingerprint, stage, reason, error)
SELECT %(run_id)s, doc.id, %(path)s, %(content_sha256)s, %(pipeline_fingerprint)s, %(stage)s, %(reason)s, %(error)s
FROM doc
