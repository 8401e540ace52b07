-- Whether the reader group role and the access_groups table exist (migration 0004_access).
SELECT to_regrole(%(group)s) IS NOT NULL AS group_exists,
       to_regclass('corpusync.access_groups') IS NOT NULL AS table_exists
