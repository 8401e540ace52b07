-- A new reader login role, no password yet (set_role_password follows in the same transaction);
-- role: psycopg.sql.Identifier.
CREATE ROLE {role} LOGIN INHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
