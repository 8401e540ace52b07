"""Embedding results as columns, not rows: a dense (n, d) float32 matrix and sparse weights in CSR form,
carried between embed, validate and load as one Arrow record batch per document.

A refresh may embed millions of chunks; per-row Python objects (a dict of token weights per chunk, a
pgvector object per vector) cost more CPU than the database write they feed. Everything here works on
whole arrays. numpy only at import: pyarrow loads when a record batch is built (the GPU benchmark machine
imports this module without it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Column names of an embedding record batch.
DENSE, SPARSE_INDICES, SPARSE_VALUES, SEARCH_TEXT = "dense", "sparse_indices", "sparse_values", "search_text"
TERMS, TERM_FREQS = "terms", "term_freqs"  # the chunk's distinct lexical terms and their frequencies


@dataclass(frozen=True)
class SparseRows:
    """n sparse vectors in CSR form: row i has indices[indptr[i]:indptr[i+1]] (ascending token ids) and
    the matching positive values."""

    indptr: np.ndarray  # int64, n + 1
    indices: np.ndarray  # int32
    values: np.ndarray  # float32

    def __len__(self) -> int:
        return len(self.indptr) - 1

    @classmethod
    def empty(cls, n: int) -> SparseRows:
        return cls(np.zeros(n + 1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32))

    @classmethod
    def from_dicts(cls, rows: Iterable[Mapping[int, float] | None]) -> SparseRows:
        """From {token_id: weight} dicts (tests, and vectors read back from the index)."""
        lens: list[int] = []
        idx: list[int] = []
        val: list[float] = []
        for r in rows:
            items = sorted((int(k), float(v)) for k, v in (r or {}).items())
            lens.append(len(items))
            idx.extend(k for k, _ in items)
            val.extend(v for _, v in items)
        indptr = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=indptr[1:])
        return cls(indptr, np.asarray(idx, np.int32), np.asarray(val, np.float32))

    @classmethod
    def concat(cls, parts: Sequence[SparseRows]) -> SparseRows:
        if not parts:
            return cls.empty(0)
        counts = np.concatenate([p.nnz() for p in parts])
        indptr = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        return cls(indptr, np.concatenate([p.indices for p in parts]), np.concatenate([p.values for p in parts]))

    def nnz(self) -> np.ndarray:
        """Non-zeros per row."""
        return np.diff(self.indptr)

    def row(self, i: int) -> dict[int, float]:
        s, e = int(self.indptr[i]), int(self.indptr[i + 1])
        return dict(zip(self.indices[s:e].tolist(), self.values[s:e].tolist(), strict=True))

    def to_dicts(self) -> list[dict[int, float]]:
        return [self.row(i) for i in range(len(self))]

    def take(self, rows: np.ndarray | Sequence[int]) -> SparseRows:
        """Rows in the given order (repeats allowed), without a Python loop over rows."""
        rows = np.asarray(rows, dtype=np.int64)
        counts = self.nnz()[rows]
        indptr = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        src = concat_ranges(self.indptr[:-1][rows], counts, int(indptr[-1]))
        return SparseRows(indptr, self.indices[src], self.values[src])

    def prune(self, top_k: int) -> SparseRows:
        """Keep each row's top_k weights (ties: lower token id first), indices ascending again."""
        counts = self.nnz()
        if counts.size == 0 or counts.max() <= top_k:
            return self
        row_of = np.repeat(np.arange(len(counts)), counts)
        by_weight = np.lexsort((self.indices, -self.values, row_of))
        rank = np.arange(len(by_weight)) - self.indptr[row_of[by_weight]]
        keep = np.sort(by_weight[rank < top_k])  # positions ascending = rows, then token ids, in order
        kept = np.minimum(counts, top_k)
        indptr = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(kept, out=indptr[1:])
        return SparseRows(indptr, self.indices[keep], self.values[keep])

    def to_arrow(self) -> tuple[Any, Any]:
        """(indices, values) as two Arrow list arrays sharing these offsets (zero-copy)."""
        import pyarrow as pa

        offsets = pa.array(self.indptr.astype(np.int32))
        return (pa.ListArray.from_arrays(offsets, pa.array(self.indices, pa.int32())),
                pa.ListArray.from_arrays(offsets, pa.array(self.values, pa.float32())))

    @classmethod
    def from_arrow(cls, indices: Any, values: Any) -> SparseRows:
        offsets = indices.offsets.to_numpy().astype(np.int64)
        base = offsets[0]
        idx = indices.values.to_numpy()[base:offsets[-1]]
        val = values.values.to_numpy()[base:offsets[-1]]
        return cls(offsets - base, idx.astype(np.int32, copy=False), val.astype(np.float32, copy=False))


def concat_ranges(starts: np.ndarray, counts: np.ndarray, total: int) -> np.ndarray:
    """Concatenation of arange(s, s + c) for each (s, c), vectorised."""
    if total == 0:
        return np.zeros(0, np.int64)
    out_start = np.zeros(len(counts), np.int64)
    np.cumsum(counts[:-1], out=out_start[1:])
    return np.repeat(starts - out_start, counts) + np.arange(total, dtype=np.int64)


@dataclass(frozen=True)
class LexicalRows:
    """The lexical index of some chunks: normalised search text, distinct terms (first-occurrence order)
    and their frequencies, row i for chunk i."""

    search_text: list[str]
    terms: list[list[str]]
    freqs: list[list[int]]

    @classmethod
    def from_tokens(cls, analysed: Sequence[tuple[str, Sequence[str]]]) -> LexicalRows:
        """From (normalised text, tokens with repetitions) per chunk, as lexical.Analyzer.index_texts gives."""
        texts, terms, freqs = [], [], []
        for text, tokens in analysed:
            counts = Counter(tokens)
            texts.append(text)
            terms.append(list(counts))
            freqs.append(list(counts.values()))
        return cls(texts, terms, freqs)

    def take(self, rows: Sequence[int]) -> LexicalRows:
        return LexicalRows([self.search_text[i] for i in rows], [self.terms[i] for i in rows],
                           [self.freqs[i] for i in rows])

    def __len__(self) -> int:
        return len(self.search_text)


