-- In the publish of %(generation)s: close the open quarantine records of the documents a version of that
-- generation begins (the path's content indexed at last, or a newer one): the failure is no longer what
-- the path serves, and stays closed after a rollback. By the run that built the generation. Driven by the
-- open records (a partial index) and document_versions (document_id, gen_from): a publish stays instant.
-- Returns the paths closed (the run summary lists them).
UPDATE corpusync.quarantine q
SET resolved_at = now(), resolved_by_run = g.run_id, resolution = 'indexed'
FROM corpusync.generations g
WHERE g.generation = %(generation)s AND q.resolved_at IS NULL
  AND EXISTS (SELECT 1 FROM corpusync.document_versions v
              WHERE v.document_id = q.document_id AND v.gen_from = %(generation)s)
RETURNING q.path
