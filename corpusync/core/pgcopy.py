"""PostgreSQL binary COPY encoding for whole columns at once (numpy), for the chunk loader's hot path.

psycopg's `Copy.write_row` encodes one Python value at a time, and pgvector's dumpers build a Python
object per vector; at a refresh's volume (1024-d halfvec + sparsevec per chunk) that per-row work costs more
than the database write. Here each column is encoded with a few array operations and rows are assembled
by Arrow's element-wise binary join, then handed to `Copy.write` as one buffer per slice of rows.

Format: https://www.postgresql.org/docs/current/sql-copy.html (binary format); pgvector's halfvec is
int16 dim, int16 unused, dim x float16; sparsevec is int32 dim, int32 nnz, int32 unused, nnz x int32
0-based index (ascending), nnz x float32. All big-endian.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from corpusync.core.vectors import SparseRows, concat_ranges

HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
TRAILER = b"\xff\xff"
TEXT_OID = 25


@dataclass(frozen=True)
class Field:
    """One column, encoded: the payloads of its non-null rows back to back, in row order, and each row's
    payload length (-1 for NULL)."""

    data: np.ndarray  # uint8
    lengths: np.ndarray  # int64, -1 = NULL

    def __post_init__(self) -> None:
        if int(np.maximum(self.lengths, 0).sum()) != len(self.data):
            raise ValueError("field payload does not match its lengths")


def _interleave(n: int, parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Items made of parts: item i is part0[i] + part1[i] + ..., where each part is (bytes of all items back
    to back, per-item lengths). Returns (bytes of all items back to back, per-item lengths).

    Arrow's element-wise binary join does the per-item copies in C++ (no per-byte index arrays)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if n == 0:
        return np.zeros(0, np.uint8), np.zeros(0, np.int64)
    total = sum(len(data) for data, _ in parts)
    kind = pa.large_binary() if total >= 2**31 else pa.binary()
    off_type = np.int64 if total >= 2**31 else np.int32
    arrays = []
    for data, lens in parts:
        offsets = np.zeros(n + 1, off_type)
        np.cumsum(lens, out=offsets[1:])
        arrays.append(pa.Array.from_buffers(kind, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]))
    joined = pc.binary_join_element_wise(*arrays, pa.scalar(b"", kind))
    bufs = joined.buffers()
    offsets = np.frombuffer(bufs[1], off_type)[joined.offset:joined.offset + n + 1].astype(np.int64)
    out = np.frombuffer(bufs[2], np.uint8)[offsets[0]:offsets[-1]] if bufs[2] is not None else np.zeros(0, np.uint8)
    return out, np.diff(offsets)


def _fixed(data: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A part where every item has the same width: data is an (n, w) uint8 array."""
    data = np.ascontiguousarray(data, dtype=np.uint8)
    if data.ndim != 2 or data.shape[0] != n:
        raise ValueError(f"expected {n} rows of bytes, got shape {data.shape}")
    return data.reshape(-1), np.full(n, data.shape[1], np.int64)


def _be(values: np.ndarray, dtype: str) -> np.ndarray:
    """Big-endian bytes of values as an (n, itemsize) uint8 array."""
    arr = np.ascontiguousarray(values).astype(dtype)
    return arr.view(np.uint8).reshape(len(arr), arr.dtype.itemsize)


def encode_rows(fields: Sequence[Field]) -> memoryview:
    """The tuples of a binary COPY (no header or trailer) for equally long encoded columns, as a view
    that Copy.write takes without another copy."""
    n = len(fields[0].lengths)
    if any(len(f.lengths) != n for f in fields):
        raise ValueError("columns of different lengths")
    if n == 0:
        return memoryview(b"")
    parts = [_fixed(np.tile(_be(np.array([len(fields)]), ">i2"), (n, 1)), n)]
    for f in fields:
        parts.append(_fixed(_be(f.lengths, ">i4"), n))
        parts.append((f.data, np.maximum(f.lengths, 0)))
    data, _ = _interleave(n, parts)
    return data.data  # a memoryview over the array


# -- column encoders --------------------------------------------------------------------------------------

