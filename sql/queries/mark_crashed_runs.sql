-- Runs still marked running while we hold the writer lock died without finishing (kill -9, power loss).
UPDATE corpusync.runs
SET status = 'crashed', finished_at = now(),
    message = coalesce(message, 'the process ended before the run finished; its candidate was discarded')
WHERE status = 'running' AND kind = 'refresh' AND id <> %(run_id)s
