"""Reader roles: login roles in the NOLOGIN group corpusync_reader (migration 0004), for BI tools and
analysts. Their groups (rows of corpusync.access_groups) decide which documents row-level security shows.

This module checks names and groups; the statements (names only as psycopg.sql.Identifier, a password only
as the SCRAM verifier libpq computes on this side) are corpusync.store.readers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import psycopg

from corpusync.core.errors import ConfigError, MigrationError
from corpusync.store import readers
from corpusync.store.readers import READER_GROUP

__all__ = ["READER_GROUP", "ReaderGrant", "grant_reader", "list_readers", "revoke_reader"]


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
    if not readers.reader_schema_ready(conn):
        raise MigrationError(f"role {READER_GROUP} or table corpusync.access_groups is missing: the schema "
                             "predates migration 0004_access (any corpusync command migrates it)")


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
    created = readers.grant_reader(conn, name, password, wanted)
    return ReaderGrant(name, created=created, password_set=password is not None, groups=wanted)


def revoke_reader(conn: psycopg.Connection, name: str) -> bool:
    """Drop reader role `name` and its access groups in this database. False when no such role existed.
    Refuses a role that is not a member of corpusync_reader (only readers are dropped here)."""
    _check_name(name)
    _require_group(conn)
    return readers.revoke_reader(conn, name)


def list_readers(conn: psycopg.Connection) -> list[dict[str, object]]:
    """Every member of corpusync_reader with its access groups in this database."""
    _require_group(conn)
    return readers.list_readers(conn)
