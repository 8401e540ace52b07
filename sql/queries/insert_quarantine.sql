INSERT INTO corpusync.quarantine (run_id, document_id, path, content_sha256, pipeline_fingerprint, stage, reason, error)
VALUES (%(run_id)s, (SELECT id FROM corpusync.documents WHERE path = %(path)s), %(path)s, %(content_sha256)s,
        %(pipeline_fingerprint)s, %(stage)s, %(reason)s, %(error)s)
