-- The Python API goes through the same SQL function analysts call (sql/views/040_search.sql).
SELECT * FROM corpusync.search_hybrid(%(qtext)s, %(qvec)s, %(qsparse)s, %(k)s, %(filter)s::jsonb, %(generation)s,
                                      %(w_dense)s, %(w_lex)s, %(w_sparse)s, %(rrf_k)s, %(pool)s,
                                      %(k1)s, %(b)s)
