"""load: the pure half of writing a candidate generation: the model check, and the columns of the binary
COPYs (chunks, lexical postings, cached vectors) encoded from the documents' Arrow vector batches
(corpusync.core.pgcopy). The writes themselves (one transaction per batch of documents) are
corpusync.store.versions.load_documents; nothing here touches the database.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpusync.core import pgcopy
from corpusync.core.errors import ModelMismatch
from corpusync.core.vectors import (
    DENSE,
    SEARCH_TEXT,
    SPARSE_INDICES,
    SPARSE_VALUES,
    TERM_FREQS,
    TERMS,
    SparseRows,
    matrix_of,
)
from schemas.records import EmbeddedDocument


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


def lexical_tokens(ed: EmbeddedDocument) -> int:
    """The document's chunks' lexical lengths added up (BM25's average length is counted from these)."""
    if TERM_FREQS not in ed.vectors.schema.names:
        return 0
    return int(pc.sum(ed.vectors.column(TERM_FREQS).flatten()).as_py() or 0)


@dataclass(frozen=True)
class BatchTerms:
    """A batch's lexical terms, dictionary-encoded once: `terms` are the distinct ones (their ids come from the
    lexicon, corpusync.store.versions.term_ids), the rest is what posting_fields turns into columns."""

    terms: list[str]
    indices: np.ndarray  # per posting: its term's index in `terms`
    per_chunk: np.ndarray  # postings per chunk
    tf: np.ndarray  # per posting: the term's frequency in its chunk


def batch_terms(docs: Sequence[EmbeddedDocument]) -> BatchTerms | None:
    """The lexical terms of these documents' chunks (None when they have none)."""
    if not docs or TERMS not in docs[0].vectors.schema.names:
        return None
    vectors = pa.Table.from_batches([ed.vectors for ed in docs])
    terms = vectors.column(TERMS).combine_chunks()
    flat = terms.flatten()
    if len(flat) == 0:
        return None
    encoded = pc.dictionary_encode(flat)
    per_chunk = pc.list_value_length(terms).to_numpy(zero_copy_only=False).astype(np.int64)
    tf = vectors.column(TERM_FREQS).combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    return BatchTerms(encoded.dictionary.to_pylist(), encoded.indices.to_numpy(zero_copy_only=False), per_chunk, tf)


def posting_fields(docs: Sequence[EmbeddedDocument], version_ids: Sequence[int], batch: BatchTerms,
                   term_ids: Mapping[str, int]) -> list[pgcopy.Field]:
    """The columns of copy_postings for these documents' chunks: array arithmetic over `batch` (batch_terms
    of the same documents), with each term's id from `term_ids`."""
    id_of = np.array([term_ids[t] for t in batch.terms], np.int64)
    per_chunk, tf = batch.per_chunk, batch.tf
    ends = np.cumsum(per_chunk)
    cum = np.concatenate([[0], np.cumsum(tf)])
    dl = cum[ends] - cum[ends - per_chunk]
    counts = [len(ed.doc.chunks) for ed in docs]
    version = np.repeat(np.asarray(version_ids, np.int64), counts)
    ordinal = np.fromiter((c.ordinal for ed in docs for c in ed.doc.chunks), np.int64, sum(counts))
    return [
        pgcopy.int_field(id_of[batch.indices], 4),
        pgcopy.int_field(np.repeat(version, per_chunk), 8),
        pgcopy.int_field(np.repeat(ordinal, per_chunk), 4),
        pgcopy.int_field(tf, 4),
        pgcopy.int_field(np.repeat(dl, per_chunk), 4),
    ]


def cache_fields(model_id: int, hashes: Sequence[str], dense: np.ndarray, sparse: SparseRows | None,
                 sparse_dim: int | None) -> list[pgcopy.Field]:
    """The columns of copy_vector_cache_stage for one embedded batch."""
    n = len(hashes)
    return [pgcopy.int_field(np.full(n, model_id, np.int64), 4), pgcopy.text_field(list(hashes)),
            pgcopy.halfvec_field(np.asarray(dense, np.float32)),
            pgcopy.sparsevec_field(sparse if sparse_dim else None, n, sparse_dim)]


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
