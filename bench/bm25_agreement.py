"""Does the lexical channel rank exactly like a textbook BM25? On an index built by bench/eval_goldsets.sh,
for a fixed sample of each gold set's questions, compare corpusync's lexical top-10 (BM25 in PostgreSQL)
with the `bm25s` package (Lucene variant, the same k1/b) over the same token lists: corpusync.core.lexical's
tokens of every live chunk's search text (a question's quoted phrase filters both sides). Ties aside: a
top-10 counts as identical when the score at every rank matches and, where the cut-off is not tied, the chunk
sets are equal.

Usage: python bench/bm25_agreement.py [--home .corpusync-bench] [--queries 200]
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

import numpy as np  # noqa: E402

from corpusync.core.lexical import Analyzer  # noqa: E402
from corpusync.store.db import open_database  # noqa: E402
from evaluation.goldsets import load_goldset, sample_questions  # noqa: E402
from query.search import Searcher  # noqa: E402
from schemas.settings import Settings  # noqa: E402

SETS = ("cmrc2018", "squad-v1.1-dev", "dureader2-demo")


def main() -> None:
    import bm25s

    ap = argparse.ArgumentParser()
    ap.add_argument("--home", type=Path, default=Path(".corpusync-bench"))
    ap.add_argument("--goldsets", type=Path,
                    default=Path(__file__).resolve().parent.parent.parent / "shared/data/goldsets")
    ap.add_argument("--queries", type=int, default=200)
    args = ap.parse_args()
    settings = Settings(home=args.home)
    conn = open_database(settings)
    analyzer = Analyzer.from_settings(settings)
    searcher = Searcher(settings, conn)
    rows = conn.execute("SELECT c.id, c.search_text FROM corpusync.live_chunks l JOIN corpusync.chunks c "
                        "ON c.id = l.chunk_id ORDER BY c.id").fetchall()
    ids = np.array([r[0] for r in rows])
    t0 = time.perf_counter()
    docs = [analyzer.tokens(text) for _, text in rows]
    vocab = {t: i for i, t in enumerate(sorted({t for d in docs for t in d}))}
    ref = bm25s.BM25(k1=settings.bm25_k1, b=settings.bm25_b, method="lucene")
    ref.index(bm25s.tokenization.Tokenized(ids=[[vocab[t] for t in d] for d in docs], vocab=vocab),
              show_progress=False)
    print(f"{len(rows):,} live chunks, {len(vocab):,} distinct terms; reference indexed in "
          f"{time.perf_counter() - t0:.1f} s (k1={settings.bm25_k1}, b={settings.bm25_b})\n")
    print("| gold set | questions | with hits | top-10 identical (ties aside) | max abs score error |")
    print("|---|---|---|---|---|")
    mismatches: list[str] = []
    for name in SETS:
        gs = sample_questions(load_goldset(args.goldsets / name), args.queries)
        same = with_hits = 0
        errors: list[float] = []
        for q in gs.questions:
            parsed = analyzer.query(q.question)  # a question may quote a phrase ("hoy", “巴拉达”号): it must appear
            terms = [vocab[t] for t in parsed.terms if t in vocab]
            scores = np.asarray(ref.get_scores(terms), np.float64) if terms else np.zeros(len(ids))
            if parsed.phrases or parsed.excluded_terms or parsed.excluded_phrases:
                keep = np.array([all(p in text for p in parsed.phrases)
                                 and not any(p in text for p in parsed.excluded_phrases)
                                 and not any(t in tokens for t in parsed.excluded_terms)
                                 for (_, text), tokens in zip(rows, docs, strict=True)])
                scores = np.where(keep, scores, 0.0)
            order = np.lexsort((ids, -scores))
            expected = [scores[i] for i in order[:10] if scores[i] > 0]
            hits = searcher.search(q.question, k=10, mode="lexical")
            with_hits += bool(hits)
            got = [h.lexical_score for h in hits]
            by_id = dict(zip(ids.tolist(), scores.tolist(), strict=True))
            errors += [abs(h.lexical_score - by_id[h.chunk_id]) for h in hits]
            ok = len(got) == len(expected) and np.allclose(got, expected, rtol=1e-5, atol=1e-7)
            if ok and len(expected) == 10 and len(order) > 10 and scores[order[10]] < expected[-1] * (1 - 1e-5):
                ok = {h.chunk_id for h in hits} == set(ids[order[:10]].tolist())
            same += ok
            if not ok and len(mismatches) < 5:
                mismatches.append(f"{name} {q.id} {q.question!r}: ours {[round(x, 4) for x in got]} vs "
                                  f"bm25s {[round(x, 4) for x in expected]}")
        err = max(errors) if errors else 0.0
        print(f"| {name} | {len(gs.questions)} | {with_hits} | {same} ({same / len(gs.questions):.1%}) | "
              f"{err:.2e} |")
    for m in mismatches:
        print("differs:", m)
    print(f"\nmedian terms per chunk: {statistics.median(len(set(d)) for d in docs):.0f}")
    conn.close()


if __name__ == "__main__":
    main()
