"""Vectors already computed: read back from the index or the vector cache, and the cache's writes.

The cache keeps every embedded batch (keyed by model and chunk-text hash) the moment it is computed, so a
run killed mid-embed does not pay for it again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import psycopg

from corpusync.core import pgcopy
from corpusync.core.vectors import SparseRows, VectorTable
from corpusync.store import db


def stored_vectors(conn: psycopg.Connection, model_id: int, hashes: Iterable[str], *, dimension: int,
                   sparse: bool) -> VectorTable:
    """Vectors already computed for these chunk texts, keyed by text hash: in the index (any retained
    version) or in the vector cache (batches of runs that never published them)."""
    wanted = sorted(set(hashes))
    rows: dict[str, int] = {}
    dense: list[np.ndarray] = []
    weights: list[dict[int, float]] = []
    for i in range(0, len(wanted), 5000):
        for r in db.fetch_all(conn, "stored_vectors", {"model_id": model_id, "hashes": wanted[i:i + 5000]}):
            rows[r["text_sha256"]] = len(dense)
            dense.append(r["dense"].to_numpy())
            sv = r["sparse"]
            weights.append(dict(zip(sv.indices(), sv.values(), strict=True)) if sv is not None else {})
    if not rows:
        return VectorTable.empty(dimension, sparse)
    return VectorTable(rows, np.stack(dense).astype(np.float32),
                       SparseRows.from_dicts(weights) if sparse else None)


def cache_vectors(conn: psycopg.Connection, model_id: int, hashes: Sequence[str], dense: np.ndarray,
                  sparse: SparseRows | None, sparse_dim: int | None) -> None:
    """Keep one embedded batch in the vector cache, committed at once in its own transaction (the caller's
    connection is in autocommit mode, outside any candidate write), so a run killed after this batch
    does not embed it again. One binary COPY into the session's staging table, then an insert that keeps
    rows already cached (ON CONFLICT DO NOTHING)."""
    if not hashes:
        return
    from tasks.load import cache_fields  # here, not at import: tasks.load brings pyarrow (prune needs none)

    fields = cache_fields(model_id, hashes, dense, sparse, sparse_dim)
    with conn.transaction():
        db.execute(conn, "create_vector_cache_stage")
        with conn.cursor() as cur, cur.copy(db.q("copy_vector_cache_stage")) as copy:
            copy.write(pgcopy.HEADER)
            copy.write(pgcopy.encode_rows(fields))
            copy.write(pgcopy.TRAILER)
        db.execute(conn, "insert_vector_cache")


def prune_vector_cache(conn: psycopg.Connection, published: int, ttl_h: float) -> int:
    """Delete cached vectors that a chunk of a version crash recovery keeps (born in the published generation
    or before) already holds, and those no chunk holds that are older than ttl_h hours. Rows only an
    unpublished candidate holds stay: recovery deletes that candidate, and the next run reuses them."""
    return db.execute(conn, "prune_vector_cache", {"published": published, "ttl_h": float(ttl_h)})
