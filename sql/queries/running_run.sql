-- The newest run still marked running: who holds the writer lock, for the "another writer" message.
SELECT id, started_at, hostname, pid FROM corpusync.runs WHERE status = 'running' ORDER BY id DESC LIMIT 1
