UPDATE corpusync.generations SET status = 'expired'
WHERE generation < %(oldest_retained)s AND status = 'superseded'
