-- A reader's access groups in this database, all of them.
DELETE FROM corpusync.access_groups WHERE role_name = %(name)s
