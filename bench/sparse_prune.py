"""What pruning sparse lexical vectors to their top-k weights (CORPUSYNC_SPARSE_TOP_K; pgvector's sparsevec
HNSW takes at most 1,000 non-zeros) costs in retrieval: sparse Recall@k on the CMRC 2018 and SQuAD gold
sets at several top-k, with exact inner-product search (no index, so only pruning changes).

Two sources of sparse vectors:
  --model-path DIR   BAAI/bge-m3's trained lexical weights (FlagEmbedder, the refresh code path) at
                     top-k 1,000, then pruned with SparseRows.prune. The figure the issue asks for.
  (default)          No trained sparse model is available offline here, so a stand-in with the same shape:
                     per distinct token id of the all-MiniLM-L6-v2 tokenizer, (1 + log tf) x idf for
                     passages and idf for questions. It shows how much a lexical sparse vector loses when
                     cut to k weights; it is not a BGE-M3 measurement.

Also prints distinct tokens per passage: pruning at k changes only passages with more than k of them.

Usage: python bench/sparse_prune.py [--questions 300] [--passages 3000] [--model-path DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpusync.core.offline import apply_offline_defaults

apply_offline_defaults()
os.environ.setdefault("CORPUSYNC_EMBEDDER", "minilm")  # the benches measure the demo/test model unless told

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

from corpusync.adapters.embedders import FlagEmbedder, build_embedder  # noqa: E402
from corpusync.core.vectors import SparseRows  # noqa: E402
from evaluation.goldset_formats import passage_filename  # noqa: E402
from evaluation.goldsets import load_goldset, sample_questions  # noqa: E402
from schemas.settings import Settings  # noqa: E402

TOP_K = [1000, 512, 256, 128, 64, 32, 16]
RECALL_AT = [1, 5, 10, 20]


def pick_passages(goldset, questions, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    """Gold passages of the questions, then others in a fixed hash order, up to n."""
    by_file = {passage_filename(p): p for p in goldset.passages}
    gold = {by_file[d] for q in questions for d in q.gold_documents if d in by_file}
    rest = sorted((p for p in goldset.passages if p not in gold), key=lambda p: hashlib.sha256(p.encode()).digest())
    return sorted(gold) + rest[:max(0, n - len(gold))]


def tfidf_rows(tokenizer, texts: list[str], idf: np.ndarray | None, query: bool) -> tuple[SparseRows, np.ndarray]:  # type: ignore[no-untyped-def]
    """Stand-in lexical weights over token ids (special tokens out). Returns (rows, idf)."""
    ids = tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    vocab = tokenizer.vocab_size
    rows = np.repeat(np.arange(len(ids)), [len(x) for x in ids])
    cols = np.concatenate([np.asarray(x, np.int64) for x in ids]) if ids else np.zeros(0, np.int64)
    tf = sp.csr_matrix((np.ones(len(cols), np.float32), (rows, cols)), shape=(len(ids), vocab))
    tf.sum_duplicates()
    if idf is None:
        df = np.bincount(tf.indices, minlength=vocab)
        idf = np.log((len(ids) + 1) / (df + 1)).astype(np.float32) + 1.0
    w = tf.copy()
    w.data = (np.ones_like(w.data) if query else 1.0 + np.log(w.data)) * idf[w.indices]
    w.sort_indices()
    return SparseRows(w.indptr.astype(np.int64), w.indices.astype(np.int32), w.data.astype(np.float32)), idf


def model_rows(embedder: FlagEmbedder, texts: list[str], batch: int = 16) -> SparseRows:
    parts = []
    for i in range(0, len(texts), batch):
        out = embedder.embed(texts[i:i + batch])
        assert out.sparse is not None
        parts.append(out.sparse)
    return SparseRows.concat(parts)


def to_csr(rows: SparseRows, vocab: int) -> sp.csr_matrix:
    return sp.csr_matrix((rows.values, rows.indices, rows.indptr), shape=(len(rows), vocab))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--goldsets", type=Path,
                    default=Path(__file__).resolve().parent.parent.parent / "shared/data/goldsets")
    ap.add_argument("--questions", type=int, default=300)
    ap.add_argument("--passages", type=int, default=3000)
    ap.add_argument("--model-path", type=Path, default=None, help="a local BAAI/bge-m3 directory")
    args = ap.parse_args()
    if args.model_path:
        embedder = build_embedder(Settings(embedder="bge-m3", model_path=args.model_path, sparse_top_k=1000))
        source = f"BGE-M3 lexical weights ({embedder.identity.label})"
        vocab = int(embedder.identity.sparse_dim or 0)
    else:
        embedder = build_embedder(Settings())
        source = "stand-in: (1 + log tf) x idf over all-MiniLM-L6-v2 token ids (NOT BGE-M3)"
        vocab = int(embedder.tokenizer.vocab_size)
    print(f"sparse source: {source}")
    for name in ("cmrc2018", "squad-v1.1-dev"):
        gs = load_goldset(args.goldsets / name)
        questions = sample_questions(gs, args.questions).questions
        pids = pick_passages(gs, questions, args.passages)
        texts = [gs.passages[p] for p in pids]
        if args.model_path:
            docs = model_rows(embedder, texts)
            queries = model_rows(embedder, [q.question for q in questions])
        else:
            docs, idf = tfidf_rows(embedder.tokenizer, texts, None, query=False)
            queries, _ = tfidf_rows(embedder.tokenizer, [q.question for q in questions], idf, query=True)
        nnz = docs.nnz()
        print(f"\n## {name}: {len(questions)} questions, {len(pids):,} passages; non-zeros per passage median "
              f"{statistics.median(nnz.tolist()):.0f}, p90 {np.percentile(nnz, 90):.0f}, max {nnz.max()}")
        print("| top-k | " + " | ".join(f"R@{k}" for k in RECALL_AT) + " | passages pruned | weight mass kept |")
        print("|---|" + "---|" * (len(RECALL_AT) + 2))
        pos = {passage_filename(p): i for i, p in enumerate(pids)}
        gold = [{pos[d] for d in q.gold_documents if d in pos} for q in questions]
        total_mass = float(docs.values.sum())
        for k in TOP_K:
            d, q = docs.prune(k), queries.prune(k)
            scores = (to_csr(q, vocab) @ to_csr(d, vocab).T).toarray()
            ranked = np.argsort(-scores, axis=1, kind="stable")[:, :max(RECALL_AT)]
            recall = [np.mean([bool(g & set(r[:at].tolist())) for g, r in zip(gold, ranked, strict=True)])
                      for at in RECALL_AT]
            print(f"| {k} | " + " | ".join(f"{x:.3f}" for x in recall) +
                  f" | {(nnz > k).mean():.1%} | {float(d.values.sum()) / total_mass:.1%} |")


if __name__ == "__main__":
    main()
