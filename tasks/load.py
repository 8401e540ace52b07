"""load: write a candidate generation (new versions + binary COPY of chunks, retirements) and the
bookkeeping around it (recovery from crashed runs, model registration, quarantine records).

Nothing here changes what readers see: every row written belongs to a generation above the published
one until publish flips the pointer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from corpusync import db, pgcopy
from corpusync.embedders import ModelIdentity
from corpusync.errors import ModelMismatch
from corpusync.vectors import (
    DENSE,
    SEARCH_TEXT,
    SPARSE_INDICES,
    SPARSE_VALUES,
    TERM_FREQS,
    TERMS,
    SparseRows,
    VectorTable,
    matrix_of,
)
from schemas.records import EmbeddedDocument, LiveVersion, QuarantineRecord
from tasks.diff import QuarantineState, counts_as_attempt
from tasks.discover import access_of


def recover(conn: psycopg.Connection, run_id: int) -> dict[str, int]:
    """Undo whatever a crashed (or rolled-back) candidate left behind. Call holding the writer lock."""
    with conn.transaction():
        published = db.fetch_one(conn, "index_state")["published_generation"]  # type: ignore[index]
        params = {"published": published, "run_id": run_id}
        dropped = db.execute(conn, "discard_unpublished_versions", params)
        reopened = db.execute(conn, "reopen_unpublished_retirements", params)
        db.execute(conn, "discard_unpublished_generations", params)
        ended = [r["status"] for r in db.fetch_all(conn, "mark_crashed_runs", params)]
    # a run that died after its publish committed is recorded as published: nothing of it was undone
    return {"versions_discarded": dropped, "versions_reopened": reopened,
            "runs_marked_crashed": ended.count("crashed"), "runs_finished_after_publish": ended.count("published")}


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


def latest_quarantine(conn: psycopg.Connection, paths: Sequence[str] | None = None) -> dict[str, QuarantineState]:
    """Each path's latest quarantine record with the streak of identical failures it ends (all paths, or
    those given): what the diff skips and the retry back-off is computed from."""
    params = {"paths": list(paths) if paths is not None else None}
    return {r["path"]: QuarantineState(r["content_sha256"], r["pipeline_fingerprint"], r["stage"], r["reason"],
                                       r["error"], r["attempts"], r["since"], r["last_at"])
            for r in db.fetch_all(conn, "latest_quarantine", params)}


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
    n = len(hashes)
    fields = [pgcopy.int_field(np.full(n, model_id, np.int64), 4), pgcopy.text_field(list(hashes)),
              pgcopy.halfvec_field(np.asarray(dense, np.float32)),
              pgcopy.sparsevec_field(sparse if sparse_dim else None, n, sparse_dim)]
    with conn.transaction():
        db.execute(conn, "create_vector_cache_stage")
        with conn.cursor() as cur, cur.copy(db.q("copy_vector_cache_stage")) as copy:
            copy.write(pgcopy.HEADER)
            copy.write(pgcopy.encode_rows(fields))
            copy.write(pgcopy.TRAILER)
        db.execute(conn, "insert_vector_cache")


def record_quarantine(conn: psycopg.Connection, run_id: int, fingerprint: str,
                      records: Sequence[QuarantineRecord]) -> set[str]:
    """Write the records; returns the paths written. A re-read of a known bad file (a record equal to its
    path's latest one, error included, from a stage that meets every file on every run:
    tasks.diff.counts_as_attempt) is not written again, so a file rejected the same way each run keeps one row."""
    if not records:
        return set()
    written: set[str] = set()
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(db.q("insert_quarantine"), [
            {"run_id": run_id, "path": r.path, "content_sha256": r.content_sha256,
             "pipeline_fingerprint": fingerprint, "stage": r.stage, "reason": r.reason, "error": r.error,
             "attempt": counts_as_attempt(r)}
            for r in records
        ], returning=True)
        for r, _ in zip(records, cur.results(), strict=True):
            if cur.fetchone() is not None:
                written.add(r.path)
    return written


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

    Each batch of documents is one transaction: version rows, then one binary COPY of all their chunks,
    encoded column by column from the documents' Arrow vector batches (corpusync.pgcopy).
    Returns (chunks inserted, chunks retired).
    """
    inserted = retired = 0
    for start in range(0, len(docs), batch_documents):
        batch = docs[start:start + batch_documents]
        with conn.transaction():
            replaced = [d.doc.replaces.version_id for d in batch if d.doc.replaces is not None]
            if replaced:
                retired += sum(r["chunk_count"] for r in db.fetch_all(
                    conn, "retire_versions", {"generation": generation, "version_ids": replaced}))
            ids = [_insert_version(conn, ed, run_id=run_id, generation=generation, model_id=model_id,
                                   fingerprint=fingerprint, chunk_config=chunk_config) for ed in batch]
            with conn.cursor() as cur, cur.copy(db.q("copy_chunks")) as copy:
                copy.write(pgcopy.HEADER)
                for fields in chunk_fields(batch, ids, model_id=model_id, run_id=run_id, generation=generation,
                                           sparse_dim=sparse_dim):
                    copy.write(pgcopy.encode_rows(fields))
                copy.write(pgcopy.TRAILER)
            postings = posting_fields(conn, batch, [v for _, v in ids])
            if postings is not None:
                with conn.cursor() as cur, cur.copy(db.q("copy_postings")) as copy:
                    copy.write(pgcopy.HEADER)
                    copy.write(pgcopy.encode_rows(postings))
                    copy.write(pgcopy.TRAILER)
            inserted += sum(len(ed.doc.chunks) for ed in batch)
        if on_document:
            on_document(len(batch))
    return inserted, retired


