"""Retrieval quality of fixed-size vs structure-aware chunking at the same token budget.

For each gold set in ../shared/data/goldsets (CMRC 2018, SQuAD v1.1 dev, DuReader), a fixed subset of
questions with their gold passages plus distractor passages is exported; the three corpora are indexed
together twice through the real pipeline (embedded PostgreSQL, Prefect flow, MiniLM): once with
chunk_strategy=fixed, once with chunk_strategy=structure. Each index is evaluated with the evaluation
module (evaluation/, the same code as the gate) and Recall@1/5/10 and MRR@10 are printed per set and mode.

Usage: python bench/chunking.py [--limit 150] [--distractors 300] [--budget 128] [--overlap 0.12]
       [--work .corpusync-chunkbench]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpusync.core.offline import apply_offline_defaults

apply_offline_defaults()
os.environ.setdefault("CORPUSYNC_EMBEDDER", "minilm")  # the benches measure the demo/test model unless told

from evaluation.goldsets import export_corpus, load_goldset, sample_questions  # noqa: E402
from schemas.settings import Settings  # noqa: E402

SETS = ("cmrc2018", "squad-v1.1-dev", "dureader2-demo")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--goldsets", type=Path,
                    default=Path(__file__).resolve().parent.parent.parent / "shared/data/goldsets")
    ap.add_argument("--limit", type=int, default=150)
    ap.add_argument("--distractors", type=int, default=300)
    ap.add_argument("--budget", type=int, default=128)
    ap.add_argument("--overlap", type=float, default=0.12, help="chunk overlap for both strategies")
    ap.add_argument("--work", type=Path, default=Path(".corpusync-chunkbench"))
    args = ap.parse_args()
    from prefect.testing.utilities import prefect_test_harness

    from corpusync.app.evaluating import evaluate_and_gate
    from flows.refresh import refresh
    from query.search import Searcher

    shutil.rmtree(args.work, ignore_errors=True)
    corpus = args.work / "corpus"
    subsets = {}
    for name in SETS:
        gs = load_goldset(args.goldsets / name)
        subsets[name] = sample_questions(gs, args.limit)
        n = export_corpus(gs, corpus / name, only_gold_of=subsets[name], distractors=args.distractors)
        print(f"{name}: {len(subsets[name].questions)} questions, {n} passages")
    # the gold set files evaluated are the subsets, written as corpusync JSON lines with corpus-relative refs
    import json

    specs = []
    for name, gs in subsets.items():
        path = args.work / f"{name}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for q in gs.questions:
                f.write(json.dumps(q.model_dump() | {"gold_documents": [f"{name}/{g}" for g in q.gold_documents]},
                                   ensure_ascii=False) + "\n")
        specs.append(str(path))
    table: dict[tuple[str, str, str], dict[str, float]] = {}
    with prefect_test_harness(server_startup_timeout=120):
        for strategy in ("fixed", "structure"):
            settings = Settings(home=args.work / f"home-{strategy}", chunk_strategy=strategy,  # type: ignore[arg-type]
                                chunk_max_tokens=args.budget, chunk_overlap=args.overlap)
            t0 = time.perf_counter()
            summary = refresh(str(corpus), settings=settings)
            print(f"{strategy}: {summary['chunks']['inserted']} chunks, refresh {time.perf_counter() - t0:.0f} s")
            from corpusync.store.db import open_database

            with open_database(settings) as conn:
                outcome = evaluate_and_gate(settings, conn, Searcher(settings, conn), summary["generation"],
                                            specs=specs, gated=False)
            for ev in outcome.evaluations:
                for mode, metrics in ev.metrics.items():
                    table[(ev.goldset.split("/")[-1], mode, strategy)] = metrics
    print(f"\n## Recall@k by chunking strategy (budget {args.budget} tokens, overlap {args.overlap}, MiniLM, "
          f"{args.limit} questions per set)")
    print("| gold set | mode | strategy | R@1 | R@5 | R@10 | MRR@10 |")
    print("|---|---|---|---|---|---|---|")
    for (gs_name, mode, strategy), m in sorted(table.items()):
        print(f"| {gs_name} | {mode} | {strategy} | {m['recall@1']:.3f} | {m['recall@5']:.3f} | {m['recall@10']:.3f} "
              f"| {m['mrr@10']:.3f} |")


if __name__ == "__main__":
    main()
