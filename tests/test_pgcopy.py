"""The vectorised binary COPY encoder and the CSR sparse rows, checked against the real server: rows
written by corpusync.core.pgcopy must read back exactly as the same rows written by psycopg's own write_row
with pgvector's dumpers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pgvector import HalfVector, SparseVector
from psycopg.types.json import Jsonb

from corpusync.core import pgcopy
from corpusync.core.vectors import SparseRows, dense_of, embedding_batch, sparse_of

COLUMNS = "(a int8, b int4, t text, arr text[], j jsonb, h halfvec(5), s sparsevec(40))"
TYPES = ["int8", "int4", "text", "text[]", "jsonb", "halfvec", "sparsevec"]


def _rows(n: int, seed: int) -> dict:  # type: ignore[type-arg]
    rng = np.random.default_rng(seed)
    words = ["", "a", "第十二条 付款", "x" * 300, "tab\tnew\nline", "é\u0000"[:1], "🙂"]
    texts = [None if i % 5 == 3 else words[int(rng.integers(len(words)))] + str(i) for i in range(n)]
    arrays = [[words[int(k)] for k in rng.integers(0, len(words), int(rng.integers(0, 4)))] for _ in range(n)]
    sparse = [{int(k): float(rng.uniform(0.01, 2)) for k in rng.choice(40, int(rng.integers(0, 6)), replace=False)}
              for _ in range(n)]
    return {
        "a": [int(x) for x in rng.integers(-(2**62), 2**62, n)],
        "b": [None if i % 7 == 2 else int(x) for i, x in enumerate(rng.integers(-(2**31), 2**31 - 1, n))],
        "t": texts,
        "arr": arrays,
        "j": [f'{{"prefix_chars": {i}}}' if i % 2 else "{}" for i in range(n)],
        "h": rng.standard_normal((n, 5)).astype(np.float32),
        "s": sparse,
    }


def _write_both(conn, data: dict) -> tuple[list, list]:  # type: ignore[no-untyped-def,type-arg]
    conn.execute(f"CREATE TEMP TABLE ref {COLUMNS}")
    conn.execute(f"CREATE TEMP TABLE got {COLUMNS}")
    n = len(data["a"])
    with conn.cursor() as cur, cur.copy("COPY ref FROM STDIN WITH (FORMAT BINARY)") as copy:
        copy.set_types(TYPES)
        for i in range(n):
            copy.write_row([data["a"][i], data["b"][i], data["t"][i], data["arr"][i], Jsonb(eval(data["j"][i])),
                            HalfVector(data["h"][i]), SparseVector(data["s"][i], 40)])
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in data["arr"]])])
    fields = [
        pgcopy.int_field(np.asarray(data["a"], np.int64), 8),
        pgcopy.int_field(data["b"], 4),
        pgcopy.text_field(data["t"]),
        pgcopy.text_array_field(offsets, [w for x in data["arr"] for w in x]),
        pgcopy.jsonb_field(data["j"]),
        pgcopy.halfvec_field(data["h"]),
        pgcopy.sparsevec_field(SparseRows.from_dicts(data["s"]), n, 40),
    ]
    with conn.cursor() as cur, cur.copy("COPY got FROM STDIN WITH (FORMAT BINARY)") as copy:
        copy.write(pgcopy.HEADER)
        copy.write(pgcopy.encode_rows(fields))
        copy.write(pgcopy.TRAILER)
    q = "SELECT a, b, t, arr, j, h::text, s::text FROM {} ORDER BY a"
    return conn.execute(q.format("ref")).fetchall(), conn.execute(q.format("got")).fetchall()


def test_encoded_rows_read_back_like_psycopg_write_row(conn) -> None:  # type: ignore[no-untyped-def]
    ref, got = _write_both(conn, _rows(200, seed=1))
    assert len(got) == 200
    assert got == ref


def test_empty_and_all_null_columns(conn) -> None:  # type: ignore[no-untyped-def]
    assert pgcopy.encode_rows([pgcopy.text_field([])]) == b""
    conn.execute("CREATE TEMP TABLE t (x text, i int4, a text[], s sparsevec(3), h halfvec(2))")
    fields = [pgcopy.text_field([None, "", None]), pgcopy.int_field([None, None, None], 4),
              pgcopy.text_array_field(np.zeros(4, np.int64), []),
              pgcopy.sparsevec_field(None, 3, None),
              pgcopy.halfvec_field(np.array([[1, 0], [0, 1], [0.5, 0.5]], np.float32))]
    with conn.cursor() as cur, cur.copy("COPY t FROM STDIN WITH (FORMAT BINARY)") as copy:
        copy.write(pgcopy.HEADER + pgcopy.encode_rows(fields) + pgcopy.TRAILER)
    rows = conn.execute("SELECT x, i, a, s, h::text FROM t").fetchall()
    assert rows == [(None, None, [], None, "[1,0]"), ("", None, [], None, "[0,1]"), (None, None, [], None, "[0.5,0.5]")]


def test_bad_input_is_refused_before_the_server_sees_it() -> None:
    with pytest.raises(ValueError, match="outside"):
        pgcopy.sparsevec_field(SparseRows.from_dicts([{50: 1.0}]), 1, 40)
    with pytest.raises(ValueError, match="different lengths"):
        pgcopy.encode_rows([pgcopy.text_field(["a"]), pgcopy.text_field(["a", "b"])])
    with pytest.raises(TypeError):
        pgcopy.text_field(pa.array([1, 2]))


def test_arrow_slices_and_null_slots_with_bytes() -> None:
    arr = pa.array(["skip", "ab", None, "中文"]).slice(1)
    f = pgcopy.text_field(arr)
    assert f.lengths.tolist() == [2, -1, 6] and bytes(f.data) == "ab中文".encode()
    # a NULL slot that still covers bytes (legal in Arrow) contributes nothing
    raw = pa.StringArray.from_buffers(3, pa.py_buffer(np.array([0, 1, 3, 4], np.int32).tobytes()),
                                      pa.py_buffer(b"abcd"), pa.py_buffer(bytes([0b101])), 1)
    f = pgcopy.text_field(raw)
    assert f.lengths.tolist() == [1, -1, 1] and bytes(f.data) == b"ad"


sparse_rows = st.lists(st.dictionaries(st.integers(0, 60), st.floats(0.125, 5, width=32), max_size=12), max_size=25)


@settings(max_examples=60, deadline=None)
@given(sparse_rows, st.integers(1, 8), st.data())
def test_sparse_rows_take_prune_and_arrow_match_dict_reference(rows, k, data) -> None:  # type: ignore[no-untyped-def]
    sr = SparseRows.from_dicts(rows)
    assert sr.to_dicts() == [dict(sorted(r.items())) for r in rows]
    if rows:
        order = data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=30))
        assert sr.take(order).to_dicts() == [sr.row(i) for i in order]
    for r, got in zip(rows, sr.prune(k).to_dicts(), strict=True):
        top = sorted(r.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        assert got == dict(sorted(top))
    dense = np.ones((len(rows), 3), np.float32)
    batch = embedding_batch(dense, sr)
    back = sparse_of(batch)
    assert back is not None and back.to_dicts() == sr.to_dicts()
    if len(rows) > 2:
        sliced = batch.slice(1, 2)
        assert sparse_of(sliced).to_dicts() == sr.to_dicts()[1:3]  # type: ignore[union-attr]
        np.testing.assert_array_equal(dense_of(sliced), dense[1:3])
    assert SparseRows.concat([sr, sr]).to_dicts() == sr.to_dicts() * 2