def _insert_version(conn: psycopg.Connection, ed: EmbeddedDocument, *, run_id: int, generation: int,
                    model_id: int, fingerprint: str, chunk_config: dict[str, Any]) -> tuple[int, int]:
    """The document row (upserted) and its new version row. Returns (document id, version id)."""
    cd, parsed = ed.doc, ed.doc.parsed
    src = parsed.source
    doc_row = db.fetch_one(conn, "upsert_document", {"path": src.path, "run_id": run_id})
    assert doc_row is not None
    ver = db.fetch_one(conn, "insert_version", {
        "document_id": int(doc_row["id"]), "content_sha256": src.sha256, "size_bytes": src.size,
        "mtime": src.mtime, "source_path": src.path, "media_type": parsed.media_type,
        "parser": parsed.parser, "parser_version": parsed.parser_version,
        "ocr_engine": parsed.ocr_engine, "ocr_engine_version": parsed.ocr_engine_version,
        "page_count": parsed.page_count, "char_count": cd.char_count,
        "chunk_count": len(cd.chunks), "chunk_config": db.as_json(chunk_config),
        "pipeline_fingerprint": fingerprint, "model_id": model_id, "run_id": run_id,
        "metadata": db.as_json(parsed.metadata), "cleaning": db.as_json(parsed.cleaning),
        "generation": generation, "lexical_tokens": lexical_tokens(ed), **access_of(parsed.metadata),
    })
    assert ver is not None
    return int(doc_row["id"]), int(ver["id"])


def lexical_tokens(ed: EmbeddedDocument) -> int:
    """The document's chunks' lexical lengths added up (BM25's average length is counted from these)."""
    if TERM_FREQS not in ed.vectors.schema.names:
        return 0
    return int(pc.sum(ed.vectors.column(TERM_FREQS).flatten()).as_py() or 0)


def term_ids(conn: psycopg.Connection, terms: Sequence[str]) -> dict[str, int]:
    """Stable ids for terms, new ones added to the lexicon (in the caller's transaction)."""
    out: dict[str, int] = {}
    for i in range(0, len(terms), 20000):
        part = list(terms[i:i + 20000])
        db.execute(conn, "upsert_terms", {"terms": part})
        out.update((r["term"], int(r["id"])) for r in db.fetch_all(conn, "term_ids", {"terms": part}))
    return out