def embedding_batch(dense: np.ndarray, sparse: SparseRows | None, lexical: LexicalRows | None = None) -> Any:
    """One Arrow record batch: dense as fixed_size_list<float32>[d], sparse as two list columns, and the
    lexical index (search text, terms, term frequencies) when it was computed alongside."""
    import pyarrow as pa

    dense = np.ascontiguousarray(dense, dtype=np.float32)
    n, d = dense.shape
    arrays = [pa.FixedSizeListArray.from_arrays(pa.array(dense.reshape(-1)), d)]
    names = [DENSE]
    if sparse is not None:
        if len(sparse) != n:
            raise ValueError(f"{len(sparse)} sparse rows for {n} dense rows")
        arrays += list(sparse.to_arrow())
        names += [SPARSE_INDICES, SPARSE_VALUES]
    if lexical is not None:
        if len(lexical) != n:
            raise ValueError(f"{len(lexical)} lexical rows for {n} dense rows")
        arrays += [pa.array(lexical.search_text, pa.string()), pa.array(lexical.terms, pa.list_(pa.string())),
                   pa.array(lexical.freqs, pa.list_(pa.int32()))]
        names += [SEARCH_TEXT, TERMS, TERM_FREQS]
    return pa.RecordBatch.from_arrays(arrays, names=names)


def dense_of(batch: Any) -> np.ndarray:
    """The (n, d) float32 matrix of an embedding record batch (a view, no copy)."""
    return matrix_of(batch.column(DENSE))


def matrix_of(col: Any) -> np.ndarray:
    """An Arrow fixed_size_list<float32>[d] array as an (n, d) matrix (a view, no copy)."""
    d = col.type.list_size
    flat = col.values.to_numpy(zero_copy_only=False)[col.offset * d:(col.offset + len(col)) * d]
    return flat.reshape(len(col), d)


def sparse_of(batch: Any) -> SparseRows | None:
    if SPARSE_INDICES not in batch.schema.names:
        return None
    return SparseRows.from_arrow(batch.column(SPARSE_INDICES), batch.column(SPARSE_VALUES))


@dataclass(frozen=True)
class VectorTable:
    """Vectors keyed by chunk text hash: rows[hash] indexes dense (and sparse, for models with a trained
    sparse head). Used for vectors reused from the index and for the ones a run has just computed."""

    rows: dict[str, int]
    dense: np.ndarray  # (n, d) float32
    sparse: SparseRows | None

    @classmethod
    def empty(cls, dimension: int, sparse: bool) -> VectorTable:
        return cls({}, np.zeros((0, dimension), np.float32), SparseRows.empty(0) if sparse else None)

    @classmethod
    def concat(cls, tables: Sequence[VectorTable], *, sparse: bool) -> VectorTable:
        """One table over several (a hash present in two keeps the first table's row)."""
        rows: dict[str, int] = {}
        base = 0
        for t in tables:
            for h, i in t.rows.items():
                rows.setdefault(h, base + i)
            base += len(t.dense)
        parts = [t.sparse if t.sparse is not None else SparseRows.empty(len(t.dense)) for t in tables]
        return cls(rows, np.concatenate([t.dense for t in tables]),
                   SparseRows.concat(parts) if sparse else None)


def sparse_top_k(weights: Any, input_ids: Any, special_ids: Sequence[int], top_k: int,
                 vocab_size: int | None = None) -> SparseRows:
    """Vectorised BGE-M3 lexical weights: per text, the max weight of each token id (special tokens and
    padding out), then its top_k ids, as CSR rows with ascending ids. One scatter-amax into a (rows x vocab)
    buffer, one topk and one sort on the device, instead of FlagEmbedding's per-token Python loop and a dict
    per text; rows are processed in slices that keep the buffer near 64 MiB."""
    import torch

    w = torch.clamp(weights.float(), min=0.0)
    ids = input_ids.long()
    if special_ids:
        w = w.masked_fill(torch.isin(ids, torch.tensor(list(special_ids), device=ids.device)), 0.0)
    vocab = vocab_size or int(ids.max().item()) + 1
    k = min(top_k, vocab)
    step = max(1, (1 << 24) // vocab)
    counts: list[np.ndarray] = []
    indices: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for start in range(0, ids.shape[0], step):
        sl = slice(start, start + step)
        buf = torch.zeros((ids[sl].shape[0], vocab), dtype=w.dtype, device=w.device)
        buf.scatter_reduce_(1, ids[sl], w[sl], reduce="amax", include_self=True)
        vals, idx = torch.topk(buf, k, dim=1)
        idx = torch.where(vals > 0, idx, vocab)  # zero weights sort last and are dropped
        idx, order = torch.sort(idx, dim=1)
        vals = torch.gather(vals, 1, order)
        keep = idx < vocab
        counts.append(keep.sum(dim=1).cpu().numpy())
        indices.append(idx[keep].to(torch.int32).cpu().numpy())
        values.append(vals[keep].cpu().numpy())
    n = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    indptr = np.zeros(len(n) + 1, np.int64)
    np.cumsum(n, out=indptr[1:])
    return SparseRows(indptr, np.concatenate(indices) if indices else np.zeros(0, np.int32),
                      np.concatenate(values).astype(np.float32) if values else np.zeros(0, np.float32))
