"""prune: physically delete rows that no retained generation can show any more."""

from __future__ import annotations

import psycopg

from corpusync import db


def prune(conn: psycopg.Connection, retention: int) -> dict[str, int]:
    """Keep the published generation and `retention` earlier published ones; delete everything older.

    Returns the numbers of versions, chunks and documents deleted.
    """
    with conn.transaction():
        state = db.fetch_one(conn, "index_state")
        assert state is not None
        published = int(state["published_generation"])
        if published == 0:
            return {"versions": 0, "chunks": 0, "documents": 0, "oldest_retained": 0}
        kept = [r["generation"] for r in
                db.fetch_all(conn, "retained_generations", {"published": published, "retention": retention})]
        oldest = min(kept) if kept else published
        rows = db.fetch_all(conn, "prune_versions", {"oldest_retained": oldest})
        db.execute(conn, "expire_generations", {"oldest_retained": oldest})
        documents = db.execute(conn, "prune_documents")
    return {"versions": len(rows), "chunks": sum(r["chunk_count"] for r in rows), "documents": documents,
            "oldest_retained": oldest}
