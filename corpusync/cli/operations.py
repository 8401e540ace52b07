"""Operating the index and its processes: rollback, prune, serve, export, and the shared local API server and
model servers (`corpusync api`, `corpusync model`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from corpusync.cli.base import State, app, load_settings


@app.command()
def rollback() -> None:
    """Make the previous generation live again (instant; one UPDATE)."""
    from corpusync.store.db import open_database
    from corpusync.store.generations import rollback as do_rollback

    with open_database(load_settings()) as conn:
        before, after = do_rollback(conn)
    typer.echo(f"rolled back: generation {after} is live again (was {before})")


@app.command()
def prune() -> None:
    """Delete rows that fell out of the retention window (a refresh does this too)."""
    from corpusync.app.pruning import prune as do_prune
    from corpusync.app.runtime import acquire_writer_lock
    from corpusync.store.db import open_database

    settings = load_settings()
    with open_database(settings) as conn:
        acquire_writer_lock(conn, settings.lock_timeout_s)
        result = do_prune(conn, settings)
    typer.echo(f"pruned {result['versions']} versions ({result['chunks']} chunks) and "
               f"{result['documents']} documents, {result['cached_vectors']} cached vectors, "
               f"{result['ocr_readings']} OCR readings; oldest retained generation {result['oldest_retained']}")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8765,
    workers: Annotated[int, typer.Option(help="Worker processes (each loads the model and its own pool).")] = 1,
) -> None:
    """Serve search over HTTP for applications: GET /health, POST /search {"query", "k", "mode", "filters",
    "generation", "rerank"} -> hits with citations (as `corpusync query --json`). Searches run as
    CORPUSYNC_SERVE_DATABASE_URL when set (a reader role)."""
    import uvicorn

    if State.home is not None:  # the factory reads Settings() from the environment in every worker
        os.environ["CORPUSYNC_HOME"] = str(State.home)
    uvicorn.run("query.service:app_from_env", factory=True, host=host, port=port, workers=workers)


@app.command("export")
def export_cmd(
    path: Annotated[Path, typer.Argument(help="The Parquet file to write (PATH.parquet).")],
    vectors: Annotated[bool, typer.Option("--vectors", help="Add the dense embedding (list<float32>).")] = False,
    generation: Annotated[int | None, typer.Option(
        help="Export this generation (default: the published one).")] = None,
) -> None:
    """Write the live chunks (or a generation's) with their lineage columns to Parquet, streamed in batches."""
    from corpusync.app.analytics import export_parquet
    from corpusync.store.db import open_database

    with open_database(load_settings()) as conn:
        done = export_parquet(conn, path, generation=generation, vectors=vectors)
    typer.echo(f"wrote {done['rows']} chunks of generation {done['generation']} to {done['path']}")


api_app = typer.Typer(no_args_is_help=True, help="The local Prefect API server that refreshes report to when "
                      "PREFECT_API_URL is not set (shared by commands, stopped after CORPUSYNC_LOCAL_API_LINGER_S).")
app.add_typer(api_app, name="api")


model_app = typer.Typer(no_args_is_help=True, help="The embedding-model processes the CLI's refreshes and queries "
                        "share (one per model and home, stopped after CORPUSYNC_MODEL_LINGER_S).")
app.add_typer(model_app, name="model")


@model_app.command("status")
def model_status(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The home's shared model servers: pid, model, device and model folder."""
    from corpusync.adapters.model_server import server_status

    servers = server_status(load_settings().home)
    if as_json:
        typer.echo(json.dumps(servers, ensure_ascii=False))
        return
    if not servers:
        typer.echo("not running")
    for info in servers:
        typer.echo(f"pid {info['pid']}: {info['name']} on {info['device']} ({info['model_dir']})")


@model_app.command("stop")
def model_stop() -> None:
    """Stop the home's shared model servers now (the next refresh or query starts one)."""
    from corpusync.adapters.model_server import stop_servers

    stopped = stop_servers(load_settings().home)
    typer.echo(f"stopped {len(stopped)}" if stopped else "not running")


@api_app.command("status")
def api_status(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Whether the shared local API server runs: its URL (for `prefect` commands) and the commands using it."""
    from corpusync.core.prefect_local import shared_status

    info = shared_status()
    if as_json:
        typer.echo(json.dumps(info))
    elif info is None:
        typer.echo("not running")
    else:
        typer.echo(f"{info['url']} (pid {info['pid']}, Prefect {info['prefect']}, "
                   f"{'healthy' if info['healthy'] else 'starting'}, {info['commands']} command(s) using it)")


@api_app.command("stop")
def api_stop() -> None:
    """Stop the shared local API server now (the next refresh starts a new one)."""
    from corpusync.core.prefect_local import stop_shared

    typer.echo("stopped" if stop_shared() else "not running")
