"""Reader roles: login roles in the NOLOGIN group corpusync_reader (migration 0004), for BI tools and
analysts. Their groups (rows of corpusync.access_groups) decide which documents row-level security shows.

Names go into SQL only as psycopg.sql.Identifier. A password never reaches the server nor any log in
clear: libpq turns it into a SCRAM-SHA-256 verifier on this side (as psql's \\password does) and only the
verifier is sent, as a literal of ALTER ROLE ... PASSWORD.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import psycopg
from psycopg import sql

from corpusync.errors import ConfigError, MigrationError

READER_GROUP = "corpusync_reader"


@dataclass(frozen=True)
class ReaderGrant:
    name: str
    created: bool
    password_set: bool
    groups: tuple[str, ...]


def _check_name(name: str) -> None:
    if not name or name != name.strip() or len(name.encode()) > 63 or "\0" in name:
        raise ConfigError(f"reader name {name!r}: expected 1 to 63 bytes without surrounding spaces")
    if name.startswith("pg_") or name == READER_GROUP or name in ("public", "none", "current_user",
                                                                   "session_user", "current_role"):
        raise ConfigError(f"reader name {name!r} is reserved")


def _require_group(conn: psycopg.Connection) -> None:
    row = conn.execute("SELECT to_regrole(%s) IS NOT NULL, to_regclass('corpusync.access_groups') IS NOT NULL",
                       (READER_GROUP,)).fetchone()
    if row is None or not row[0] or not row[1]:
        raise MigrationError(f"role {READER_GROUP} or table corpusync.access_groups is missing: the schema "
                             "predates migration 0004_access (any corpusync command migrates it)")


def _verifier(conn: psycopg.Connection, name: str, password: str) -> str:
    """The SCRAM-SHA-256 verifier of `password` for role `name`, computed client-side by libpq."""
    if not password:
        raise ConfigError("the password must not be empty")
    return conn.pgconn.encrypt_password(password.encode(), name.encode(), b"scram-sha-256").decode()


def grant_reader(conn: psycopg.Connection, name: str, password: str | None,
                 groups: Iterable[str] = ()) -> ReaderGrant:
    """Create (or update) login role `name`, member of corpusync_reader, with this password (None: keep the
    one it has; a new role needs one) and exactly these access groups. Refuses to touch a superuser or
    another role with powers beyond reading (CREATEROLE, REPLICATION, BYPASSRLS) and the current user."""
    _check_name(name)
    wanted = tuple(sorted({g.strip() for g in groups}))
    if any(not g for g in wanted):
        raise ConfigError("an access group name must not be empty")
    _require_group(conn)
    ident = sql.Identifier(name)
    with conn.transaction():
        row = conn.execute(
            "SELECT rolsuper OR rolcreaterole OR rolreplication OR rolbypassrls, rolname = current_user "
            "FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
        if row is not None and (row[0] or row[1]):
            raise ConfigError(f"role {name!r} is {'the current user' if row[1] else 'privileged'}: "
                              "refusing to make it a reader")
        secret = sql.SQL(" PASSWORD {}").format(sql.Literal(_verifier(conn, name, password))) \
            if password is not None else sql.SQL("")
        if row is None:
            if password is None:
                raise ConfigError(f"a new reader needs a password (--password-stdin or --password): {name}")
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN INHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE "
                                 "NOREPLICATION NOBYPASSRLS{}").format(ident, secret))
        else:
            conn.execute(sql.SQL("ALTER ROLE {} LOGIN INHERIT{}").format(ident, secret))
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(READER_GROUP), ident))
        conn.execute("DELETE FROM corpusync.access_groups WHERE role_name = %s", (name,))
        if wanted:
            conn.execute("INSERT INTO corpusync.access_groups (role_name, group_name) "
                         "SELECT %s, unnest(%s::text[])", (name, list(wanted)))
    return ReaderGrant(name, created=row is None, password_set=password is not None, groups=wanted)


def revoke_reader(conn: psycopg.Connection, name: str) -> bool:
    """Drop reader role `name` and its access groups in this database. False when no such role existed.
    Refuses a role that is not a member of corpusync_reader (only readers are dropped here)."""
    _check_name(name)
    _require_group(conn)
    with conn.transaction():
        conn.execute("DELETE FROM corpusync.access_groups WHERE role_name = %s", (name,))
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid "
            "WHERE m.member = r.oid AND g.rolname = %s) FROM pg_roles r WHERE r.rolname = %s",
            (READER_GROUP, name)).fetchone()
        if row is None:
            return False
        if not row[0]:
            raise ConfigError(f"role {name!r} is not a member of {READER_GROUP}: refusing to drop it")
        ident = sql.Identifier(name)
        conn.execute(sql.SQL("DROP OWNED BY {}").format(ident))
        try:
            conn.execute(sql.SQL("DROP ROLE {}").format(ident))
        except psycopg.errors.DependentObjectsStillExist as exc:
            raise ConfigError(f"role {name!r} still owns objects or holds privileges in another database "
                              f"(run DROP OWNED BY there first): {exc}") from exc
    return True


def list_readers(conn: psycopg.Connection) -> list[dict[str, object]]:
    """Every member of corpusync_reader with its access groups in this database."""
    _require_group(conn)
    rows = conn.execute(
        "SELECT r.rolname, r.rolcanlogin, coalesce(array_agg(a.group_name ORDER BY a.group_name) "
        "FILTER (WHERE a.group_name IS NOT NULL), '{}') "
        "FROM pg_roles r JOIN pg_auth_members m ON m.member = r.oid JOIN pg_roles g ON g.oid = m.roleid "
        "LEFT JOIN corpusync.access_groups a ON a.role_name = r.rolname "
        "WHERE g.rolname = %s GROUP BY r.rolname, r.rolcanlogin ORDER BY r.rolname", (READER_GROUP,)).fetchall()
    return [{"name": r[0], "login": r[1], "groups": list(r[2])} for r in rows]
