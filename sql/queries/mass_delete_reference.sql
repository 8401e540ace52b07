-- The mass-delete guard's reference: the largest generation published within the window, counting only
-- generations since the last publish that a user explicitly allowed to delete many documents.
SELECT g.generation, g.live_documents, g.published_at
FROM corpusync.generations g
WHERE g.published_at >= now() - make_interval(secs => %(window_s)s)
  AND g.live_documents IS NOT NULL
  AND g.generation >= coalesce((
      SELECT max(a.generation) FROM corpusync.generations a JOIN corpusync.runs r ON r.id = a.run_id
      WHERE a.published_at IS NOT NULL AND r.config @> '{"allow_mass_delete": true}'), 0)
ORDER BY g.live_documents DESC, g.generation DESC
LIMIT 1
