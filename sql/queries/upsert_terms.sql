-- Give every new term a stable id (one writer at a time holds the writer lock).
INSERT INTO corpusync.lexicon (term) SELECT DISTINCT unnest(%(terms)s::text[]) ORDER BY 1
ON CONFLICT (term) DO NOTHING
