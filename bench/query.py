"""Query latency, HNSW recall against exact search, and filtered row counts, on an index built by
bench/eval_goldsets.sh (CMRC 2018 + SQuAD dev + DuReader corpora), optionally scaled up with synthetic
chunks to >= 100k.

Synthetic chunks (documents under `synthetic/`) splice the first half of one real chunk's text with the
second half of another's; their vector is the normalised sum of the two real vectors and their lexical
postings are the first chunk's, so the vector, term and length distributions stay those of real text without
running the model 100k times on a 2-core CPU.

Usage: python bench/query.py [--home .corpusync-bench] [--scale 100000] [--queries 200] [--k 10]
Prints Markdown tables. Timings are wall-clock per query through corpusync.search_hybrid (the SQL function
the Python API and analysts both call), query embedding excluded (it is the same for every mode).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpusync.core.offline import apply_offline_defaults

apply_offline_defaults()
os.environ.setdefault("CORPUSYNC_EMBEDDER", "minilm")  # the benches measure the demo/test model unless told

from pgvector import HalfVector  # noqa: E402
from psycopg import sql  # noqa: E402

from corpusync.adapters.embedders import build_embedder  # noqa: E402
from corpusync.core.lexical import Analyzer  # noqa: E402
from corpusync.store.db import open_database  # noqa: E402
from evaluation.goldsets import load_goldset, sample_questions  # noqa: E402
from schemas.settings import Settings  # noqa: E402

MODES = {"dense": (1.0, 0.0), "lexical": (0.0, 1.0), "hybrid": (1.0, 1.0)}


def scale_up(conn, target: int) -> int:  # type: ignore[no-untyped-def]
    """Add synthetic chunks until the published generation holds `target` chunks; rebuild the HNSW index."""
    live = conn.execute("SELECT count(*) FROM corpusync.live_chunks").fetchone()[0]
    if live >= target:
        return int(live)
    state = conn.execute("SELECT s.published_generation, s.model_id, m.dimension FROM corpusync.index_state s "
                         "JOIN corpusync.embedding_models m ON m.id = s.model_id").fetchone()
    gen, model_id, dim = (int(x) for x in state)
    per_doc = 20
    n_docs = (target - live + per_doc - 1) // per_doc
    index = conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'corpusync' AND indexdef LIKE "
                         "%s", (f"%halfvec({dim})%model_id = {model_id}%",)).fetchone()
    t0 = time.perf_counter()
    with conn.transaction():
        if index:
            conn.execute(sql.SQL("DROP INDEX corpusync.{}").format(sql.Identifier(index[0])))
        conn.execute("""
            CREATE TEMP TABLE real_chunks AS
            SELECT row_number() OVER (ORDER BY c.id) AS rn, c.id, c.version_id, c.ordinal, c.text, c.search_text,
                   c.dense, c.token_count,
                   coalesce((SELECT max(p.dl) FROM corpusync.postings p
                             WHERE p.version_id = c.version_id AND p.ordinal = c.ordinal), 0) AS dl
            FROM corpusync.chunks c WHERE c.model_id = %s""", (model_id,))
        n_real = conn.execute("SELECT count(*) FROM real_chunks").fetchone()[0]
        run_id = conn.execute("SELECT max(id) FROM corpusync.runs").fetchone()[0]
        conn.execute("""
            WITH docs AS (
                INSERT INTO corpusync.documents (path, first_run_id)
                SELECT 'synthetic/' || lpad(g::text, 6, '0') || '.txt', %(run)s FROM generate_series(1, %(n)s) g
                ON CONFLICT (path) DO NOTHING RETURNING id
            )
            INSERT INTO corpusync.document_versions (document_id, content_sha256, size_bytes, source_path, media_type,
                parser, pipeline_fingerprint, model_id, run_id, gen_from, metadata)
            SELECT id, md5(id::text), 0, 'synthetic', 'text/plain', 'synthetic', 'synthetic', %(model)s, %(run)s,
                   %(gen)s, '{"lang": "synthetic"}'::jsonb
            FROM docs""", {"run": run_id, "n": n_docs, "model": model_id, "gen": gen})
        conn.execute("""
            CREATE TEMP TABLE picks AS
            SELECT v.id AS version_id, v.document_id, v.run_id, v.gen_from, o AS ordinal,
                   (1 + floor(random() * %(nr)s))::bigint AS ra, (1 + floor(random() * %(nr)s))::bigint AS rb
            FROM corpusync.document_versions v CROSS JOIN generate_series(0, %(per)s - 1) o
            WHERE v.parser = 'synthetic' AND NOT EXISTS (SELECT 1 FROM corpusync.chunks c WHERE c.version_id = v.id)
            """, {"per": per_doc, "nr": n_real})
        conn.execute("""
            INSERT INTO corpusync.chunks (version_id, document_id, ordinal, chunk_key, text, text_sha256, token_count,
                char_start, char_end, model_id, dense, search_text, run_id, gen_from)
            SELECT k.version_id, k.document_id, k.ordinal, md5(k.version_id::text || ':' || k.ordinal), t.text,
                   md5(t.text), a.token_count, 0, greatest(length(t.text), 1), %(model)s,
                   l2_normalize(a.dense::vector + b.dense::vector)::halfvec, a.search_text,
                   k.run_id, k.gen_from
            FROM picks k
            JOIN real_chunks a ON a.rn = k.ra
            JOIN real_chunks b ON b.rn = k.rb
            CROSS JOIN LATERAL (SELECT left(a.text, length(a.text) / 2) || right(b.text, length(b.text) / 2) AS text) t
            """, {"model": model_id})
        # the synthetic chunk's terms: those of its first real chunk (real term and length distributions)
        conn.execute("""
            INSERT INTO corpusync.postings (term_id, version_id, ordinal, tf, dl)
            SELECT p.term_id, k.version_id, k.ordinal, p.tf, p.dl
            FROM picks k
            JOIN real_chunks a ON a.rn = k.ra
            JOIN corpusync.postings p ON p.version_id = a.version_id AND p.ordinal = a.ordinal""")
        conn.execute("""
            UPDATE corpusync.document_versions v SET chunk_count = s.n, lexical_tokens = s.tokens
            FROM (SELECT k.version_id, count(*) AS n, sum(a.dl) AS tokens FROM picks k
                  JOIN real_chunks a ON a.rn = k.ra GROUP BY k.version_id) s
            WHERE v.id = s.version_id""")
    conn.execute("SET maintenance_work_mem = '1GB'")
    conn.execute(sql.SQL(Path(__file__).resolve().parent.parent.joinpath("sql/queries/create_dense_index.sql")
                         .read_text()).format(index_name=sql.Identifier(f"chunks_dense_m{model_id}"),
                                              dim=sql.Literal(dim), model_id=sql.Literal(model_id)))
    conn.commit()
    conn.autocommit = True
    conn.execute("VACUUM (ANALYZE) corpusync.chunks")
    conn.execute("VACUUM (ANALYZE) corpusync.postings")  # index-only scans of the postings need the visibility map
    conn.autocommit = False
    total = conn.execute("SELECT count(*) FROM corpusync.live_chunks").fetchone()[0]
    print(f"scaled up to {total:,} live chunks in {time.perf_counter() - t0:.0f} s (HNSW rebuilt)")
    return int(total)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--home", type=Path, default=Path(".corpusync-bench"))
    ap.add_argument("--goldsets", type=Path,
                    default=Path(__file__).resolve().parent.parent.parent / "shared/data/goldsets")
    ap.add_argument("--scale", type=int, default=0, help="add synthetic chunks up to this many (0: none)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--k", type=int, default=10)
    args = ap.parse_args()
    settings = Settings(home=args.home)
    conn = open_database(settings)
    total = scale_up(conn, args.scale) if args.scale else conn.execute(
        "SELECT count(*) FROM corpusync.live_chunks").fetchone()[0]
    state = conn.execute("SELECT s.model_id, m.dimension FROM corpusync.index_state s "
                         "JOIN corpusync.embedding_models m ON m.id = s.model_id").fetchone()
    model_id, dim = int(state[0]), int(state[1])
    questions = []
    per_set = max(args.queries // 3, 1)
    for name in ("cmrc2018", "squad-v1.1-dev", "dureader2-demo"):
        questions += [q.question for q in sample_questions(load_goldset(args.goldsets / name), per_set).questions]
    embedder = build_embedder(settings)
    vectors = embedder.embed(questions).dense
    analyzer = Analyzer.from_settings(settings)
    texts = [analyzer.query(q).sql_text() for q in questions]
    shares = dict(conn.execute("SELECT split_part(source_path, '/', 1), count(*) FROM corpusync.live_chunks "
                               "GROUP BY 1").fetchall())
    filters = {"none": "{}", "cmrc2018/ (path)": '{"path": "cmrc2018/"}',
               "dureader2-demo/ (path)": '{"path": "dureader2-demo/"}',
               "lang=zh (metadata)": '{"metadata": {"lang": "zh"}}'}
    print(f"\n## Latency over {len(questions)} gold-set questions, {total:,} live chunks, k={args.k}, "
          f"ef_search={settings.hnsw_ef_search}, pool={settings.candidate_pool} (ms)")
    print("share of chunks per top folder: " + ", ".join(f"{k} {v / total:.1%}" for k, v in sorted(shares.items())))
    print("| mode | filter | p50 | p95 | mean rows |")
    print("|---|---|---|---|---|")
    for mode, (wd, wl) in MODES.items():
        for fname, flt in filters.items():
            times, rows = [], []
            for qt, qv in zip(texts, vectors, strict=True):
                t0 = time.perf_counter()
                with conn.transaction():
                    conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(settings.hnsw_ef_search)))
                    r = conn.execute("SELECT chunk_id FROM corpusync.search_hybrid(%s, %s, NULL, %s, %s::jsonb, NULL, "
                                     "%s, %s, 0, 60, %s)", (qt, HalfVector(qv), args.k, flt, wd, wl,
                                                            settings.candidate_pool)).fetchall()
                times.append((time.perf_counter() - t0) * 1000)
                rows.append(len(r))
            print(f"| {mode} | {fname} | {statistics.median(times):.1f} | {pct(times, 0.95):.1f} | "
                  f"{statistics.mean(rows):.1f} |")

    # HNSW recall@k vs exact, and filtered row counts with iterative scans on/off
    dense_sql = (f"SELECT c.id FROM corpusync.chunks c JOIN corpusync.documents d ON d.id = c.document_id "
                 f"WHERE c.model_id = {model_id} AND d.path LIKE %s "
                 f"ORDER BY c.dense::halfvec({dim}) <=> %s::halfvec({dim}) LIMIT {args.k}")
    print(f"\n## HNSW recall@{args.k} vs exact search, and rows returned under a filter")
    print("| filter | ef_search | iterative scan | recall@k vs exact | mean rows (k wanted) |")
    print("|---|---|---|---|---|")
    for like in ("%", "dureader2-demo/%"):
        for ef in (40, settings.hnsw_ef_search):
            for iterative in ("off", "relaxed_order"):
                recalls, counts = [], []
                for qv in vectors:
                    v = HalfVector(qv)
                    with conn.transaction():
                        conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(ef)))
                        conn.execute(sql.SQL("SET LOCAL hnsw.iterative_scan = {}").format(sql.Literal(iterative)))
                        got = {r[0] for r in conn.execute(dense_sql, (like, v)).fetchall()}
                        conn.execute("SET LOCAL enable_indexscan = off")
                        exact = {r[0] for r in conn.execute(dense_sql, (like, v)).fetchall()}
                    recalls.append(len(got & exact) / max(len(exact), 1))
                    counts.append(len(got))
                print(f"| {'none' if like == '%' else like.rstrip('%')} | {ef} | {iterative} | "
                      f"{statistics.mean(recalls):.3f} | {statistics.mean(counts):.1f} ({args.k}) |")
    conn.close()


if __name__ == "__main__":
    main()
