-- Every member of the reader group with its access groups in this database.
SELECT r.rolname AS name, r.rolcanlogin AS login,
       coalesce(array_agg(a.group_name ORDER BY a.group_name) FILTER (WHERE a.group_name IS NOT NULL), '{}') AS groups
FROM pg_roles r JOIN pg_auth_members m ON m.member = r.oid JOIN pg_roles g ON g.oid = m.roleid
LEFT JOIN corpusync.access_groups a ON a.role_name = r.rolname
WHERE g.rolname = %(group)s GROUP BY r.rolname, r.rolcanlogin ORDER BY r.rolname
