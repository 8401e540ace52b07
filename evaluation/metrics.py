"""Retrieval metrics and the paired bootstrap. Pure functions over ranked ids and relevance sets.

Conventions (binary relevance):
- `ranked`: retrieved chunk ids, best first. `relevant`: ids of the relevant chunks in the generation.
- Recall@k counts gold *units* (gold documents / passages), not chunks: a unit is recalled when any of its
  relevant chunks is in the top k. So re-chunking a passage into more pieces does not change recall. A unit
  with alternatives (the same article in two versions of a law) holds the relevant chunks of every
  alternative: retrieving any one of them recalls the unit.
- Hit@k: any relevant chunk in the top k. MRR@k: 1 / rank of the first relevant chunk (0 beyond k), a chunk
  of any alternative counting.
- nDCG@k over chunks: sum(rel_i / log2(i + 1)) / ideal, ideal = min(|relevant|, k) relevant chunks first.
  With alternatives, each unit is judged on one alternative: the one whose chunk is ranked first in the top
  k (or, when none is retrieved, the one with most relevant chunks); the other alternatives' chunks are
  neither gain nor part of the ideal, so nDCG stays within 0..1.
- Latency (`latency_ms_p50`, `latency_ms_p95`): per mode, over the questions' search calls. Reported and
  stored with the aggregate metrics, never per question and never gated (not a quality metric).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from schemas.eval import GATED_METRICS, K_VALUES, LATENCY_METRICS
from schemas.eval import RETRIEVAL_METRICS as METRICS

__all__ = ["GATED_METRICS", "K_VALUES", "LATENCY_METRICS", "METRICS"]


def is_quality_metric(metric: str) -> bool:
    """Quality metrics are higher-is-better scores in 0..1 that a gate may judge (retrieval metrics and the
    offline RAGAS context metrics); latency is not one, nor is a name no evaluation computes."""
    return metric in GATED_METRICS


def first_relevant_rank(ranked: Sequence[int], relevant: set[int]) -> int | None:
    for i, cid in enumerate(ranked, start=1):
        if cid in relevant:
            return i
    return None


def recall_at_k(ranked: Sequence[int], units: Sequence[set[int]], k: int) -> float:
    """Share of gold units (each a set of relevant chunk ids) with a chunk in the top k."""
    if not units:
        return 0.0
    top = set(ranked[:k])
    return sum(1 for u in units if u & top) / len(units)


def hit_at_k(ranked: Sequence[int], relevant: set[int], k: int) -> float:
    return 1.0 if relevant.intersection(ranked[:k]) else 0.0


def mrr_at_k(ranked: Sequence[int], relevant: set[int], k: int) -> float:
    r = first_relevant_rank(ranked[:k], relevant)
    return 0.0 if r is None else 1.0 / r


def ndcg_at_k(ranked: Sequence[int], relevant: set[int], k: int) -> float:
    dcg = sum(1.0 / math.log2(i + 1) for i, cid in enumerate(ranked[:k], start=1) if cid in relevant)
    ideal = sum(1.0 / math.log2(i + 1) for i in range(1, min(len(relevant), k) + 1))
    return dcg / ideal if ideal > 0 else 0.0


def judged_relevant(ranked: Sequence[int], alternatives: Sequence[Sequence[set[int]]], k: int) -> set[int]:
    """The relevant chunks nDCG@k judges when units have alternatives: per unit, the alternative whose chunk
    comes first in the top k, or, when none is there, the alternative with the most relevant chunks."""
    rank = {cid: i for i, cid in enumerate(ranked[:k])}
    out: set[int] = set()
    for alts in alternatives:
        present = [a for a in alts if a]
        if not present:
            continue
        found = [(min(rank[c] for c in a if c in rank), i) for i, a in enumerate(present) if any(c in rank for c in a)]
        out |= present[min(found)[1]] if found else max(present, key=len)
    return out


def question_scores(ranked: Sequence[int], units: Sequence[set[int]],
                    alternatives: Sequence[Sequence[set[int]]] | None = None) -> dict[str, float]:
    """Every metric of METRICS for one question. `units`: the relevant chunk ids per gold unit (all its
    alternatives together); `alternatives`: the same per alternative (one list per unit), for nDCG."""
    relevant: set[int] = set().union(*units) if units else set()
    scores = {f"recall@{k}": recall_at_k(ranked, units, k) for k in K_VALUES}
    scores["mrr@10"] = mrr_at_k(ranked, relevant, 10)
    judged = judged_relevant(ranked, alternatives, 10) if alternatives else relevant
    scores["ndcg@10"] = ndcg_at_k(ranked, judged, 10)
    scores["hit@10"] = hit_at_k(ranked, relevant, 10)
    return scores


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50 and p95 (linear interpolation) of per-query wall times, in milliseconds."""
    if not seconds:
        return {}
    ms = np.asarray(seconds, dtype=np.float64) * 1000.0
    p50, p95 = np.percentile(ms, [50, 95])
    return {"latency_ms_p50": round(float(p50), 3), "latency_ms_p95": round(float(p95), 3)}


def aggregate(per_question: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean of each metric over questions (a question that retrieved nothing relevant counts as 0)."""
    if not per_question:
        return {m: 0.0 for m in METRICS}
    return {m: float(np.mean([q[m] for q in per_question])) for m in per_question[0]}


def paired_bootstrap(candidate: Sequence[float], baseline: Sequence[float], *, samples: int = 2000,
                     confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """Mean of (candidate - baseline) over paired questions and its percentile bootstrap interval.

    Deterministic for a given seed, so a rerun on the same data gives the same verdict.
    """
    c = np.asarray(candidate, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if c.shape != b.shape:
        raise ValueError("paired bootstrap needs the same questions on both sides")
    if c.size == 0:
        return 0.0, 0.0, 0.0
    diff = c - b
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, diff.size, size=(samples, diff.size))].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(diff.mean()), float(lo), float(hi)
