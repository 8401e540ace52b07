UPDATE corpusync.runs
SET status = %(status)s, finished_at = now(), generation = %(generation)s, published = %(published)s,
    counts = %(counts)s::jsonb, timings = %(timings)s::jsonb, message = %(message)s
WHERE id = %(run_id)s
