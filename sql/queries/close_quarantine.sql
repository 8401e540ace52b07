-- Close the open quarantine records of paths they no longer describe (%(paths)s, each with its
-- %(resolutions)s: gone, live-content; tasks/diff.py closed_quarantine decides), in the run %(run_id)s.
-- Every open record of such a path: an older one is no more true of the file than the latest.
UPDATE corpusync.quarantine q
SET resolved_at = now(), resolved_by_run = %(run_id)s, resolution = r.resolution
FROM unnest(%(paths)s::text[], %(resolutions)s::text[]) AS r (path, resolution)
WHERE q.path = r.path AND q.resolved_at IS NULL
