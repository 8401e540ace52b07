-- The renames a candidate generation was built with (tasks.diff.renames: one to one, by content).
INSERT INTO corpusync.document_renames (generation, from_path, to_path, run_id)
SELECT %(generation)s, f, t, %(run_id)s FROM unnest(%(from_paths)s::text[], %(to_paths)s::text[]) AS r (f, t)
ON CONFLICT (generation, from_path) DO UPDATE SET to_path = EXCLUDED.to_path, run_id = EXCLUDED.run_id
