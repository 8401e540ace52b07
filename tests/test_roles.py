"""Reader roles (corpusync db grant-reader / revoke-reader), the embedded server's loopback TCP listener
(embedded_listen) and the URLs `corpusync db url` prints."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors

from corpusync.app import roles
from corpusync.core.errors import ConfigError
from corpusync.store import db, embedded

# ---------------------------------------------------------------------------------------------------
# without a server


@pytest.mark.parametrize("value, host, port", [
    ("127.0.0.1:5433", "127.0.0.1", 5433), ("localhost:6000", "127.0.0.1", 6000), ("[::1]:5433", "::1", 5433),
    ("127.0.0.2", "127.0.0.2", 5432),
])
def test_parse_listen_loopback(value: str, host: str, port: int) -> None:
    assert embedded.parse_listen(value) == embedded.ListenAddress(host, port)


@pytest.mark.parametrize("value", ["0.0.0.0:5433", "10.1.2.3:5433", "[::]:5433", "example.com:5433",
                                   "::1:5433", "127.0.0.1:70000", "127.0.0.1:x", ""])
def test_parse_listen_refuses_non_loopback(value: str) -> None:
    with pytest.raises(ConfigError):
        embedded.parse_listen(value)


def test_resolve_database_refuses_non_loopback(tmp_path: Path) -> None:
    from schemas.settings import Settings

    settings = Settings(home=tmp_path, database_url=None, embedded_listen="0.0.0.0:5433")
    with pytest.raises(ConfigError, match="loopback"):
        embedded.resolve_database(settings, start=False)


INITDB_HBA = """# TYPE  DATABASE        USER            ADDRESS                 METHOD
local   all             all                                     trust
host    all             all             127.0.0.1/32            trust
host    all             all             ::1/128                 trust
local   replication     all                                     trust
host    replication     all             127.0.0.1/32            trust
"""


def test_hba_scram_on_tcp_socket_untouched() -> None:
    once = embedded._hba_with_scram(INITDB_HBA)
    active = [line.split() for line in once.splitlines() if line.strip() and not line.startswith("#")]
    assert ["local", "all", "all", "trust"] in active and ["local", "replication", "all", "trust"] in active
    assert [f for f in active if f[0] == "host"] == [
        ["host", "all", "all", "127.0.0.1/32", "scram-sha-256"], ["host", "all", "all", "::1/128", "scram-sha-256"]]
    assert embedded._hba_with_scram(once) == once  # idempotent: one block, nothing disabled twice


def test_urls_carry_search_path_and_stay_redactable() -> None:
    from schemas.settings import Settings

    socket_url = db.with_search_path("postgresql://postgres:@/postgres?host=/tmp/pg")
    assert socket_url == "postgresql://postgres:@/postgres?host=/tmp/pg&options=-csearch_path%3Dcorpusync,public"
    assert db.with_search_path(socket_url) == socket_url
    assert db.with_search_path("postgresql://u:secret@h/d") == \
        "postgresql://u:secret@h/d?options=-csearch_path%3Dcorpusync,public"
    assert "secret" not in db.redact(db.with_search_path("postgresql://u:secret@h:5/d?sslmode=require"))
    assert db.with_search_path("postgresql://h/d?options=-cwork_mem%3D64MB") == \
        "postgresql://h/d?options=-cwork_mem%3D64MB%20-csearch_path%3Dcorpusync,public"

    embedded = Settings(home=Path("/nonexistent"), database_url=None, embedded_listen="127.0.0.1:5433")
    assert db.tcp_url(embedded, "bi_user") == \
        "postgresql://bi_user:***@127.0.0.1:5433/postgres?options=-csearch_path%3Dcorpusync,public"
    external = Settings(database_url="postgresql://owner:pw@db.internal:6432/corpus?sslmode=require")
    assert db.tcp_url(external, "bi") == \
        "postgresql://bi:***@db.internal:6432/corpus?options=-csearch_path%3Dcorpusync,public"
    with pytest.raises(ConfigError, match="EMBEDDED_LISTEN"):
        db.tcp_url(Settings(home=Path("/nonexistent"), database_url=None), "bi")


# ---------------------------------------------------------------------------------------------------
# reader privileges (the shared test server, Unix socket)


def _require_reader_group(conn: psycopg.Connection) -> None:
    row = conn.execute("SELECT to_regrole('corpusync_reader') IS NULL").fetchone()
    if row is None or row[0]:
        pytest.skip("role corpusync_reader does not exist: migration 0004_access has not landed")


@pytest.fixture
def reader(conn: psycopg.Connection) -> Iterator[tuple[str, str]]:
    _require_reader_group(conn)
    name, password = f"reader_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    yield name, password
    # roles are cluster-wide: never leave one behind, even when the test failed half way
    conn.execute("DELETE FROM corpusync.access_groups WHERE role_name = %s", (name,))
    if conn.execute("SELECT to_regrole(%s)", (name,)).fetchone() != (None,):
        conn.execute(psycopg.sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(psycopg.sql.Identifier(name)))


def _refused(rc: psycopg.Connection, statement: str) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        rc.execute(statement)


def _check_read_only(rc: psycopg.Connection) -> None:
    assert rc.execute("SELECT current_user, current_setting('search_path')").fetchone() is not None
    rc.execute("SELECT count(*) FROM corpusync.live_chunks").fetchone()
    rc.execute("SELECT count(*) FROM corpusync.documents_current").fetchone()
    rc.execute("SELECT corpusync.published_generation(), corpusync.lexical_parse('contract -draft')").fetchone()
    try:  # an empty index (no generation published) raises from inside the function: it ran as the reader
        rc.execute("SELECT * FROM corpusync.search_text('contract terms', 5)").fetchall()
    except errors.RaiseException as exc:
        assert "generation 0 does not exist" in str(exc)
    _refused(rc, "INSERT INTO corpusync.documents (path) VALUES ('x')")
    _refused(rc, "UPDATE corpusync.documents SET path = path WHERE false")
    _refused(rc, "DELETE FROM corpusync.chunks WHERE false")
    _refused(rc, "TRUNCATE corpusync.document_versions")
    _refused(rc, "CREATE TABLE corpusync.mine (x int)")
    _refused(rc, "CREATE TABLE public.mine (x int)")
    _refused(rc, "SELECT * FROM corpusync.access_groups")


def test_grant_reader_is_read_only(conn: psycopg.Connection, db_url: str, reader: tuple[str, str]) -> None:
    name, password = reader
    grant = roles.grant_reader(conn, name, password, ["legal", "hr", "legal"])
    assert grant.created and grant.password_set and grant.groups == ("hr", "legal")
    verifier = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (name,)).fetchone()
    assert verifier is not None and verifier[0].startswith("SCRAM-SHA-256$") and password not in verifier[0]

    # The shared test server listens on its Unix socket only (trust there), so the reader connects by socket.
    with psycopg.connect(db_url, user=name, password=password, autocommit=True) as rc:
        assert rc.execute("SELECT current_user").fetchone() == (name,)
        _check_read_only(rc)

    # update: the groups are replaced, the password kept when none is given
    again = roles.grant_reader(conn, name, None, ["finance"])
    assert not again.created and not again.password_set
    assert conn.execute("SELECT array_agg(group_name) FROM corpusync.access_groups WHERE role_name = %s",
                        (name,)).fetchone() == (["finance"],)
    assert conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (name,)).fetchone() == verifier
    assert [r for r in roles.list_readers(conn) if r["name"] == name] == [
        {"name": name, "login": True, "groups": ["finance"]}]

    assert roles.revoke_reader(conn, name)
    assert conn.execute("SELECT to_regrole(%s)", (name,)).fetchone() == (None,)
    assert conn.execute("SELECT count(*) FROM corpusync.access_groups WHERE role_name = %s",
                        (name,)).fetchone() == (0,)
    assert not roles.revoke_reader(conn, name)


def test_grant_reader_refuses_what_is_not_a_reader(conn: psycopg.Connection, reader: tuple[str, str]) -> None:
    name, _password = reader
    with pytest.raises(ConfigError, match=r"privileged|current user"):
        roles.grant_reader(conn, "postgres", "x", [])
    with pytest.raises(ConfigError, match="needs a password"):
        roles.grant_reader(conn, name, None, [])
    with pytest.raises(ConfigError, match="reserved"):
        roles.grant_reader(conn, "corpusync_reader", "x", [])
    with pytest.raises(ConfigError, match="not a member"):
        roles.revoke_reader(conn, "postgres")
    assert conn.execute("SELECT to_regrole(%s)", (name,)).fetchone() == (None,)


def test_cli_grant_and_revoke_never_print_the_password(settings: Any, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str],
                                                       conn: psycopg.Connection, reader: tuple[str, str]) -> None:
    import io

    from corpusync.cli import main

    name, password = reader
    monkeypatch.setenv("CORPUSYNC_DATABASE_URL", settings.database_dsn())
    monkeypatch.setattr("sys.stdin", io.StringIO(password + "\n"))
    assert main(["db", "grant-reader", name, "--password-stdin", "--group", "legal"]) == 0
    assert main(["db", "url", "--reader", name]) == 0
    assert main(["db", "revoke-reader", name]) == 0
    out = capsys.readouterr()
    assert password not in out.out + out.err
    assert f"created reader {name}; groups: legal" in out.out and f"dropped reader {name}" in out.out
    assert f"postgresql://{name}:***@" in out.out


# ---------------------------------------------------------------------------------------------------
# the embedded server on loopback TCP (its own data directory: the shared one stays socket-only)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tcp_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from schemas.settings import Settings

    settings = Settings(home=tmp_path_factory.mktemp("tcp") / "home", database_url=None,
                        embedded_listen=f"127.0.0.1:{_free_port()}")
    try:
        yield settings
    finally:
        embedded.stop_embedded(settings)


def test_embedded_listens_on_loopback_with_passwords(tcp_home: Any) -> None:
    from corpusync.store.db import open_database

    listen = embedded.parse_listen(tcp_home.embedded_listen)
    loc = embedded.resolve_database(tcp_home)
    assert loc.listen == listen and f"port={listen.port}" in loc.url  # the socket file follows the port
    with open_database(tcp_home) as conn:
        _require_reader_group(conn)
        pid = conn.execute("SELECT pg_backend_pid(), current_setting('listen_addresses'), "
                           "current_setting('port')::int").fetchone()
        assert pid is not None and pid[1:] == (listen.host, listen.port)
        postmaster = (tcp_home.pgdata / "postmaster.pid").read_text().split()[0]

        name, password = f"bi_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
        roles.grant_reader(conn, name, password, ["legal"])
        try:
            url = db.tcp_url(tcp_home, name)
            assert url.startswith(f"postgresql://{name}:***@127.0.0.1:{listen.port}/postgres?")
            with psycopg.connect(url.replace(":***@", f":{password}@"), autocommit=True) as rc:
                row = rc.execute("SELECT current_user, current_setting('search_path'), "
                                 "inet_server_addr() IS NOT NULL").fetchone()
                assert row is not None and row[0] == name and row[2]  # over TCP
                assert row[1].replace(" ", "") == "corpusync,public"  # with the search path from the URL
                _check_read_only(rc)
            tcp = f"host=127.0.0.1 port={listen.port} dbname=postgres"
            with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
                psycopg.connect(f"{tcp} user={name} password=wrong").close()
            with pytest.raises(psycopg.OperationalError):  # the superuser has no password: socket only
                psycopg.connect(f"{tcp} user=postgres password=").close()
        finally:
            assert roles.revoke_reader(conn, name)

    # another process resolving the same settings finds the server listening: no restart
    embedded._embedded_uri.cache_clear()
    assert embedded.resolve_database(tcp_home).url == loc.url
    assert (tcp_home.pgdata / "postmaster.pid").read_text().split()[0] == postmaster
