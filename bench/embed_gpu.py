"""GPU embedding throughput for the BGE-M3 architecture (XLM-RoBERTa-large), built from its config with
random weights (same FLOPs as the real model; no hub access on the GPU machine).

Token-id batches follow the length distribution of real chunks (bench/data/chunk_lengths.json). Compares in
the same run: (a) naive fixed batches of 32 in corpus order, (b) corpusync's length-sorted token-budget
batches (tasks.embed.token_budget_batches) with out-of-memory halving. Reports real (non-pad) tokens/s,
padded/real ratio, chunks/s, model FLOP utilisation against the measured bf16 peak, peak memory, batch sizes,
OOM events, and the time of the vectorised sparse post-processing (corpusync.core.vectors.sparse_top_k).

    python bench/embed_gpu.py [--chunks 3000] [--budget 65536] [--peak-tflops 790]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from tasks.embed import token_budget_batches

LAYERS, HIDDEN, HEADS, FFN, VOCAB = 24, 1024, 16, 4096, 250002


def model_flops_per_token(seq: int) -> float:
    """Forward FLOPs per real token: 2 x non-embedding parameters + attention (QK^T and AV)."""
    per_layer = 4 * HIDDEN * HIDDEN + 2 * HIDDEN * FFN  # q,k,v,o + two FFN matrices
    return 2 * LAYERS * per_layer + 4 * LAYERS * HIDDEN * seq


def build_model(device: str) -> torch.nn.Module:
    from transformers import XLMRobertaConfig, XLMRobertaModel

    cfg = XLMRobertaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, intermediate_size=FFN, max_position_embeddings=8194,
                           type_vocab_size=1, pad_token_id=1)
    try:
        model = XLMRobertaModel(cfg, add_pooling_layer=False, attn_implementation="sdpa")
    except TypeError:
        cfg._attn_implementation = "sdpa"
        model = XLMRobertaModel(cfg, add_pooling_layer=False)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return model.to(device=device, dtype=dtype).eval()


def run(model: torch.nn.Module, batches: list[list[int]], lengths: list[int], device: str) -> dict:
    """Forward every batch (halving a batch on OOM); returns timing and padding figures."""
    ooms = 0
    real = padded = flops = 0
    sizes: list[int] = []
    pending = [list(b) for b in batches]
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    while pending:
        b = pending.pop(0)
        width = max(lengths[i] for i in b)
        ids = torch.randint(5, VOCAB, (len(b), width), device=device)
        mask = torch.zeros((len(b), width), dtype=torch.long, device=device)
        for row, i in enumerate(b):
            mask[row, : lengths[i]] = 1
        try:
            with torch.inference_mode():
                out = model(input_ids=ids, attention_mask=mask).last_hidden_state
                _ = torch.nn.functional.normalize(out[:, 0].float(), dim=-1)
        except torch.OutOfMemoryError:
            ooms += 1
            torch.cuda.empty_cache()
            pending[:0] = [b[: len(b) // 2], b[len(b) // 2:]]
            continue
        sizes.append(len(b))
        n_real = sum(lengths[i] for i in b)
        real += n_real
        padded += len(b) * width
        flops += n_real * model_flops_per_token(width)
    if device == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
    return {"seconds": dt, "real_tokens": real, "padded_tokens": padded, "chunks": len(lengths),
            "flops": flops, "ooms": ooms, "batches": len(sizes), "median_batch": statistics.median(sizes),
            "max_batch": max(sizes), "peak_gib": peak}


def sparse_postprocess_seconds(device: str, batch: int = 64, width: int = 512, reps: int = 5) -> float:
    from corpusync.core.vectors import sparse_top_k

    ids = torch.randint(5, VOCAB, (batch, width), device=device)
    w = torch.rand((batch, width), device=device)
    sparse_top_k(w, ids, [0, 1, 2, 3], 256, VOCAB)
    t0 = time.perf_counter()
    for _ in range(reps):
        sparse_top_k(w, ids, [0, 1, 2, 3], 256, VOCAB)
    return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=3000)
    ap.add_argument("--budget", type=int, default=65536, help="token budget of one sorted batch")
    ap.add_argument("--naive-batch", type=int, default=32)
    ap.add_argument("--peak-tflops", type=float, default=790.0, help="measured bf16 peak of the device")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = json.loads((Path(__file__).parent / "data" / "chunk_lengths.json").read_text())
    rng = random.Random(0)
    lengths = [rng.choice(data["lengths"]) for _ in range(args.chunks)]
    model = build_model(device)
    naive = [list(range(i, min(i + args.naive_batch, len(lengths)))) for i in range(0, len(lengths), args.naive_batch)]
    sorted_batches = token_budget_batches(lengths, args.budget)
    run(model, sorted_batches[:3], lengths, device)  # warm-up (kernels, allocator)
    results = {}
    for name, batches in (("naive fixed 32", naive), ("sorted token-budget", sorted_batches)):
        reps = [run(model, batches, lengths, device) for _ in range(args.repeats)]
        best = sorted(reps, key=lambda r: r["seconds"])[len(reps) // 2]  # median by time
        results[name] = best
    sparse_s = sparse_postprocess_seconds(device)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"device: {name}; torch {torch.__version__}; {args.chunks} chunks, lengths from {data['source'][:60]}...")
    print(f"{'strategy':<22}{'real tok/s':>12}{'chunks/s':>10}{'pad/real':>10}{'MFU':>8}{'batches':>9}"
          f"{'med bs':>8}{'max bs':>8}{'OOMs':>6}{'peak GiB':>10}")
    for label, r in results.items():
        mfu = r["flops"] / r["seconds"] / (args.peak_tflops * 1e12)
        print(f"{label:<22}{r['real_tokens'] / r['seconds']:>12,.0f}{r['chunks'] / r['seconds']:>10,.0f}"
              f"{r['padded_tokens'] / r['real_tokens']:>10.3f}{mfu:>8.1%}{r['batches']:>9}{r['median_batch']:>8.0f}"
              f"{r['max_batch']:>8}{r['ooms']:>6}{r['peak_gib']:>10.1f}")
    a, b = results["naive fixed 32"], results["sorted token-budget"]
    print(f"speed-up sorted/naive (real tokens/s): {a['seconds'] / b['seconds']:.2f}x")
    per_batch = b["seconds"] / b["batches"]
    print(f"sparse post-processing (64 x 512, top-256): {sparse_s * 1e3:.1f} ms per batch "
          f"vs {per_batch * 1e3:.1f} ms per model batch")
    if args.json:
        args.json.write_text(json.dumps({"device": name, "results": results, "sparse_s": sparse_s}, indent=2))


if __name__ == "__main__":
    main()
