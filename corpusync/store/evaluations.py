"""Evaluations: what a generation holds for a gold set's questions, stored evaluations (the aggregate row and
its per-question rows) and what baselines and reports read back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg

from corpusync.store import db
from schemas.eval import ChunkRef, Evaluation


def generation_paths(conn: psycopg.Connection, generation: int) -> list[str]:
    """Paths of the documents visible in a generation."""
    return [r["path"] for r in db.fetch_all(conn, "generation_documents", {"generation": generation})]


def lineage_renames(conn: psycopg.Connection, generation: int) -> list[tuple[str, str]]:
    """The renames (old path, new path) in a generation's lineage, oldest first (sql/queries/lineage_renames.sql)."""
    return [(r["from_path"], r["to_path"]) for r in db.fetch_all(conn, "lineage_renames", {"generation": generation})]


def gold_chunks(conn: psycopg.Connection, generation: int, paths: Sequence[str]) -> dict[str, list[ChunkRef]]:
    """The chunks of these documents in a generation, by path, in document order."""
    by_path: dict[str, list[ChunkRef]] = {}
    for r in db.fetch_all(conn, "generation_chunks_of", {"generation": generation, "paths": list(paths)}):
        by_path.setdefault(r["path"], []).append(ChunkRef(
            int(r["chunk_id"]), r["path"], r["text"], r.get("page_start"), r.get("page_end")))
    return by_path


def question_rows(conn: psycopg.Connection, evaluation_id: int, mode: str) -> dict[str, dict[str, Any]]:
    """One stored evaluation's per-question rows in one mode, by question id (scores, first_rank, retrieved)."""
    rows = db.fetch_all(conn, "evaluation_questions", {"evaluation_id": evaluation_id, "mode": mode})
    return {r["question_id"]: r for r in rows}


def goldset_evaluations(conn: psycopg.Connection, goldset_key: str, goldset: str, generation: int,
                        mode: str) -> list[dict[str, Any]]:
    """Stored evaluations of a generation on a gold set (by key, or by name for rows stored before keys),
    newest first: the candidates for its baseline."""
    return db.fetch_all(conn, "goldset_evaluations", {"goldset_key": goldset_key, "goldset": goldset,
                                                      "generation": generation, "mode": mode})


def store_evaluation(conn: psycopg.Connection, ev: Evaluation, run_id: int | None, config: dict[str, Any]) -> int:
    """One transaction: the evaluation row and a COPY of its per-question rows. Sets and returns ev.id."""
    gated = ev.passed is not None
    if ev.notes:
        config = config | {"notes": ev.notes}
    with conn.transaction():
        row = db.fetch_one(conn, "insert_keyed_evaluation", {
            "run_id": run_id, "generation": ev.generation, "model_id": ev.model_id, "goldset": ev.goldset,
            "goldset_key": ev.goldset_key or ev.goldset, "goldset_source": ev.goldset_source or None,
            "goldset_sha256": ev.goldset_sha256, "n_questions": ev.n_questions, "question_limit": ev.question_limit,
            "modes": ev.modes,
            "metrics": db.as_json(ev.metrics), "ragas": db.as_json(ev.ragas), "config": db.as_json(config),
            "baseline_id": ev.baseline_id,
            "gate": db.as_json([c.model_dump() for c in ev.checks]) if gated else None,
            "passed": ev.passed, "overridden": ev.overridden,
        })
        assert row is not None
        ev.id = int(row["id"])
        with conn.cursor() as cur, cur.copy(db.q("copy_evaluation_questions")) as copy:
            for q in ev.questions:
                copy.write_row((ev.id, q.mode, q.question_id, json.dumps(q.scores), q.first_rank, q.retrieved,
                                q.relevant_count))
    return ev.id


def set_report_path(conn: psycopg.Connection, ev: Evaluation, path: str) -> None:
    ev.report_path = path
    db.execute(conn, "set_evaluation_report", {"id": ev.id, "report_path": path})


def chunk_sources(conn: psycopg.Connection, ids: Sequence[int]) -> dict[int, tuple[str, str]]:
    """Source path and text of chunks by id (what reports quote)."""
    rows = db.fetch_all(conn, "chunk_sources", {"ids": list(ids)})
    return {int(r["chunk_id"]): (r["path"], r["text"]) for r in rows}


def goldset_history(conn: psycopg.Connection, goldset_key: str, goldset: str, mode: str) -> list[dict[str, Any]]:
    """A gold set's metric history in one mode, oldest first (the report's plot)."""
    return db.fetch_all(conn, "goldset_history", {"goldset_key": goldset_key, "goldset": goldset, "mode": mode})
