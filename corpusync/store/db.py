"""Database access: connections (pgvector registered on each), the client URL, named SQL from sql/queries/, and
open_database, which finds the server (corpusync.store.embedded) and brings the schema up to date
(corpusync.store.migrations)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from corpusync.core.errors import ConfigError, DatabaseError
from corpusync.store.embedded import parse_listen, resolve_database
from corpusync.store.migrations import SQL_DIR
from corpusync.store.migrations import migrate as _migrate

if TYPE_CHECKING:
    from schemas.settings import Settings

QUERIES_DIR = SQL_DIR / "queries"

WRITER_LOCK_KEY = 0x436F7270_0002  # advisory lock (arbitrary, fixed) of the single writer


# ---------------------------------------------------------------------------------------------------
# connections


def connect(url: str, *, autocommit: bool = False, application_name: str = "corpusync") -> psycopg.Connection:
    """Open a connection with pgvector types registered (every connection, per house rules)."""
    from pgvector.psycopg import register_vector

    try:
        conn = psycopg.connect(url, autocommit=autocommit, application_name=application_name)
    except psycopg.OperationalError as exc:
        raise DatabaseError(f"cannot connect to PostgreSQL at {redact(url)}: {exc}") from exc
    try:
        register_vector(conn)
    except psycopg.ProgrammingError:
        # The extension does not exist yet (fresh database): migrate() creates it and re-registers.
        pass
    return conn


@contextmanager
def connection(url: str, **kwargs: Any) -> Iterator[psycopg.Connection]:
    conn = connect(url, **kwargs)
    try:
        yield conn
    finally:
        conn.close()


def redact(url: str) -> str:
    """Hide a password in a URL before printing it."""
    return re.sub(r"(//[^:/@]+:)[^@]*@", r"\1***@", url)


SEARCH_PATH_OPTION = "-csearch_path%3Dcorpusync,public"


def with_search_path(url: str) -> str:
    """The URL with `options=-csearch_path%3Dcorpusync,public` in its query, so psql, BI tools and SQLAlchemy
    find corpusync's views unqualified. An options parameter already there is kept (ours is appended to it
    unless it sets search_path itself); a key=value conninfo gets an options keyword."""
    if "://" not in url:
        return url if "search_path" in url else f"{url} options='-csearch_path=corpusync,public'".strip()
    head, _, query = url.partition("?")
    params = [p for p in query.split("&") if p]
    for i, param in enumerate(params):
        if param.startswith("options="):
            if "search_path" not in param:
                params[i] = f"{param}%20{SEARCH_PATH_OPTION}"
            break
    else:
        params.append(f"options={SEARCH_PATH_OPTION}")
    return f"{head}?{'&'.join(params)}"


def tcp_url(settings: Settings, user: str | None = None) -> str:
    """The TCP URL a client (a BI tool) connects with, as `user` (default: the URL's own user), with the
    password left for the user to fill in as `USER:***@` (corpusync never stores nor prints one).

    Embedded server: its embedded_listen address (ConfigError when unset: it listens on the Unix socket
    only). DATABASE_URL: its host (or Unix socket), port and database."""
    from urllib.parse import quote

    from psycopg.conninfo import conninfo_to_dict

    if dsn := settings.database_dsn():
        info = conninfo_to_dict(dsn)
        host = str(info.get("host") or "localhost").split(",")[0]
        port = str(info.get("port") or "").split(",")[0]
        dbname = str(info.get("dbname") or info.get("user") or "postgres")
        login = user or str(info.get("user") or "postgres")
        if host.startswith("/"):  # DATABASE_URL names a Unix socket: so does the client's URL
            query = f"?host={quote(host, safe='/')}" + (f"&port={port}" if port else "")
            return with_search_path(f"postgresql://{quote(login, safe='')}:***@/{quote(dbname, safe='')}{query}")
        netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    else:
        if not settings.embedded_listen:
            raise ConfigError("the embedded PostgreSQL listens on its Unix socket only: set "
                              "CORPUSYNC_EMBEDDED_LISTEN=127.0.0.1:5433 (any free loopback port) for TCP")
        listen = parse_listen(settings.embedded_listen)
        netloc = f"{listen.url_host}:{listen.port}"
        dbname = "postgres"
        login = user or "postgres"
    return with_search_path(f"postgresql://{quote(login, safe='')}:***@{netloc}/{quote(dbname, safe='')}")



# ---------------------------------------------------------------------------------------------------
# named queries


@cache
def query_text(name: str) -> str:
    """The text of sql/queries/<name>.sql (named queries live in files, not in Python strings)."""
    path = QUERIES_DIR / f"{name}.sql"
    if not path.exists():
        raise KeyError(f"no named query {name!r} in {QUERIES_DIR}")
    return path.read_text()


def q(name: str, **identifiers: sql.Composable) -> sql.Composed | sql.SQL:
    """A named query as psycopg.sql, with {placeholders} filled only by psycopg.sql objects."""
    text = sql.SQL(query_text(name))
    return text.format(**identifiers) if identifiers else text


def fetch_all(conn: psycopg.Connection, name: str, params: dict[str, Any] | None = None,
              **identifiers: sql.Composable) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q(name, **identifiers), params or {})
        return cur.fetchall()


def fetch_one(conn: psycopg.Connection, name: str, params: dict[str, Any] | None = None,
              **identifiers: sql.Composable) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q(name, **identifiers), params or {})
        return cur.fetchone()


def execute(conn: psycopg.Connection, name: str, params: dict[str, Any] | None = None,
            **identifiers: sql.Composable) -> int:
    with conn.cursor() as cur:
        cur.execute(q(name, **identifiers), params or {})
        return cur.rowcount


def as_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)



def open_database(settings: Settings, *, migrate: bool = True) -> psycopg.Connection:
    """Connect (starting the embedded server if needed) and bring the schema up to date."""
    location = resolve_database(settings)
    # autocommit: every `with conn.transaction()` block is then a real transaction (one per publish).
    conn = connect(location.url, autocommit=True)
    if migrate:
        _migrate(conn)
    return conn
