"""What `corpusync db status` reports: server versions and row counts."""

from __future__ import annotations

from typing import Any

import psycopg

from corpusync.store import db


def server_versions(conn: psycopg.Connection) -> tuple[str | None, str | None]:
    """(PostgreSQL's version, pgvector's version or None when the extension is missing)."""
    row = db.fetch_one(conn, "server_versions")
    return (row["postgresql"], row["pgvector"]) if row else (None, None)


def row_counts(conn: psycopg.Connection) -> dict[str, Any]:
    """Rows per table (documents, versions, chunks, live chunks and documents, quarantine, runs, generations)."""
    return db.fetch_one(conn, "db_counts") or {}
