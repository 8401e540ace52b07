-- The published generation's number alone (0: nothing published yet).
SELECT published_generation FROM corpusync.index_state
