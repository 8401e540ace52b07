UPDATE corpusync.generations SET status = %(status)s,
       published_at = CASE WHEN %(status)s = 'published' THEN now() ELSE published_at END
WHERE generation = %(generation)s
