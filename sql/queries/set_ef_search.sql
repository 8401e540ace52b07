-- HNSW's candidate list for the rest of the transaction; ef_search is a psycopg.sql.Literal.
SET LOCAL hnsw.ef_search = {ef_search}
