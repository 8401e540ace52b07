-- Record a quarantined file; its document identity is registered too, so documents_current lists it.
-- A record equal to the path's latest one (same content, pipeline, stage, reason and error) is written only
-- when it is a new attempt (%(attempt)s: a failed retry); a re-read of a known bad file (discover meets it on
-- every run) writes nothing, so the history keeps one row per failure, not one per run; after a closed
-- record (migration 0008) the failure is new again and is written. RETURNING: written.
WITH latest AS (
    SELECT q.content_sha256, q.pipeline_fingerprint, q.stage, q.reason, q.error, q.resolved_at
    FROM corpusync.quarantine q
    WHERE q.path = %(path)s
    ORDER BY q.created_at DESC, q.id DESC
    LIMIT 1
), repeated AS (
    SELECT 1 FROM latest
    WHERE NOT %(attempt)s::boolean AND latest.resolved_at IS NULL
      AND latest.content_sha256 IS NOT DISTINCT FROM %(content_sha256)s::text
      AND latest.pipeline_fingerprint IS NOT DISTINCT FROM %(pipeline_fingerprint)s::text
      AND latest.stage = %(stage)s AND latest.reason = %(reason)s AND latest.error = %(error)s
), doc AS (
    INSERT INTO corpusync.documents (path, first_run_id)
    SELECT %(path)s, %(run_id)s WHERE NOT EXISTS (SELECT 1 FROM repeated)
    ON CONFLICT (path) DO UPDATE SET path = EXCLUDED.path
    RETURNING id
)
INSERT INTO corpusync.quarantine (run_id, document_id, path, content_sha256, pipeline_fingerprint, stage, reason, error)
SELECT %(run_id)s, doc.id, %(path)s, %(content_sha256)s, %(pipeline_fingerprint)s, %(stage)s, %(reason)s, %(error)s
FROM doc
RETURNING id