def posting_fields(conn: psycopg.Connection, docs: Sequence[EmbeddedDocument],
                   version_ids: Sequence[int]) -> list[pgcopy.Field] | None:
    """The columns of copy_postings for these documents' chunks (None when they have no lexical terms):
    term ids come from one dictionary encoding of all terms of the batch, the rest is array arithmetic."""
    if not docs or TERMS not in docs[0].vectors.schema.names:
        return None
    vectors = pa.Table.from_batches([ed.vectors for ed in docs])
    terms = vectors.column(TERMS).combine_chunks()
    flat = terms.flatten()
    if len(flat) == 0:
        return None
    encoded = pc.dictionary_encode(flat)
    ids = term_ids(conn, encoded.dictionary.to_pylist())
    id_of = np.array([ids[t] for t in encoded.dictionary.to_pylist()], np.int64)
    per_chunk = pc.list_value_length(terms).to_numpy(zero_copy_only=False).astype(np.int64)
    tf = vectors.column(TERM_FREQS).combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    ends = np.cumsum(per_chunk)
    cum = np.concatenate([[0], np.cumsum(tf)])
    dl = cum[ends] - cum[ends - per_chunk]
    counts = [len(ed.doc.chunks) for ed in docs]
    version = np.repeat(np.asarray(version_ids, np.int64), counts)
    ordinal = np.fromiter((c.ordinal for ed in docs for c in ed.doc.chunks), np.int64, sum(counts))
    return [
        pgcopy.int_field(id_of[encoded.indices.to_numpy(zero_copy_only=False)], 4),
        pgcopy.int_field(np.repeat(version, per_chunk), 8),
        pgcopy.int_field(np.repeat(ordinal, per_chunk), 4),
        pgcopy.int_field(tf, 4),
        pgcopy.int_field(np.repeat(dl, per_chunk), 4),
    ]


def chunk_fields(docs: Sequence[EmbeddedDocument], ids: Sequence[tuple[int, int]], *, model_id: int, run_id: int,
                 generation: int, sparse_dim: int | None, rows_per_slice: int = 4096) -> Iterator[list[pgcopy.Field]]:
    """The columns of copy_chunks for these documents' chunks, encoded, in slices of about rows_per_slice
    (bounds the encoder's scratch memory). ids: (document id, version id) per document."""
    group: list[int] = []
    size = 0
    for i, ed in enumerate(docs):
        group.append(i)
        size += len(ed.doc.chunks)
        if size >= rows_per_slice or i == len(docs) - 1:
            yield _encode_chunks([docs[j] for j in group], [ids[j] for j in group], model_id, run_id, generation,
                                 sparse_dim)
            group, size = [], 0


def _encode_chunks(docs: Sequence[EmbeddedDocument], ids: Sequence[tuple[int, int]], model_id: int, run_id: int,
                   generation: int, sparse_dim: int | None) -> list[pgcopy.Field]:
    chunks = [c for ed in docs for c in ed.doc.chunks]
    n = len(chunks)
    counts = [len(ed.doc.chunks) for ed in docs]
    vectors = pa.Table.from_batches([ed.vectors for ed in docs])
    dense = vectors.column(DENSE).combine_chunks()
    sparse = None
    if sparse_dim and SPARSE_INDICES in vectors.column_names:
        sparse = SparseRows.from_arrow(vectors.column(SPARSE_INDICES).combine_chunks(),
                                       vectors.column(SPARSE_VALUES).combine_chunks())
    section_offsets = np.zeros(n + 1, np.int64)
    np.cumsum([len(c.section_path) for c in chunks], out=section_offsets[1:])

    def ints(values: Iterable[int | None], width: int = 4) -> pgcopy.Field:
        return pgcopy.int_field(list(values), width)

    return [
        pgcopy.int_field(np.repeat(np.array([v for _, v in ids], np.int64), counts), 8),
        pgcopy.int_field(np.repeat(np.array([d for d, _ in ids], np.int64), counts), 8),
        ints(c.ordinal for c in chunks),
        pgcopy.text_field([c.key for c in chunks]),
        pgcopy.text_field([c.text for c in chunks]),
        pgcopy.text_field([c.text_sha256 for c in chunks]),
        ints(c.token_count for c in chunks),
        ints(c.page_start for c in chunks),
        ints(c.page_end for c in chunks),
        ints(c.char_start for c in chunks),
        ints(c.char_end for c in chunks),
        pgcopy.text_array_field(section_offsets, [s for c in chunks for s in c.section_path]),
        pgcopy.text_field([c.chunk_type for c in chunks]),
        pgcopy.jsonb_field([f'{{"prefix_chars": {len(c.prefix)}}}' if c.prefix else "{}" for c in chunks]),
        pgcopy.int_field(np.full(n, model_id, np.int64), 4),
        pgcopy.halfvec_field(matrix_of(dense)),
        pgcopy.sparsevec_field(sparse, n, sparse_dim),
        pgcopy.text_field(vectors.column(SEARCH_TEXT).combine_chunks() if SEARCH_TEXT in vectors.column_names
                          else [""] * n),
        pgcopy.int_field(np.full(n, run_id, np.int64), 8),
        pgcopy.int_field(np.full(n, generation, np.int64), 4),
    ]
