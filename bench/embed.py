"""CPU embedding throughput with the packaged MiniLM: length-sorted token-budget batches (what refresh does)
vs a naive baseline (fixed batches of 32 in input order), on real chunks of the gold-set corpora.

Reports real (non-pad) tokens/s, padded/real token ratio, chunks/s, batch sizes and peak RSS; median of
--repeat runs, ratio against the naive baseline measured in the same run. The GPU counterpart (BGE-M3
architecture, bf16) is bench/embed_gpu.py via bench/gpu_check.sh.

Usage: python bench/embed.py [--chunks 1000] [--repeat 3] [--budget 16384]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpusync.core.offline import apply_offline_defaults

apply_offline_defaults()
os.environ.setdefault("CORPUSYNC_EMBEDDER", "minilm")  # the benches measure the demo/test model unless told

import torch  # noqa: E402

from corpusync.adapters.embedders import build_embedder  # noqa: E402
from evaluation.goldsets import load_goldset  # noqa: E402
from schemas.settings import Settings  # noqa: E402
from tasks.embed import EmbedStats, encode_texts, token_budget_batches  # noqa: E402


def real_chunks(goldsets: Path, n: int, settings: Settings) -> list[str]:
    """Chunks of CMRC 2018 and SQuAD passages cut by the real chunker at the configured budget."""
    import hashlib
    from datetime import UTC, datetime

    from schemas.records import Block, ParsedDocument, SourceFile
    from tasks.chunk import ChunkConfig, chunk_document

    embedder = build_embedder(settings)
    config = ChunkConfig(settings.chunk_max_tokens, settings.chunk_overlap)
    texts: list[str] = []
    sets = [load_goldset(goldsets / name) for name in ("cmrc2018", "squad-v1.1-dev")]
    pools = [iter(sorted(gs.passages.items())) for gs in sets]
    while len(texts) < n:
        for pool in pools:  # alternate Chinese and English passages
            pid, text = next(pool)
            src = SourceFile(pid, Path(pid), len(text), datetime.now(UTC), hashlib.sha256(text.encode()).hexdigest())
            doc = ParsedDocument(src, [Block("text", t) for t in text.split("\n\n") if t.strip()], "text", "1",
                                 "text/plain")
            texts += [c.text for c in chunk_document(doc, embedder, config).chunks]
    return texts[:n]


def naive(embedder, texts: list[str], lengths: list[int], size: int = 32) -> EmbedStats:  # type: ignore[no-untyped-def]
    stats = EmbedStats()
    for i in range(0, len(texts), size):
        batch = list(range(i, min(i + size, len(texts))))
        embedder.embed([texts[j] for j in batch])
        stats.batches += 1
        stats.batch_sizes.append(len(batch))
        stats.real_tokens += sum(lengths[j] for j in batch)
        stats.padded_tokens += len(batch) * max(lengths[j] for j in batch)
    return stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--goldsets", type=Path,
                    default=Path(__file__).resolve().parent.parent.parent / "shared/data/goldsets")
    ap.add_argument("--chunks", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--budget", type=int, default=16384)
    args = ap.parse_args()
    settings = Settings(embed_batch_tokens=args.budget)
    embedder = build_embedder(settings)
    texts = real_chunks(args.goldsets, args.chunks, settings)
    lengths = embedder.count_tokens(texts)
    embedder.embed(texts[:8])  # warm-up (model load, first-call allocations)
    print(f"{len(texts)} chunks, {sum(lengths):,} tokens (mean {statistics.mean(lengths):.0f}, max {max(lengths)}); "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {embedder.device}")
    results: dict[str, list[tuple[float, EmbedStats]]] = {"naive fixed 32": [],
                                                          f"sorted token-budget ({args.budget:,})": []}
    for _ in range(args.repeat):
        for name in results:
            t0 = time.perf_counter()
            if name.startswith("naive"):
                stats = naive(embedder, texts, lengths)
            else:
                stats = EmbedStats()
                encode_texts(embedder, texts, args.budget, stats)
            results[name].append((time.perf_counter() - t0, stats))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\n## CPU embedding, MiniLM-L6 (384-d), median of {args.repeat} runs")
    print("| strategy | real tok/s | chunks/s | padded/real | batches | median batch | max batch | s |")
    print("|---|---|---|---|---|---|---|---|")
    base = None
    for name, runs in results.items():
        secs = statistics.median(t for t, _ in runs)
        st = runs[0][1]
        tps = st.real_tokens / secs
        base = base or tps
        print(f"| {name} | {tps:,.0f} | {len(texts) / secs:,.1f} | {st.padded_tokens / st.real_tokens:.3f} | "
              f"{st.batches} | {statistics.median(st.batch_sizes):.0f} | {max(st.batch_sizes)} | {secs:.2f} |")
    sorted_name = list(results)[1]
    r = statistics.median(t for t, _ in results["naive fixed 32"]) / statistics.median(
        t for t, _ in results[sorted_name])
    print(f"\nsorted token-budget vs naive: {r:.2f}x; peak RSS {peak:,.0f} MiB; "
          f"{len(token_budget_batches(lengths, args.budget))} budget batches")


if __name__ == "__main__":
    main()
