-- Make a role a member of a group role (both psycopg.sql.Identifier).
GRANT {group} TO {role}
