-- Drop what a role (psycopg.sql.Identifier) owns in this database and revoke its privileges here.
DROP OWNED BY {role}
