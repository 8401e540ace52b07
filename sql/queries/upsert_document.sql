INSERT INTO corpusync.documents (path, first_run_id) VALUES (%(path)s, %(run_id)s)
ON CONFLICT (path) DO UPDATE SET path = EXCLUDED.path
RETURNING id
