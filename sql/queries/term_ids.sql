SELECT id, term FROM corpusync.lexicon WHERE term = ANY(%(terms)s::text[])
