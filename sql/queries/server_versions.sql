-- PostgreSQL's and pgvector's versions (db status); pgvector NULL when the extension is not installed.
SELECT current_setting('server_version') AS postgresql,
       (SELECT extversion FROM pg_extension WHERE extname = 'vector') AS pgvector
