"""publish / rollback: flip the one-row generation pointer, in one transaction each."""

from __future__ import annotations

from typing import Any

import psycopg

from corpusync import db
from corpusync.errors import CorpusyncError, MassDeleteRefused, RollbackError
from schemas.records import DiffPlan


def check_mass_delete(plan: DiffPlan, max_fraction: float, allow: bool,
                      reference: dict[str, Any] | None = None) -> None:
    """Refuse a refresh that would remove more than max_fraction of the live documents, or that would take
    the index more than max_fraction below `reference` (the largest generation published recently: see
    mass_delete_reference), so several refreshes in a row cannot empty it a slice at a time."""
    if allow or plan.live_before == 0 or not plan.deleted:
        return
    advice = ("If the source folder is mounted and the deletions are intended, run again with --allow-mass-delete "
              "(or raise CORPUSYNC_MAX_DELETE_FRACTION). Nothing was changed; the published generation stays live.")
    share = len(plan.deleted) / plan.live_before
    if share > max_fraction:
        raise MassDeleteRefused(
            f"this refresh would remove {len(plan.deleted)} of {plan.live_before} live documents "
            f"({share:.0%} > the {max_fraction:.0%} limit). {advice}"
        )
    if reference is None or not reference["live_documents"]:
        return
    before = int(reference["live_documents"])
    after = plan.live_before - len(plan.deleted) + len(plan.new)
    drop = (before - after) / before
    if drop > max_fraction:
        raise MassDeleteRefused(
            f"this refresh would leave {after} live documents where generation {reference['generation']} "
            f"(published {reference['published_at']:%Y-%m-%d %H:%M}) had {before}: {drop:.0%} fewer across recent "
            f"refreshes (> the {max_fraction:.0%} limit, counted over CORPUSYNC_MASS_DELETE_WINDOW_H). {advice}"
        )


def mass_delete_reference(conn: psycopg.Connection, window_h: float) -> dict[str, Any] | None:
    """The largest generation published in the last `window_h` hours, since the last publish a user allowed
    to delete many documents (that one resets the reference)."""
    return db.fetch_one(conn, "mass_delete_reference", {"window_s": window_h * 3600.0})


def create_candidate(conn: psycopg.Connection, run_id: int, model_id: int) -> int:
    with conn.transaction():
        row = db.fetch_one(conn, "next_generation")
        assert row is not None
        generation = int(row["generation"])
        db.execute(conn, "insert_generation", {"generation": generation, "run_id": run_id, "model_id": model_id})
    return generation


def publish(conn: psycopg.Connection, generation: int, base_generation: int, model_id: int) -> None:
    """Make `generation` the live one. One transaction; fails if someone else moved the pointer."""
    with conn.transaction():
        state = db.fetch_one(conn, "index_state_for_update")
        assert state is not None
        if state["published_generation"] != base_generation:
            raise CorpusyncError(
                f"the published generation moved from {base_generation} to {state['published_generation']} "
                "while this refresh ran (a rollback?); the candidate was not published"
            )
        db.execute(conn, "supersede_generation", {"generation": base_generation})
        db.execute(conn, "set_generation_status", {"generation": generation, "status": "published"})
        db.execute(conn, "publish_generation", {"generation": generation, "model_id": model_id})
        db.execute(conn, "record_generation_size", {"generation": generation})


def mark_generation(conn: psycopg.Connection, generation: int, status: str) -> None:
    with conn.transaction():
        db.execute(conn, "set_generation_status", {"generation": generation, "status": status})


def rollback(conn: psycopg.Connection) -> tuple[int, int]:
    """Make the previous retained generation live again. Returns (from, to). Instant: one UPDATE."""
    with conn.transaction():
        state = db.fetch_one(conn, "index_state_for_update")
        assert state is not None
        current = int(state["published_generation"])
        target = db.fetch_one(conn, "rollback_target", {"published": current})
        if target is None:
            raise RollbackError(
                f"generation {current} is live and no earlier generation is retained to roll back to "
                "(retention is CORPUSYNC_RETENTION_GENERATIONS)"
            )
        to = int(target["generation"])
        db.execute(conn, "set_generation_status", {"generation": current, "status": "rolled_back"})
        db.execute(conn, "set_generation_status", {"generation": to, "status": "published"})
        db.execute(conn, "publish_generation", {"generation": to, "model_id": target["model_id"]})
    return current, to
