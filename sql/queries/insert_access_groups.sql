-- A reader's access groups (which documents row-level security shows it).
INSERT INTO corpusync.access_groups (role_name, group_name) SELECT %(name)s, unnest(%(groups)s::text[])
