"""Bulk reads for exports (corpusync.app.analytics): a generation's chunks streamed through a server-side cursor."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from corpusync.store import db


@contextmanager
def chunk_batches(conn: psycopg.Connection, generation: int, columns: Sequence[str], *, vectors: bool,
                  batch_size: int) -> Iterator[Iterator[list[tuple[Any, ...]]]]:
    """The chunks of `generation` (corpusync.chunks_at: `columns` of it, plus `dense` as real[] with
    `vectors`), ordered by path and ordinal, in lists of at most `batch_size` rows. One read transaction
    and a server-side cursor for as long as the block runs, so memory stays bounded."""
    query = db.q("export_chunks_with_vectors" if vectors else "export_chunks",
                 columns=sql.SQL(", ").join(sql.Identifier("x", c) for c in columns))
    with conn.transaction(), conn.cursor(name="corpusync_export") as cur:
        cur.itersize = batch_size
        cur.execute(query, {"generation": generation})
        yield iter(lambda: cur.fetchmany(batch_size), [])
