"""Run records, the single writer's advisory lock, and recovery from crashed runs."""

from __future__ import annotations

from typing import Any

import psycopg

from corpusync.store import db
from schemas.records import RunHolder


def try_writer_lock(conn: psycopg.Connection) -> bool:
    """Take the session-level writer lock if it is free (PostgreSQL releases it when the session ends)."""
    row = db.fetch_one(conn, "try_writer_lock", {"key": db.WRITER_LOCK_KEY})
    return bool(row and row["locked"])


def running_run(conn: psycopg.Connection) -> RunHolder | None:
    """The newest run still marked running (who holds the lock, for the message of a refused writer)."""
    row = db.fetch_one(conn, "running_run")
    return RunHolder(int(row["id"]), row["started_at"], row["hostname"], row["pid"]) if row else None


def start_run(conn: psycopg.Connection, *, kind: str, source_root: str, config: dict[str, Any], config_hash: str,
              code_version: str, base_generation: int, model_id: int | None, prefect_flow_run_id: str | None,
              hostname: str, pid: int) -> int:
    """Record a run as running (its own transaction). Returns its id."""
    with conn.transaction():
        row = db.fetch_one(conn, "start_run", {
            "kind": kind, "source_root": source_root, "config": db.as_json(config), "config_hash": config_hash,
            "code_version": code_version, "base_generation": base_generation, "model_id": model_id,
            "prefect_flow_run_id": prefect_flow_run_id, "hostname": hostname, "pid": pid,
        })
    assert row is not None
    return int(row["id"])


def finish_run(conn: psycopg.Connection, run_id: int, *, status: str, generation: int, published: bool,
               counts: dict[str, Any], timings: dict[str, float], message: str | None) -> None:
    """Record how a run ended, with its counts and timings (its own transaction)."""
    with conn.transaction():
        db.execute(conn, "finish_run", {
            "run_id": run_id, "status": status, "generation": generation, "published": published,
            "counts": db.as_json(counts), "timings": db.as_json(timings), "message": message,
        })


def recover(conn: psycopg.Connection, run_id: int) -> dict[str, int]:
    """Undo whatever a crashed (or rolled-back) candidate left behind. Call holding the writer lock."""
    with conn.transaction():
        published = db.fetch_one(conn, "index_state")["published_generation"]  # type: ignore[index]
        params = {"published": published, "run_id": run_id}
        dropped = db.execute(conn, "discard_unpublished_versions", params)
        reopened = db.execute(conn, "reopen_unpublished_retirements", params)
        db.execute(conn, "discard_unpublished_generations", params)
        ended = [r["status"] for r in db.fetch_all(conn, "mark_crashed_runs", params)]
    # a run that died after its publish committed is recorded as published: nothing of it was undone
    return {"versions_discarded": dropped, "versions_reopened": reopened,
            "runs_marked_crashed": ended.count("crashed"), "runs_finished_after_publish": ended.count("published")}
