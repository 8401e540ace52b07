UPDATE corpusync.generations SET status = 'superseded' WHERE generation = %(generation)s AND status = 'published'
