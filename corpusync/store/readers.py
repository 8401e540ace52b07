"""Reader roles' SQL: login roles in the NOLOGIN group corpusync_reader (migration 0004) and their access
groups (rows of corpusync.access_groups). corpusync.app.roles checks names and is what the CLI calls.

Names go into SQL only as psycopg.sql.Identifier. A password never reaches the server nor any log in clear:
libpq turns it into a SCRAM-SHA-256 verifier on this side (as psql's \\password does) and only the verifier
is sent, as a literal of ALTER ROLE ... PASSWORD.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from corpusync.core.errors import ConfigError
from corpusync.store import db

READER_GROUP = "corpusync_reader"


def reader_schema_ready(conn: psycopg.Connection) -> bool:
    """Whether the reader group and corpusync.access_groups exist (migration 0004_access applied)."""
    row = db.fetch_one(conn, "reader_schema", {"group": READER_GROUP})
    return bool(row and row["group_exists"] and row["table_exists"])


def _verifier(conn: psycopg.Connection, name: str, password: str) -> str:
    """The SCRAM-SHA-256 verifier of `password` for role `name`, computed client-side by libpq."""
    if not password:
        raise ConfigError("the password must not be empty")
    return conn.pgconn.encrypt_password(password.encode(), name.encode(), b"scram-sha-256").decode()


def grant_reader(conn: psycopg.Connection, name: str, password: str | None, groups: Sequence[str]) -> bool:
    """In one transaction: create (or update) login role `name` as a member of corpusync_reader, with this
    password (None: keep its own; a new role needs one) and exactly these access groups. Refuses a superuser,
    a role with powers beyond reading (CREATEROLE, REPLICATION, BYPASSRLS) and the current user. Returns
    whether the role was created."""
    role = sql.Identifier(name)
    with conn.transaction():
        row = db.fetch_one(conn, "role_powers", {"name": name})
        if row is not None and (row["privileged"] or row["is_current"]):
            raise ConfigError(f"role {name!r} is {'the current user' if row['is_current'] else 'privileged'}: "
                              "refusing to make it a reader")
        verifier = _verifier(conn, name, password) if password is not None else None
        if row is None:
            if verifier is None:
                raise ConfigError(f"a new reader needs a password (--password-stdin or --password): {name}")
            db.execute(conn, "create_reader_role", role=role)
        else:
            db.execute(conn, "alter_reader_role", role=role)
        if verifier is not None:
            db.execute(conn, "set_role_password", role=role, verifier=sql.Literal(verifier))
        db.execute(conn, "grant_role", group=sql.Identifier(READER_GROUP), role=role)
        db.execute(conn, "delete_access_groups", {"name": name})
        if groups:
            db.execute(conn, "insert_access_groups", {"name": name, "groups": list(groups)})
    return row is None


def revoke_reader(conn: psycopg.Connection, name: str) -> bool:
    """In one transaction: drop reader role `name` and its access groups in this database. False when no
    such role existed; refuses a role that is not a member of corpusync_reader."""
    with conn.transaction():
        db.execute(conn, "delete_access_groups", {"name": name})
        row = db.fetch_one(conn, "reader_membership", {"group": READER_GROUP, "name": name})
        if row is None:
            return False
        if not row["is_reader"]:
            raise ConfigError(f"role {name!r} is not a member of {READER_GROUP}: refusing to drop it")
        role = sql.Identifier(name)
        db.execute(conn, "drop_owned_by", role=role)
        try:
            db.execute(conn, "drop_role", role=role)
        except psycopg.errors.DependentObjectsStillExist as exc:
            raise ConfigError(f"role {name!r} still owns objects or holds privileges in another database "
                              f"(run DROP OWNED BY there first): {exc}") from exc
    return True


def list_readers(conn: psycopg.Connection) -> list[dict[str, object]]:
    """Every member of corpusync_reader with its access groups in this database."""
    return [{"name": r["name"], "login": r["login"], "groups": list(r["groups"])}
            for r in db.fetch_all(conn, "list_readers", {"group": READER_GROUP})]
