"""Channel fusion in Python (no SQL): a bit-exact mirror of the `fused` CTE of corpusync.search_hybrid
(sql/views/040_search.sql), so tuning here predicts what SQL returns. The Fusion record (the parameters stored
with the index), the candidates a search returns, and the fused order; fitting the parameters on a gold set is
evaluation.fusion_tuning.

What `fuse(..., Fusion(method="rrf"))` mirrors:
- a channel runs only when its weight is > 0 (`WHERE w > 0`): a chunk seen only by channels of weight 0 is
  not a result at all;
- r_c is the chunk's 1-based rank in channel c's pool (row_number, ties by chunk id), taken as given;
- fused = w_dense/(rrf_k + r_dense) + w_lexical/(rrf_k + r_lexical) + w_sparse/(rrf_k + r_sparse), a term
  being 0 where the chunk is not in that channel, added in that order in float64 as PostgreSQL does, so
  equal fused scores are equal here too;
- ORDER BY fused DESC, chunk id ASC, LIMIT k.
RRF order depends on the weights only up to a common positive factor (bit-exactly for powers of two;
other factors can, through rounding, split an exact tie between different sums).

Candidates for tuning are what search_hybrid returns with every weight > 0 and k at least the size of the
union of the channel pools (3 * pool): every candidate with its rank and score in each channel that found
it (`candidates_from_hits`). Ranks within a channel do not depend on the weights, so any fusion of these
candidates is exactly what SQL returns for it at the same pool.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

CHANNELS = ("dense", "lexical", "sparse")
METHODS = ("rrf", "score")
Method = Literal["rrf", "score"]


@dataclass(frozen=True)
class Candidate:
    """One retrieved chunk: its rank (1-based) and score in each channel that found it."""

    chunk_id: int
    ranks: dict[str, int]
    scores: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not set(self.ranks) <= set(CHANNELS) or not set(self.scores) <= set(self.ranks):
            raise ValueError(f"chunk {self.chunk_id}: ranks must name channels of {CHANNELS}, scores only "
                             f"channels with a rank (got ranks {self.ranks}, scores {self.scores})")
        if any(r < 1 for r in self.ranks.values()) or not all(map(math.isfinite, self.scores.values())):
            raise ValueError(f"chunk {self.chunk_id}: ranks start at 1 and scores must be finite")


def candidates_from_hits(hits: Iterable[Any]) -> list[Candidate]:
    """Candidates from query.search.Hit objects (anything with chunk_id and <channel>_rank/_score)."""
    out = []
    for h in hits:
        ranks = {c: int(r) for c in CHANNELS if (r := getattr(h, f"{c}_rank", None)) is not None}
        scores = {c: float(s) for c in ranks if (s := getattr(h, f"{c}_score", None)) is not None}
        out.append(Candidate(int(h.chunk_id), ranks, scores))
    return out


def _all_ones() -> dict[str, float]:
    return dict.fromkeys(CHANNELS, 1.0)


@dataclass(frozen=True)
class Fusion:
    """Fusion parameters, as stored with the index and passed to SQL (w_dense, w_lexical, w_sparse, rrf_k).

    A channel missing from `weights` gets 1.0 (as query.search reads settings.rrf_weights). `rrf_k` is
    unused by method "score" (kept so storing a score fusion leaves the SQL constant alone).
    """

    method: Method = "rrf"
    weights: dict[str, float] = field(default_factory=_all_ones)
    rrf_k: float = 60.0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown fusion method {self.method!r}: use one of {', '.join(METHODS)}")
        if not set(self.weights) <= set(CHANNELS):
            raise ValueError(f"unknown channel(s) {sorted(set(self.weights) - set(CHANNELS))}: use {CHANNELS}")
        w = {c: float(self.weights.get(c, 1.0)) for c in CHANNELS}
        if not all(math.isfinite(v) and v >= 0 for v in w.values()):
            raise ValueError(f"weights must be finite and >= 0, got {w}")
        if not (math.isfinite(self.rrf_k) and self.rrf_k > 0):  # as search_hybrid and corpusync.fusions
            raise ValueError(f"rrf_k must be finite and > 0, got {self.rrf_k}")
        object.__setattr__(self, "weights", w)
        object.__setattr__(self, "rrf_k", float(self.rrf_k))

    def active(self) -> tuple[str, ...]:
        """The channels that run (weight > 0), in CHANNELS order."""
        return tuple(c for c in CHANNELS if self.weights[c] > 0)

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "weights": dict(self.weights), "rrf_k": self.rrf_k}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Fusion:
        """From as_dict() or a corpusync.fusions row: only method, weights and rrf_k are read."""
        rrf_k = d.get("rrf_k")
        return cls(method=d.get("method") or "rrf", weights=dict(d.get("weights") or {}),
                   rrf_k=60.0 if rrf_k is None else float(rrf_k))

    def label(self) -> str:
        w = " ".join(f"{c}={self.weights[c]:g}" for c in CHANNELS)
        return f"rrf rrf_k={self.rrf_k:g} {w}" if self.method == "rrf" else f"score {w}"


def minmax(cands: Sequence[Candidate], channel: str) -> dict[int, float]:
    """Min-max normalised scores of the candidates in `channel` (all equal, e.g. a single one: 1.0)."""
    vals: dict[int, float] = {}
    for c in cands:
        if channel in c.ranks:
            if channel not in c.scores:
                raise ValueError(f"method 'score' needs a {channel} score for chunk {c.chunk_id}")
            vals[c.chunk_id] = c.scores[channel]
    if not vals:
        return {}
    lo, hi = min(vals.values()), max(vals.values())
    return {cid: 1.0 if hi == lo else (s - lo) / (hi - lo) for cid, s in vals.items()}


def fused_scores(cands: Sequence[Candidate], fusion: Fusion,
                 scale: Mapping[str, float] | None = None) -> dict[int, float]:
    """Fused score of each candidate found by a running channel (weight > 0).

    `scale`: per-query channel multipliers applied to the weights before anything else (query.search scales
    the dense weight by how much of the query the model can read); a channel scaled to 0 does not run.

    "rrf": the SQL formula (module docstring). "score": per running channel c, norm_c = (s - min) / (max -
    min) over this query's candidates present in c (1.0 when max == min, e.g. a single candidate; 0 where
    absent); fused = w_dense * norm_dense + w_lexical * norm_lexical + w_sparse * norm_sparse, in that order.
    """
    if len({c.chunk_id for c in cands}) != len(cands):
        raise ValueError("duplicate chunk ids among the candidates")
    w = {c: fusion.weights[c] * (scale or {}).get(c, 1.0) for c in CHANNELS}
    active = tuple(c for c in CHANNELS if w[c] > 0)
    norm = {ch: minmax(cands, ch) for ch in active} if fusion.method == "score" else {}
    out: dict[int, float] = {}
    for c in cands:
        if not any(ch in c.ranks for ch in active):
            continue
        total = 0.0
        for ch in active:
            if fusion.method == "score":
                total += w[ch] * norm[ch].get(c.chunk_id, 0.0)
            elif ch in c.ranks:
                total += w[ch] / (fusion.rrf_k + c.ranks[ch])
        out[c.chunk_id] = total
    return out


def fuse(cands: Sequence[Candidate], fusion: Fusion, k: int, scale: Mapping[str, float] | None = None) -> list[int]:
    """Top-k chunk ids by fused score DESC, chunk id ASC (for "rrf": exactly search_hybrid's order)."""
    if k <= 0:
        return []
    scores = fused_scores(cands, fusion, scale)
    return sorted(scores, key=lambda cid: (-scores[cid], cid))[:k]
