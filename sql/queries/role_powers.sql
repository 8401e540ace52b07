-- A role's powers beyond reading, and whether it is the current user (no row: no such role).
SELECT rolsuper OR rolcreaterole OR rolreplication OR rolbypassrls AS privileged, rolname = current_user AS is_current
FROM pg_roles WHERE rolname = %(name)s