def int_field(values: np.ndarray | Sequence[int | None], width: int) -> Field:
    """int4 (width 4) or int8 (width 8); None is NULL."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        arr, null = values, np.zeros(len(values), bool)
    else:
        null = np.array([v is None for v in values], bool)
        arr = np.array([0 if v is None else v for v in values], np.int64)
    dtype = ">i4" if width == 4 else ">i8"
    data = _be(arr[~null], dtype).reshape(-1)
    return Field(data, np.where(null, -1, width).astype(np.int64))


def text_field(values: Any) -> Field:
    """text (or any type whose binary form is its UTF-8 text) from an Arrow string array or a list of str."""
    data, lens, null = _utf8(values)
    return Field(data, np.where(null, -1, lens))


def jsonb_field(values: Any) -> Field:
    """jsonb from JSON texts: a version byte (1) before each text."""
    data, lens, null = _utf8(values)
    ok = ~null
    m = int(ok.sum())
    payload, plen = _interleave(m, [_fixed(np.ones((m, 1), np.uint8), m), (data, lens[ok])])
    out_lens = np.full(len(lens), -1, np.int64)
    out_lens[ok] = plen
    return Field(payload, out_lens)


def text_array_field(offsets: np.ndarray, elements: Any) -> Field:
    """text[] (one dimension, no NULL elements): row i holds elements[offsets[i]:offsets[i+1]]."""
    offsets = np.asarray(offsets, np.int64)
    n = len(offsets) - 1
    counts = np.diff(offsets)
    edata, elens, enull = _utf8(elements)
    if enull.any():
        raise ValueError("NULL array elements are not supported")
    m = len(elens)
    item, ilens = _interleave(m, [_fixed(_be(elens, ">i4"), m), (edata, elens)])
    row_bytes = np.zeros(n, np.int64)
    if m:
        csum = np.concatenate([[0], np.cumsum(ilens)])
        row_bytes = csum[offsets[1:]] - csum[offsets[:-1]]
    # header: ndim, has-null flag, element oid [, length, lower bound]; an empty array has ndim 0
    head = np.zeros((n, 5), np.int64)
    head[:, 0] = counts > 0
    head[:, 2] = TEXT_OID
    head[:, 3] = counts
    head[:, 4] = 1
    hbytes = _be(head.reshape(-1), ">i4").reshape(n, 20)
    hlens = np.where(counts > 0, 20, 12).astype(np.int64)
    hdata = hbytes[np.arange(20)[None, :] < hlens[:, None]]
    payload, plen = _interleave(n, [(hdata, hlens), (item, row_bytes)])
    return Field(payload, plen)


def halfvec_field(dense: np.ndarray) -> Field:
    """pgvector halfvec from an (n, d) float array (no NULLs)."""
    n, d = dense.shape
    head = np.zeros((n, 2), np.int64)
    head[:, 0] = d
    payload, plen = _interleave(n, [_fixed(_be(head.reshape(-1), ">i2").reshape(n, 4), n),
                                    _fixed(_be(dense.reshape(-1), ">f2").reshape(n, 2 * d), n)])
    return Field(payload, plen)


def sparsevec_field(sparse: SparseRows | None, n: int, dim: int | None) -> Field:
    """pgvector sparsevec from CSR rows (indices ascending, < dim); all NULL when sparse is None."""
    if sparse is None or dim is None:
        return Field(np.zeros(0, np.uint8), np.full(n, -1, np.int64))
    if len(sparse) != n:
        raise ValueError(f"{len(sparse)} sparse rows for {n} rows")
    nnz = sparse.nnz()
    if len(sparse.indices) and (int(sparse.indices.min()) < 0 or int(sparse.indices.max()) >= dim):
        raise ValueError(f"sparse index outside 0..{dim - 1}")
    head = np.zeros((n, 3), np.int64)
    head[:, 0] = dim
    head[:, 1] = nnz
    payload, plen = _interleave(n, [
        _fixed(_be(head.reshape(-1), ">i4").reshape(n, 12), n),
        (_be(sparse.indices, ">i4").reshape(-1), 4 * nnz),
        (_be(sparse.values, ">f4").reshape(-1), 4 * nnz),
    ])
    return Field(payload, plen)


def _utf8(values: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes of the non-null strings back to back, per-row byte lengths (0 for NULL), NULL mask)."""
    import pyarrow as pa

    arr = values if isinstance(values, pa.Array) else pa.array(values, pa.string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        raise TypeError(f"expected strings, got {arr.type}")
    n = len(arr)
    null = arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else np.zeros(n, bool)
    off_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], off_type)[arr.offset:arr.offset + n + 1].astype(np.int64)
    raw = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    lens = np.diff(offsets)
    if null.any() and lens[null].any():  # Arrow allows bytes under a NULL slot: drop them
        lens = np.where(null, 0, lens)
        return raw[concat_ranges(offsets[:-1], lens, int(lens.sum()))], lens, null
    return raw[offsets[0]:offsets[-1]], lens, null
