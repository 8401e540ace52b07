"""prune: physically delete rows that no retained generation can show any more."""

from __future__ import annotations

import psycopg

from corpusync import db
from schemas.settings import Settings

VECTOR_CACHE_TTL_H = float(Settings.model_fields["vector_cache_ttl_h"].default)


def prune(conn: psycopg.Connection, retention: int,
          vector_cache_ttl_h: float = VECTOR_CACHE_TTL_H) -> dict[str, int]:
    """Keep the published generation and `retention` earlier published ones; delete everything older, and
    the cached vectors no longer needed (tasks.prune.prune_vector_cache).

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


def prune_vector_cache(conn: psycopg.Connection, published: int, ttl_h: float) -> int:
    """Delete cached vectors that a chunk of a version crash recovery keeps (born in the published generation
    or before) already holds, and those no chunk holds that are older than ttl_h hours. Rows only an
    unpublished candidate holds stay: recovery deletes that candidate, and the next run reuses them."""
    return db.execute(conn, "prune_vector_cache", {"published": published, "ttl_h": float(ttl_h)})
