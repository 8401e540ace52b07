"""Chunk loading: the Arrow column encoder (corpusync.core.pgcopy, what refresh uses) against the previous
per-row path (psycopg `write_row` with a pgvector HalfVector / SparseVector object and a dict of sparse
weights per chunk), into the real embedded PostgreSQL, in the same run.

Rows carry real chunk texts (CMRC 2018 + SQuAD passages) and random unit vectors of two shapes:
BGE-M3 (1024-d halfvec + sparsevec with 50-300 non-zeros over a 250,002-token vocabulary) and MiniLM
(384-d, no sparse). The jieba segmentation for full-text search is the same work in both paths; it is
timed on its own (one process, and the pool refresh uses) and given to both paths precomputed (the Arrow
path as the record batch's search_text column, as refresh does).

Each path COPYs into an index-free temporary copy of corpusync.chunks (the server's parse cost is in both;
HNSW/GIN maintenance is not, it is identical for both). Prints a Markdown table: median of --repeat runs,
rows/s, wall and client (Python process) CPU seconds, and ratios against the per-row path.

Usage: python bench/load.py [--chunks 20000] [--repeat 3] [--segment-processes N] [--home DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpusync.core.offline import apply_offline_defaults

apply_offline_defaults()
os.environ.setdefault("CORPUSYNC_EMBEDDER", "minilm")  # the benches measure the demo/test model unless told

import numpy as np  # noqa: E402
from pgvector import HalfVector, SparseVector  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402

from corpusync.core import lexical, pgcopy  # noqa: E402
from corpusync.core.vectors import (  # noqa: E402
    LexicalRows,
    SparseRows,
    embedding_batch,
)
from corpusync.store import db, embedded  # noqa: E402
from corpusync.store.db import open_database  # noqa: E402
from schemas.records import Chunk, ChunkedDocument, EmbeddedDocument  # noqa: E402
from schemas.settings import Settings  # noqa: E402
from tasks.load import chunk_fields  # noqa: E402

SHAPES = {"bge-m3": (1024, 250002), "minilm": (384, None)}
PER_DOC = 20
COPY_TYPES = ["int8", "int8", "int4", "text", "text", "text", "int4", "int4", "int4", "int4", "int4",
              "text[]", "text", "jsonb", "int4", "halfvec", "sparsevec", "text", "int8", "int4"]


def texts(goldsets: Path, n: int) -> list[str]:
    out = [json.loads(line)["text"] for line in (goldsets / "squad-v1.1-dev/corpus.jsonl").open()]
    cmrc = json.loads((goldsets / "cmrc2018/cmrc2018_dev.json").read_text())
    out += [p["context"] for a in cmrc["data"] for p in a["paragraphs"]]
    return [out[i % len(out)] + ("" if i < len(out) else f" ({i})") for i in range(n)]


def documents(corpus: list[str], dim: int, vocab: int | None, segmented: dict[str, tuple[str, list[str]]],
              seed: int = 0) -> list[EmbeddedDocument]:
    rng = np.random.default_rng(seed)
    docs = []
    for start in range(0, len(corpus), PER_DOC):
        part = corpus[start:start + PER_DOC]
        chunks = [Chunk(ordinal=i, key=f"k{start + i}", text=t, text_sha256=f"{start + i:064x}",
                        token_count=len(t) // 3, char_start=0, char_end=len(t),
                        page_start=1 + i // 5 if i % 3 else None, page_end=1 + i // 5,
                        section_path=("第一章 总则", f"Section {i}")[: i % 3], chunk_type="text",
                        prefix="| a | b |\n" if i % 4 == 0 else "")
                  for i, t in enumerate(part)]
        dense = rng.standard_normal((len(part), dim)).astype(np.float32)
        dense /= np.linalg.norm(dense, axis=1, keepdims=True)
        sparse = None
        if vocab:
            nnz = rng.integers(50, 300, len(part))
            sparse = SparseRows.from_dicts(
                {int(k): float(v) for k, v in zip(rng.choice(vocab, m, replace=False), rng.uniform(0.01, 0.4, m),
                                                  strict=True)}
                for m in nnz)
        cd = ChunkedDocument(parsed=None, chunks=chunks, char_count=sum(len(t) for t in part))  # type: ignore[arg-type]
        lex = LexicalRows.from_tokens([segmented[t] for t in part])
        docs.append(EmbeddedDocument(doc=cd, vectors=embedding_batch(dense, sparse, lex)))
    return docs


def per_row(conn: Any, docs: list[EmbeddedDocument], sparse_dim: int | None) -> None:
    """The previous loader: a dict of weights and a pgvector object per chunk, psycopg write_row."""
    with conn.cursor() as cur, cur.copy(db.q("copy_chunks").as_string(conn).replace(
            "corpusync.chunks", "bench_chunks")) as copy:
        copy.set_types(COPY_TYPES)
        for n, ed in enumerate(docs):
            weights = ed.sparse.to_dicts() if ed.sparse is not None else None
            dense = ed.dense
            for i, c in enumerate(ed.doc.chunks):
                copy.write_row([
                    n + 1, n + 1, c.ordinal, c.key, c.text, c.text_sha256, c.token_count, c.page_start, c.page_end,
                    c.char_start, c.char_end, list(c.section_path), c.chunk_type,
                    Jsonb({"prefix_chars": len(c.prefix)} if c.prefix else {}), 1, HalfVector(dense[i]),
                    SparseVector(weights[i], sparse_dim) if weights is not None and sparse_dim else None,
                    ed.vectors.column("search_text")[i].as_py(), 1, 1,
                ])


def columnar(conn: Any, docs: list[EmbeddedDocument], sparse_dim: int | None) -> float:
    """What refresh does (tasks.load.chunk_fields + pgcopy). Returns the encode-only seconds."""
    ids = [(n + 1, n + 1) for n in range(len(docs))]
    encode = 0.0
    with conn.cursor() as cur, cur.copy(db.q("copy_chunks").as_string(conn).replace(
            "corpusync.chunks", "bench_chunks")) as copy:
        copy.write(pgcopy.HEADER)
        fields_iter = chunk_fields(docs, ids, model_id=1, run_id=1, generation=1, sparse_dim=sparse_dim)
        while True:
            t0 = time.perf_counter()
            fields = next(fields_iter, None)
            if fields is None:
                break
            data = pgcopy.encode_rows(fields)
            encode += time.perf_counter() - t0
            copy.write(data)
        copy.write(pgcopy.TRAILER)
    return encode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--goldsets", type=Path,
                    default=Path(__file__).resolve().parent.parent.parent / "shared/data/goldsets")
    ap.add_argument("--chunks", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--segment-processes", type=int, default=max(2, lexical.default_processes()),
                    help="processes for the pooled segmentation timing (refresh's default: cores - 1, at most 8)")
    ap.add_argument("--home", type=Path, default=None, help="corpusync home (default: a temporary one)")
    args = ap.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix=".corpusync-bench-load-", dir=Path.cwd()))
    settings = Settings(home=home)
    conn = open_database(settings)
    corpus = texts(args.goldsets, args.chunks)

    analyzer = lexical.Analyzer()
    analyzer.tokens("预热")
    t0 = time.perf_counter()
    segmented = dict(zip(corpus, analyzer.index_texts(corpus, 1), strict=True))
    jieba_s = time.perf_counter() - t0
    procs = args.segment_processes
    t0 = time.perf_counter()
    analyzer.index_texts(corpus, procs)
    jieba_pool_s = time.perf_counter() - t0
    conn.execute("CREATE TEMP TABLE bench_chunks (LIKE corpusync.chunks INCLUDING DEFAULTS)")
    size_mb = {}
    print(f"{len(corpus):,} chunks of real text (mean {statistics.mean(map(len, corpus)):.0f} chars). jieba "
          f"segmentation for the full-text index (refresh runs it while the model embeds; excluded below): one "
          f"process {jieba_s:.2f} s ({len(corpus) / jieba_s:,.0f} chunks/s), {procs} spawned processes "
          f"{jieba_pool_s:.2f} s ({len(corpus) / jieba_pool_s:,.0f} chunks/s, start-up included)")
    print(f"\n## Loading chunks by binary COPY, median of {args.repeat} runs, 2 cores")
    print("| shape | path | rows/s | wall s | client CPU s | encode s | COPY MB | rows/s vs per-row | client CPU vs "
          "per-row |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape, (dim, vocab) in SHAPES.items():
        docs = documents(corpus, dim, vocab, segmented)
        times: dict[str, list[float]] = {"per-row write_row": [], "Arrow columns": []}
        cpu: dict[str, list[float]] = {name: [] for name in times}
        enc: list[float] = []
        for _ in range(args.repeat):
            for name in times:
                conn.execute("TRUNCATE bench_chunks")
                with conn.transaction():
                    t0, c0 = time.perf_counter(), time.process_time()
                    if name.startswith("per-row"):
                        per_row(conn, docs, vocab)
                    else:
                        enc.append(columnar(conn, docs, vocab))
                    times[name].append(time.perf_counter() - t0)
                    cpu[name].append(time.process_time() - c0)
        size_mb[shape] = conn.execute("SELECT pg_total_relation_size('bench_chunks')").fetchone()[0] / 1e6
        base = statistics.median(times["per-row write_row"])
        base_cpu = statistics.median(cpu["per-row write_row"])
        copy_mb = sum(len(pgcopy.encode_rows(f)) for f in chunk_fields(
            docs, [(1, 1)] * len(docs), model_id=1, run_id=1, generation=1, sparse_dim=vocab)) / 1e6
        for name, runs in times.items():
            secs = statistics.median(runs)
            e = f"{statistics.median(enc):.2f}" if name.startswith("Arrow") else "-"
            c = statistics.median(cpu[name])
            print(f"| {shape} {dim}-d{' + sparse' if vocab else ''} | {name} | {len(corpus) / secs:,.0f} | "
                  f"{secs:.2f} | {c:.2f} | {e} | {copy_mb:,.1f} | {base / secs:.2f}x | {c / base_cpu:.2f}x |")
    print(f"\ntable size after a load: {', '.join(f'{k} {v:,.0f} MB' for k, v in size_mb.items())}")
    conn.close()
    if args.home is None:
        embedded.stop_embedded(settings)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
