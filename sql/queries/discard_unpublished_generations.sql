UPDATE corpusync.generations
SET status = CASE WHEN status = 'candidate' THEN 'discarded' ELSE status END
WHERE generation > %(published)s AND status IN ('candidate', 'rolled_back', 'refused')
