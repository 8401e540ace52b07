"""The hybrid search statement (corpusync.search_hybrid through sql/queries/search.sql)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from corpusync.store import db


def search_rows(conn: psycopg.Connection, params: Mapping[str, Any], ef_search: int) -> list[dict[str, Any]]:
    """One search's hits, in one transaction with hnsw.ef_search set for it alone. `params`: the named
    parameters of search.sql. psycopg.errors.RaiseException: the SQL function's own, user-facing errors."""
    with conn.transaction():
        db.execute(conn, "set_ef_search", ef_search=sql.Literal(ef_search))
        return db.fetch_all(conn, "search", dict(params))
