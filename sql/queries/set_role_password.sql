-- verifier: a SCRAM-SHA-256 verifier computed client-side by libpq (psycopg.sql.Literal); the password
-- itself never reaches the server. role: psycopg.sql.Identifier.
ALTER ROLE {role} PASSWORD {verifier}
