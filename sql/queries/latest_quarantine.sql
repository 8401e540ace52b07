-- The newest quarantine record of each path (what the diff needs to skip unchanged bad files).
SELECT DISTINCT ON (path) path, content_sha256, pipeline_fingerprint
FROM corpusync.quarantine
ORDER BY path, created_at DESC, id DESC
