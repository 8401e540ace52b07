-- An existing role made a login reader; role: psycopg.sql.Identifier.
ALTER ROLE {role} LOGIN INHERIT
