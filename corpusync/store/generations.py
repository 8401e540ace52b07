"""Generations and the one-row published pointer: candidate, publish, mark, rollback, prune, and the reads
around them (index state, a generation's model, the mass-delete guard's reference).

publish and rollback are one transaction each: readers see the old generation or the new one, never a mix.
"""

from __future__ import annotations

from typing import Any

import psycopg

from corpusync.core.errors import CorpusyncError, RollbackError
from corpusync.store import db
from corpusync.store.vector_cache import prune_vector_cache
from schemas.settings import Settings

VECTOR_CACHE_TTL_H = float(Settings.model_fields["vector_cache_ttl_h"].default)


def index_state(conn: psycopg.Connection) -> dict[str, Any] | None:
    """The published generation and its model (published_generation 0 and model_id None: nothing yet)."""
    return db.fetch_one(conn, "index_state")


def published_generation(conn: psycopg.Connection) -> int | None:
    """Just the published generation's number (0: nothing published; None: no index_state row)."""
    row = db.fetch_one(conn, "published_generation")
    return None if row is None else row["published_generation"]


def generation_model(conn: psycopg.Connection, generation: int) -> dict[str, Any] | None:
    """A generation's status and embedding model (name, dimension, identity), None when it does not exist."""
    return db.fetch_one(conn, "generation_model", {"generation": generation})


def recent_generations(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """The ten newest generations with their status and model name (db status)."""
    return db.fetch_all(conn, "generations_list")


def previous_published(conn: psycopg.Connection, generation: int) -> dict[str, Any] | None:
    """The newest earlier generation that was live and not rolled back: generation, status, searchable."""
    return db.fetch_one(conn, "previous_published_generation", {"generation": generation})


def mass_delete_reference(conn: psycopg.Connection, window_h: float) -> dict[str, Any] | None:
    """The largest generation published in the last `window_h` hours, since the last publish a user allowed
    to delete many documents (that one resets the reference)."""
    return db.fetch_one(conn, "mass_delete_reference", {"window_s": window_h * 3600.0})


def create_candidate(conn: psycopg.Connection, run_id: int, model_id: int) -> int:
    """A new candidate generation above every existing one. Returns its number."""
    with conn.transaction():
        row = db.fetch_one(conn, "next_generation")
        assert row is not None
        generation = int(row["generation"])
        db.execute(conn, "insert_generation", {"generation": generation, "run_id": run_id, "model_id": model_id})
    return generation


def publish(conn: psycopg.Connection, generation: int, base_generation: int, model_id: int) -> list[str]:
    """Make `generation` the live one, and close the quarantine records of the paths it indexes anew (returned,
    sorted). One transaction; fails if someone else moved the pointer."""
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
        closed = db.fetch_all(conn, "close_indexed_quarantine", {"generation": generation})
    return sorted({row["path"] for row in closed})


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


def prune(conn: psycopg.Connection, retention: int,
          vector_cache_ttl_h: float = VECTOR_CACHE_TTL_H) -> dict[str, int]:
    """Keep the published generation and `retention` earlier published ones; delete everything older, and
    the cached vectors no longer needed (corpusync.store.vector_cache.prune_vector_cache). One transaction.

    Returns the numbers of versions, chunks, documents and cached vectors deleted.
    """
    with conn.transaction():
        state = db.fetch_one(conn, "index_state")
        assert state is not None
        published = int(state["published_generation"])
        if published == 0:
            return {"versions": 0, "chunks": 0, "documents": 0, "oldest_retained": 0,
                    "cached_vectors": prune_vector_cache(conn, published, vector_cache_ttl_h)}
        kept = [r["generation"] for r in
                db.fetch_all(conn, "retained_generations", {"published": published, "retention": retention})]
        oldest = min(kept) if kept else published
        rows = db.fetch_all(conn, "prune_versions", {"oldest_retained": oldest})
        db.execute(conn, "expire_generations", {"oldest_retained": oldest})
        documents = db.execute(conn, "prune_documents")
        cached = prune_vector_cache(conn, published, vector_cache_ttl_h)
    return {"versions": len(rows), "chunks": sum(r["chunk_count"] for r in rows), "documents": documents,
            "oldest_retained": oldest, "cached_vectors": cached}
