"""load: write a candidate generation (new versions + binary COPY of chunks, retirements) and the
bookkeeping around it (recovery from crashed runs, model registration, quarantine records).

Nothing here changes what readers see: every row written belongs to a generation above the published
one until publish flips the pointer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import psycopg
from pgvector import HalfVector, SparseVector
from psycopg import sql
from psycopg.types.json import Jsonb

from corpusync import db, lexical
from corpusync.embedders import ModelIdentity
from corpusync.errors import ModelMismatch
from schemas.records import EmbeddedDocument, LiveVersion, QuarantineRecord

Vectors = tuple[np.ndarray, dict[int, float] | None]

_COPY_TYPES = ["int8", "int8", "int4", "text", "text", "text", "int4", "int4", "int4", "int4", "int4",
               "text[]", "text", "jsonb", "int4", "halfvec", "sparsevec", "text", "int8", "int4"]


def recover(conn: psycopg.Connection, run_id: int) -> dict[str, int]:
    """Undo whatever a crashed (or rolled-back) candidate left behind. Call holding the writer lock."""
    with conn.transaction():
        published = db.fetch_one(conn, "index_state")["published_generation"]  # type: ignore[index]
        params = {"published": published, "run_id": run_id}
        dropped = db.execute(conn, "discard_unpublished_versions", params)
        reopened = db.execute(conn, "reopen_unpublished_retirements", params)
        db.execute(conn, "discard_unpublished_generations", params)
        crashed = db.execute(conn, "mark_crashed_runs", params)
    return {"versions_discarded": dropped, "versions_reopened": reopened, "runs_marked_crashed": crashed}


def register_model(conn: psycopg.Connection, identity: ModelIdentity) -> int:
    """Insert the model identity if new and make sure its HNSW index(es) exist. Returns its id."""
    params = {"identity_hash": identity.identity_hash, "name": identity.name, "revision": identity.revision,
              "weights_sha256": identity.weights_sha256, "dimension": identity.dimension,
              "pooling": identity.pooling, "normalized": identity.normalized,
              "sparse_trained": identity.sparse_trained, "sparse_dim": identity.sparse_dim,
              "max_tokens": identity.max_tokens}
    with conn.transaction():
        row = db.fetch_one(conn, "insert_model", params)
        assert row is not None
        model_id = int(row["id"])
        db.execute(conn, "create_dense_index", index_name=sql.Identifier(f"chunks_dense_m{model_id}"),
                   dim=sql.Literal(identity.dimension), model_id=sql.Literal(model_id))
        if identity.sparse_trained and identity.sparse_dim:
            db.execute(conn, "create_sparse_index", index_name=sql.Identifier(f"chunks_sparse_m{model_id}"),
                       dim=sql.Literal(identity.sparse_dim), model_id=sql.Literal(model_id))
    return model_id


def check_model(published_model_id: int | None, model_id: int, published_label: str, label: str,
                reembed: bool) -> None:
    """Refuse to mix embedding models in one index unless a full re-embed was asked for."""
    if published_model_id is None or published_model_id == model_id or reembed:
        return
    raise ModelMismatch(
        f"the published index was embedded with {published_label}, but this refresh is configured with "
        f"{label}. Vectors of two models are never mixed: re-embed everything into a new generation with "
        "--reembed, or configure the same model (CORPUSYNC_EMBEDDER / CORPUSYNC_MODEL_PATH)."
    )


def live_versions(conn: psycopg.Connection, generation: int) -> list[LiveVersion]:
    return [LiveVersion(**r) for r in db.fetch_all(conn, "live_versions", {"generation": generation})]


def latest_quarantine(conn: psycopg.Connection) -> dict[str, tuple[str, str]]:
    return {r["path"]: (r["content_sha256"], r["pipeline_fingerprint"])
            for r in db.fetch_all(conn, "latest_quarantine")}


def stored_vectors(conn: psycopg.Connection, model_id: int, hashes: Iterable[str]) -> dict[str, Vectors]:
    """Vectors already in the index for these chunk texts (any retained version), keyed by text hash."""
    wanted = sorted(set(hashes))
    found: dict[str, Vectors] = {}
    for i in range(0, len(wanted), 5000):
        for r in db.fetch_all(conn, "stored_vectors", {"model_id": model_id, "hashes": wanted[i:i + 5000]}):
            dense = np.asarray(r["dense"].to_numpy(), dtype=np.float32)
            sparse = None
            if r["sparse"] is not None:
                sv = r["sparse"]
                sparse = dict(zip((int(k) for k in sv.indices()), (float(v) for v in sv.values()), strict=True))
            found[r["text_sha256"]] = (dense, sparse)
    return found


def record_quarantine(conn: psycopg.Connection, run_id: int, fingerprint: str,
                      records: Sequence[QuarantineRecord]) -> None:
    if not records:
        return
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(db.q("insert_quarantine"), [
            {"run_id": run_id, "path": r.path, "content_sha256": r.content_sha256,
             "pipeline_fingerprint": fingerprint, "stage": r.stage, "reason": r.reason, "error": r.error}
            for r in records
        ])


def retire(conn: psycopg.Connection, version_ids: Sequence[int], generation: int) -> int:
    """Mark versions as gone from `generation` on. Returns how many chunks that retires."""
    if not version_ids:
        return 0
    with conn.transaction():
        rows = db.fetch_all(conn, "retire_versions", {"generation": generation, "version_ids": list(version_ids)})
    return sum(r["chunk_count"] for r in rows)


def load_documents(
    conn: psycopg.Connection,
    docs: Sequence[EmbeddedDocument],
    *,
    run_id: int,
    generation: int,
    model_id: int,
    fingerprint: str,
    chunk_config: dict[str, Any],
    sparse_dim: int | None,
    on_document: Callable[[int], None] | None = None,
    batch_documents: int = 64,
) -> tuple[int, int]:
    """Insert new versions of docs into the candidate generation, retiring the versions they replace.

    Each batch of documents is one transaction: version rows, then one binary COPY of all their chunks.
    Returns (chunks inserted, chunks retired).
    """
    inserted = retired = 0
    for start in range(0, len(docs), batch_documents):
        batch = docs[start:start + batch_documents]
        with conn.transaction():
            rows: list[list[Any]] = []
            replaced = [d.doc.replaces.version_id for d in batch if d.doc.replaces is not None]
            if replaced:
                retired += sum(r["chunk_count"] for r in db.fetch_all(
                    conn, "retire_versions", {"generation": generation, "version_ids": replaced}))
            for ed in batch:
                cd, parsed = ed.doc, ed.doc.parsed
                src = parsed.source
                doc_row = db.fetch_one(conn, "upsert_document", {"path": src.path, "run_id": run_id})
                assert doc_row is not None
                document_id = int(doc_row["id"])
                ver = db.fetch_one(conn, "insert_version", {
                    "document_id": document_id, "content_sha256": src.sha256, "size_bytes": src.size,
                    "mtime": src.mtime, "source_path": src.path, "media_type": parsed.media_type,
                    "parser": parsed.parser, "parser_version": parsed.parser_version,
                    "ocr_engine": parsed.ocr_engine, "ocr_engine_version": parsed.ocr_engine_version,
                    "page_count": parsed.page_count, "char_count": cd.char_count,
                    "chunk_count": len(cd.chunks), "chunk_config": db.as_json(chunk_config),
                    "pipeline_fingerprint": fingerprint, "model_id": model_id, "run_id": run_id,
                    "metadata": db.as_json(parsed.metadata), "cleaning": db.as_json(parsed.cleaning),
                    "generation": generation,
                })
                assert ver is not None
                version_id = int(ver["id"])
                for i, c in enumerate(cd.chunks):
                    sparse = None
                    if ed.sparse is not None and sparse_dim:
                        sparse = SparseVector(ed.sparse[i], sparse_dim)
                    rows.append([
                        version_id, document_id, c.ordinal, c.key, c.text, c.text_sha256, c.token_count,
                        c.page_start, c.page_end, c.char_start, c.char_end, list(c.section_path),
                        c.chunk_type, Jsonb({"prefix_chars": len(c.prefix)} if c.prefix else {}), model_id,
                        HalfVector(ed.dense[i]), sparse,
                        lexical.index_text(c.text), run_id, generation,
                    ])
            with conn.cursor() as cur, cur.copy(db.q("copy_chunks")) as copy:
                copy.set_types(_COPY_TYPES)
                for row in rows:
                    copy.write_row(row)
            inserted += len(rows)
        if on_document:
            on_document(len(batch))
    return inserted, retired
