"""Documents and their versions: embedding models, the versions a generation serves, quarantine records,
retirements, and loading new versions (version rows + binary COPY of chunks and postings) into a candidate.

Nothing here changes what readers see: every row written belongs to a generation above the published one
until corpusync.store.generations.publish flips the pointer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from corpusync.core import pgcopy
from corpusync.store import db
from schemas.records import EmbeddedDocument, LiveVersion, QuarantineRecord
from tasks.diff import QuarantineState, counts_as_attempt
from tasks.discover import access_of
from tasks.load import batch_terms, chunk_fields, lexical_tokens, posting_fields

if TYPE_CHECKING:
    from corpusync.adapters.embedding import ModelIdentity

log = logging.getLogger(__name__)


def find_model(conn: psycopg.Connection, identity_hash: str) -> int | None:
    """The id of the registered model with this identity, None when it was never registered."""
    row = db.fetch_one(conn, "find_model", {"identity_hash": identity_hash})
    return int(row["id"]) if row else None


def register_model(conn: psycopg.Connection, identity: ModelIdentity) -> int:
    """Insert the model identity if new. Returns its id. Its HNSW indexes come later (index_model), once a
    build has loaded the model's chunks."""
    params = {"identity_hash": identity.identity_hash, "name": identity.name, "revision": identity.revision,
              "weights_sha256": identity.weights_sha256, "dimension": identity.dimension,
              "pooling": identity.pooling, "normalized": identity.normalized,
              "sparse_trained": identity.sparse_trained, "sparse_dim": identity.sparse_dim,
              "max_tokens": identity.max_tokens}
    with conn.transaction():
        row = db.fetch_one(conn, "insert_model", params)
    assert row is not None
    return int(row["id"])


def index_model(conn: psycopg.Connection, model_id: int, identity: ModelIdentity, *, memory: str,
                workers: int | None) -> list[str]:
    """Create the model's missing HNSW index(es), dense and (for trained sparse weights) sparse, and return
    their names. A refresh calls this after its last batch is loaded and before the candidate is evaluated
    or published, so a first build (or a model switch) builds each index once from all its rows, in
    parallel, instead of inserting every chunk into the graph as it is loaded: ~5x less work for 1024-d
    vectors on one core (bench/index_build.py), and the cost that dominated a first build on a GPU machine.
    Later refreshes find the indexes and insert into them as they load."""
    wanted = [("create_dense_index", f"chunks_dense_m{model_id}", identity.dimension)]
    if identity.sparse_trained and identity.sparse_dim:
        wanted.append(("create_sparse_index", f"chunks_sparse_m{model_id}", identity.sparse_dim))
    built = []
    for query, name, dim in wanted:
        row = db.fetch_one(conn, "index_exists", {"name": f"corpusync.{name}"})
        if row and row["present"]:
            continue
        try:
            _build_index(conn, query, name, dim, model_id, memory=memory, workers=workers)
        except (psycopg.errors.DiskFull, psycopg.errors.OutOfMemory) as exc:
            # a parallel build's shared-memory segment did not fit (a container's small /dev/shm): serially
            log.warning("building %s in parallel ran out of shared memory (%s); building it serially", name,
                        str(exc).strip().splitlines()[0])
            _build_index(conn, query, name, dim, model_id, memory=memory, workers=0)
        built.append(name)
    return built


def _build_index(conn: psycopg.Connection, query: str, name: str, dim: int, model_id: int, *, memory: str,
                 workers: int | None) -> None:
    with conn.transaction():
        db.execute(conn, "index_build_settings", {"memory": memory, "workers": workers})
        db.execute(conn, query, index_name=sql.Identifier(name), dim=sql.Literal(dim),
                   model_id=sql.Literal(model_id))


def live_versions(conn: psycopg.Connection, generation: int) -> list[LiveVersion]:
    return [LiveVersion(**r) for r in db.fetch_all(conn, "live_versions", {"generation": generation})]


def latest_quarantine(conn: psycopg.Connection, paths: Sequence[str] | None = None) -> dict[str, QuarantineState]:
    """Each path's latest quarantine record with the streak of identical failures it ends (all paths, or
    those given): what the diff skips and the retry back-off is computed from."""
    params = {"paths": list(paths) if paths is not None else None}
    return {r["path"]: QuarantineState(r["content_sha256"], r["pipeline_fingerprint"], r["stage"], r["reason"],
                                       r["error"], r["attempts"], r["since"], r["last_at"])
            for r in db.fetch_all(conn, "latest_quarantine", params)}


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


def close_quarantine(conn: psycopg.Connection, run_id: int, closed: Mapping[str, str]) -> int:
    """Close the open quarantine records of the paths given (path -> resolution: tasks.diff.closed_quarantine)
    in run `run_id`; returns how many records that closed."""
    if not closed:
        return 0
    with conn.transaction():
        return db.execute(conn, "close_quarantine", {"run_id": run_id, "paths": list(closed),
                                                     "resolutions": list(closed.values())})


def retire(conn: psycopg.Connection, version_ids: Sequence[int], generation: int) -> int:
    """Mark versions as gone from `generation` on. Returns how many chunks that retires."""
    if not version_ids:
        return 0
    with conn.transaction():
        rows = db.fetch_all(conn, "retire_versions", {"generation": generation, "version_ids": list(version_ids)})
    return sum(r["chunk_count"] for r in rows)


def record_renames(conn: psycopg.Connection, generation: int, run_id: int, pairs: Sequence[tuple[str, str]]) -> None:
    """The renames (old path, new path) the candidate `generation` was built with (evaluation follows them)."""
    if pairs:
        with conn.transaction():
            db.execute(conn, "insert_renames", {"generation": generation, "run_id": run_id,
                                                "from_paths": [a for a, _ in pairs], "to_paths": [b for _, b in pairs]})


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
    then one of their lexical postings (columns from tasks.load). Returns (chunks inserted, chunks retired).
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
            terms = batch_terms(batch)
            if terms is not None:
                postings = posting_fields(batch, [v for _, v in ids], terms, term_ids(conn, terms.terms))
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


def term_ids(conn: psycopg.Connection, terms: Sequence[str]) -> dict[str, int]:
    """Stable ids for terms, new ones added to the lexicon (in the caller's transaction)."""
    out: dict[str, int] = {}
    for i in range(0, len(terms), 20000):
        part = list(terms[i:i + 20000])
        db.execute(conn, "upsert_terms", {"terms": part})
        out.update((r["term"], int(r["id"])) for r in db.fetch_all(conn, "term_ids", {"terms": part}))
    return out
