-- Whether an index (schema-qualified name) exists: lets a refresh skip CREATE INDEX IF NOT EXISTS, which
-- takes a SHARE lock on the table even when the index is there.
SELECT to_regclass(%(name)s) IS NOT NULL AS present
