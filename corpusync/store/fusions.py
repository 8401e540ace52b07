"""Hybrid fusions tuned on gold sets and stored with the index (tasks/tune.py fits them)."""

from __future__ import annotations

from typing import Any

import psycopg

from corpusync.store import db


def latest_fusion(conn: psycopg.Connection, model_id: int, generation: int) -> dict[str, Any] | None:
    """The fusion in force for a generation: the newest tuned for its model on it or an earlier generation
    that was not refused or discarded; None when none was tuned."""
    return db.fetch_one(conn, "latest_fusion", {"model_id": model_id, "generation": generation})


def insert_fusion(conn: psycopg.Connection, *, model_id: int, method: str, weights: dict[str, float],
                  rrf_k: float, goldset: str, goldset_sha256: str, generation: int, folds: int,
                  report: dict[str, Any]) -> int:
    """Store a tuned fusion (committed at once). Returns its id."""
    row = db.fetch_one(conn, "insert_fusion", {
        "model_id": model_id, "method": method, "weights": db.as_json(weights), "rrf_k": rrf_k,
        "goldset": goldset, "goldset_sha256": goldset_sha256, "generation": generation, "folds": folds,
        "report": db.as_json(report),
    })
    conn.commit()
    assert row is not None
    return int(row["id"])
