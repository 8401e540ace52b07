-- Drop a reader login role (role: psycopg.sql.Identifier).
DROP ROLE {role}
