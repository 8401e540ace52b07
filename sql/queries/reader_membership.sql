-- Whether a role is a member of the reader group (no row: no such role).
SELECT EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
               WHERE m.member = r.oid AND g.rolname = %(group)s) AS is_reader
FROM pg_roles r WHERE r.rolname = %(name)s
