-- Cached vectors no longer needed: those a chunk of a published-or-older version holds (crash recovery
-- never deletes those, so the cached copy is redundant), and those no chunk holds at all that are older than
-- the TTL (the text left the corpus, or the run that embedded it is long gone). A row only an unpublished
-- candidate holds is kept: recovery deletes that candidate's chunks, and the next run reuses the row.
DELETE FROM corpusync.vector_cache vc
WHERE EXISTS (SELECT 1 FROM corpusync.chunks c
              JOIN corpusync.document_versions v ON v.id = c.version_id
              WHERE c.model_id = vc.model_id AND c.text_sha256 = vc.text_sha256
                AND v.gen_from <= %(published)s)
   OR (vc.created_at < now() - make_interval(secs => %(ttl_h)s * 3600.0)
       AND NOT EXISTS (SELECT 1 FROM corpusync.chunks c
                       WHERE c.model_id = vc.model_id AND c.text_sha256 = vc.text_sha256))
