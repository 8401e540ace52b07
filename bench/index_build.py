"""HNSW index cost of a first build: vectors COPYed into a table whose HNSW index is maintained row by row
(what a first build did before, and what any refresh does on top of a published index) against the same
COPY into a table without it and the index built once afterwards (what a first build does now:
corpusync.store.versions.index_model, with the refresh's maintenance_work_mem and parallel workers).

The index is the dense one of sql/queries/create_dense_index.sql (halfvec cosine, pgvector's default m and
ef_construction, partial on the model), on a scratch table in the real embedded PostgreSQL; rows are random
unit vectors of BGE-M3's 1024 dimensions, COPYed in batches of 500 as the loader sends them. Prints the median
of --repeat runs of each and their ratio.

    python bench/index_build.py [--rows 5000] [--repeat 3] [--dim 1024]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pgvector import HalfVector

from corpusync.store import db
from corpusync.store.db import open_database
from corpusync.store.embedded import stop_embedded
from schemas.settings import Settings

TABLE = "public.bench_index_build"
INDEX = f"CREATE INDEX ON {TABLE} USING hnsw ((dense::halfvec({{dim}})) halfvec_cosine_ops) WHERE model_id = 1"


def one(conn, vecs: np.ndarray, *, index_first: bool, memory: str, workers: int | None) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(load seconds, index build seconds) of one run."""
    dim = vecs.shape[1]
    conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
    conn.execute(f"CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, model_id int NOT NULL, dense halfvec NOT NULL)")
    if index_first:
        conn.execute(INDEX.format(dim=dim))
    t0 = time.perf_counter()
    with conn.cursor() as cur:
        for start in range(0, len(vecs), 500):
            with cur.copy(f"COPY {TABLE} (model_id, dense) FROM STDIN WITH (FORMAT BINARY)") as copy:
                copy.set_types(["int4", "halfvec"])
                for v in vecs[start:start + 500]:
                    copy.write_row([1, HalfVector(v)])
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    if not index_first:
        with conn.transaction():
            conn.execute(db.q("index_build_settings"), {"memory": memory, "workers": workers})  # the refresh's
            conn.execute(INDEX.format(dim=dim))
    return load, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dim", type=int, default=1024)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix=".corpusync-bench-index-", dir=Path.cwd()))
    settings = Settings(home=home)
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((args.rows, args.dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    conn = open_database(settings)
    try:
        runs: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeat):
            for first in (True, False):
                load, build = one(conn, vecs, index_first=first, memory=settings.index_build_memory,
                                  workers=settings.index_workers())
                runs[first].append(load + build)
                print(f"  {'maintained' if first else 'built after'}: load {load:.2f} s, index {build:.2f} s",
                      flush=True)
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
    finally:
        conn.close()
        stop_embedded(settings)  # the bench's own server goes with its home
        shutil.rmtree(home, ignore_errors=True)
    maintained, after = statistics.median(runs[True]), statistics.median(runs[False])
    print(f"{args.rows} rows of {args.dim}-d, median of {args.repeat}: index maintained while loading "
          f"{maintained:.2f} s ({maintained / args.rows * 1000:.2f} ms/row); built after the load {after:.2f} s "
          f"({after / args.rows * 1000:.2f} ms/row, {settings.index_workers()} parallel workers); "
          f"ratio {maintained / after:.1f}x")


if __name__ == "__main__":
    main()
