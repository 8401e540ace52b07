"""Fitting the fusion parameters (channel weights, rrf_k, method) on a gold set by k-fold cross-validation,
over candidates fused as evaluation.fusion does (the SQL mirror): the search grid, a batched scorer that
scores one grid point for all questions at once, the never-below-a-channel rule and a plain-text report.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import numpy as np

from evaluation.fusion import CHANNELS, Candidate, Fusion, Method, fuse, minmax
from evaluation.metrics import aggregate, question_scores

OBJECTIVE = "(recall@10 + mrr@10) / 2"
REPORTED = ("recall@10", "mrr@10", "objective")
_ANCHORS = ("lexical", "dense", "sparse")  # the first searched channel of these is fixed at weight 1
_TIE = 1e-9                                # objective differences below this are ties


@dataclass
class QuestionCandidates:
    question_id: str
    candidates: list[Candidate]
    relevant: list[set[int]]  # relevance units: evaluation.relevance.Relevance.units (one set per gold unit)
    scale: dict[str, float] = field(default_factory=dict)  # per-channel weight multipliers of this query


@dataclass(frozen=True)
class Grid:
    """Search space. Weights are relative: the first searched channel of lexical, dense, sparse is fixed at
    1 and the others take each value; then that channel at 0 and the same recursively over the rest (so
    {lexical, dense, sparse} gives 36 + 6 + 1 = 43 weight vectors, none equal up to scale)."""

    weights: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
    rrf_k: tuple[float, ...] = (5.0, 10.0, 20.0, 40.0, 60.0, 100.0)
    methods: tuple[Method, ...] = ("rrf", "score")

    def fusions(self, channels: Sequence[str], default: Fusion) -> list[Fusion]:
        anchored = [c for c in _ANCHORS if c in channels]
        out = []
        for vec in _weight_vectors(anchored, self.weights):
            w = {c: vec.get(c, 0.0) for c in CHANNELS}
            for m in self.methods:
                ks = self.rrf_k if m == "rrf" else (default.rrf_k,)
                out += [Fusion(m, w, k) for k in ks]
        return out


def _weight_vectors(chs: Sequence[str], values: Sequence[float]) -> list[dict[str, float]]:
    if not chs:
        return []
    anchor, rest = chs[0], list(chs[1:])
    out = [{anchor: 1.0, **dict(zip(rest, combo, strict=True))} for combo in product(values, repeat=len(rest))]
    return out + [{anchor: 0.0, **w} for w in _weight_vectors(rest, values)]


@dataclass
class TuneResult:
    best: Fusion                      # refit on all questions; channels no candidate has are set to 0
    default: Fusion
    folds: int
    objective: str
    held_in: dict[str, float]         # mean over folds of each fold's choice scored on its training folds
    held_out: dict[str, float]        # mean over folds of each fold's choice scored on the held-out fold
    default_scores: dict[str, float]  # the default on all questions
    per_fold: list[dict[str, Any]]
    grid_size: int

    changed: bool = False             # whether `best` fuses differently from the default
    # the cross-validated gain over the default: question by question, the objective of the choice of the fold
    # that held the question out minus the default's; its mean and that mean's standard error
    held_out_gain: float = 0.0
    gain_se: float = 0.0
    kept_default: bool = False        # the refit on all questions differed, but the gain was within one SE
    # never_below: where the default falls furthest below a channel ("<set>: <metric> <score> < <channel>
    # <score>"), the reason a fit is adopted whatever its gain; "" when it does not
    default_below: str = ""


def _effective(f: Fusion, present: set[str]) -> Fusion:
    """`f` with the channels no candidate has set to 0 (they cannot change any result)."""
    return Fusion(f.method, {c: f.weights[c] if c in present else 0.0 for c in CHANNELS}, f.rrf_k)


def _key(f: Fusion, present: set[str]) -> tuple[Any, ...]:
    """Identity of what a fusion returns: weights up to scale over present channels; rrf_k for rrf only."""
    w = [f.weights[c] if c in present else 0.0 for c in CHANNELS]
    top = max(w)
    norm = tuple(round(x / top, 12) for x in w) if top > 0 else ()
    return f.method, norm, f.rrf_k if f.method == "rrf" else None


class _Batch:
    """Every question's candidates as padded (question, candidate) arrays, columns in chunk-id order, so
    one grid point is scored for all questions at once (same float operations as `fused_scores`)."""

    def __init__(self, qs: Sequence[QuestionCandidates]) -> None:
        nq, n = len(qs), max([1, *(len(q.candidates) for q in qs)])
        nu = max([1, *(len(q.relevant) for q in qs)])
        self.present = np.zeros((len(CHANNELS), nq, n), bool)
        self.rank = np.ones((len(CHANNELS), nq, n))
        self.norm = np.zeros((len(CHANNELS), nq, n))
        self.rel = np.zeros((nq, n), bool)
        self.unit = np.zeros((nq, n, nu), bool)
        self.n_units = np.array([len(q.relevant) for q in qs], float)
        self.has_scores = True
        self.scale = np.array([[q.scale.get(ch, 1.0) for q in qs] for ch in CHANNELS], float).reshape(
            len(CHANNELS), nq, 1)
        for qi, q in enumerate(qs):
            cands = sorted(q.candidates, key=lambda c: c.chunk_id)
            if len({c.chunk_id for c in cands}) != len(cands):
                raise ValueError(f"question {q.question_id}: duplicate chunk ids among the candidates")
            for ci, ch in enumerate(CHANNELS):
                try:
                    norm = minmax(cands, ch)
                except ValueError:
                    self.has_scores, norm = False, {}
                for j, c in enumerate(cands):
                    if ch in c.ranks:
                        self.present[ci, qi, j], self.rank[ci, qi, j] = True, c.ranks[ch]
                        self.norm[ci, qi, j] = norm.get(c.chunk_id, 0.0)
            for j, c in enumerate(cands):
                for u, unit in enumerate(q.relevant):
                    self.unit[qi, j, u] = c.chunk_id in unit
            self.rel[qi] = self.unit[qi].any(axis=1)

    def scores(self, f: Fusion, scaled: bool = True) -> np.ndarray:
        """(questions, 2): recall@10 and mrr@10 of fuse(candidates, f, 10) for each question (scaled=False:
        without the per-question channel multipliers, as a single-channel search mode runs)."""
        if f.method == "score" and not self.has_scores:
            raise ValueError("method 'score' needs every candidate's score in each channel that found it")
        total = np.zeros(self.rel.shape)
        valid = np.zeros(self.rel.shape, bool)
        for ci, ch in enumerate(CHANNELS):
            if f.weights[ch] <= 0:
                continue
            w = f.weights[ch] * (self.scale[ci] if scaled else np.ones_like(self.scale[ci]))  # (questions, 1)
            p = self.present[ci] & (w > 0)
            valid |= p
            if f.method == "rrf":
                total = total + np.where(p, w / (f.rrf_k + self.rank[ci]), 0.0)
            else:
                total = total + w * self.norm[ci]
        order = np.argsort(-np.where(valid, total, -np.inf), axis=1, kind="stable")[:, :10]
        top_valid = np.take_along_axis(valid, order, axis=1)
        top_rel = np.take_along_axis(self.rel, order, axis=1) & top_valid
        mrr = np.where(top_rel.any(axis=1), 1.0 / (top_rel.argmax(axis=1) + 1), 0.0)
        in_top = np.zeros(self.rel.shape, bool)
        np.put_along_axis(in_top, order, top_valid, axis=1)
        recalled = (in_top[:, :, None] & self.unit).any(axis=1).sum(axis=1)
        recall = np.divide(recalled, self.n_units, out=np.zeros(len(recalled)), where=self.n_units > 0)
        return np.stack([recall, mrr], axis=1)


def _folds(ids: Sequence[str], folds: int, seed: int) -> np.ndarray:
    """Fold of each question: a seeded shuffle of the sorted ids dealt round-robin (input order is moot)."""
    by_id = sorted(range(len(ids)), key=lambda i: ids[i])
    out = np.empty(len(ids), int)
    for pos, j in enumerate(np.random.default_rng(seed).permutation(len(ids))):
        out[by_id[j]] = pos % folds
    return out


def _exact(q: QuestionCandidates, f: Fusion, scaled: bool = True) -> dict[str, float]:
    s = question_scores(fuse(q.candidates, f, 10, q.scale if scaled else None), q.relevant)
    return {"recall@10": s["recall@10"], "mrr@10": s["mrr@10"], "objective": (s["recall@10"] + s["mrr@10"]) / 2}


def score(questions: Sequence[QuestionCandidates], f: Fusion, *, scaled: bool = True) -> dict[str, float]:
    """Recall@10, MRR@10 and the objective of `f` over the questions (scaled=False: without the per-query
    channel multipliers, as a single-channel search mode runs)."""
    return aggregate([_exact(q, f, scaled) for q in questions])


def tune(questions: Sequence[QuestionCandidates], *, default: Fusion, channels: Sequence[str] = CHANNELS,
         folds: int = 5, seed: int = 0, grid: Grid | Sequence[Fusion] | None = None,
         never_below: bool = True) -> TuneResult:
    """Fit the fusion by `folds`-fold cross-validation on the mean over questions of (recall@10 + mrr@10)/2.

    never_below: only points whose Recall@10 and MRR@10 reach the best single channel's on every group of
    the training questions (a group: the question id's prefix before ':', i.e. its gold set) are eligible;
    when none is, the point whose worst shortfall is smallest wins. Hybrid then never loses to a channel on
    the gold sets it was fitted on, whichever channel is the strong one there.

    Searched: `channels` that some candidate has (grid points give the others weight 0); `grid` is a Grid
    (default Grid()) or explicit fusions; the default (with channels no candidate has zeroed) is always a
    point, so it is kept unless a searched point does better.
    Each fold picks the best point on its training folds; `best` is the pick on all questions. Ties (within
    1e-9) go to the point that fuses like the default, then to fewer running channels, then to a lower sum
    of weights relative to the largest, then to the default's method, then to rrf_k nearest the default's,
    then to grid order. Reported numbers are recomputed with evaluation.metrics.question_scores.
    `best` is the default after all (kept_default) when the held-out gain of the folds' choices over it is
    within one standard error, unless the default falls below a channel (never_below).
    """
    qs = sorted(questions, key=lambda q: q.question_id)  # input order changes nothing, not even rounding
    ids = [q.question_id for q in qs]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate question ids")
    if not set(channels) <= set(CHANNELS):
        raise ValueError(f"unknown channel(s) {sorted(set(channels) - set(CHANNELS))}: use {CHANNELS}")
    if folds < 2 or len(qs) < folds:
        raise ValueError(f"{folds}-fold cross-validation needs folds >= 2 and at least {folds} questions")
    present = {ch for q in qs for c in q.candidates for ch in c.ranks}
    searched = [c for c in CHANNELS if c in channels and c in present]
    if not searched:
        raise ValueError(f"no candidate has a rank in any of {list(channels)}")
    batch = _Batch(qs)
    if grid is None or isinstance(grid, Grid):
        g = grid or Grid()
        if not batch.has_scores:
            g = Grid(g.weights, g.rrf_k, tuple(m for m in g.methods if m != "score"))
        grid = g.fusions(searched, default)
    base = _effective(default, present)
    points: dict[tuple[Any, ...], Fusion] = {}
    for f in [base, *(_effective(f, present) for f in grid)]:
        points.setdefault(_key(f, present), f)
    singles = [_effective(Fusion(weights={c: float(c == ch) for c in CHANNELS}), present) for ch in searched]
    for f in singles:
        points.setdefault(_key(f, present), f)
    fusions = list(points.values())
    rm = np.stack([batch.scores(f) for f in fusions])  # (points, questions, [recall@10, mrr@10])
    obj = rm.mean(axis=2)  # (points, questions)
    # the bar: each channel searched alone (as --mode dense/lexical runs it: no per-query scaling)
    bar = np.stack([batch.scores(f, scaled=False) for f in singles])  # (channels, questions, 2)
    group = np.array([q.question_id.split(":", 1)[0] if ":" in q.question_id else "" for q in qs])
    base_key = _key(base, present)

    def preference(i: int) -> tuple[Any, ...]:
        f = fusions[i]
        w = [f.weights[c] for c in CHANNELS]
        rel_sum = sum(w) / max(w) if max(w) > 0 else 0.0
        return (_key(f, present) != base_key, len(f.active()), round(rel_sum, 12), f.method != base.method,
                abs(f.rrf_k - base.rrf_k) if f.method == "rrf" else 0.0, i)

    def by_group(mask: np.ndarray) -> Iterator[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
        """Per group of the masked questions: every point's mean (R@10, MRR@10), shape (points, 2), the best
        channel's (2,) and which channel that is (2,)."""
        for g in np.unique(group[mask]):
            m = mask & (group == g)
            chan = bar[:, m, :].mean(axis=1)  # (channels, 2)
            yield str(g), rm[:, m, :].mean(axis=1), chan.max(axis=0), chan.argmax(axis=0)

    def shortfall(mask: np.ndarray) -> np.ndarray:
        """Per point: the largest amount by which it falls below the best channel (R@10 or MRR@10) on any
        group of the masked questions (<= 0: never below)."""
        worst = np.full(len(fusions), -np.inf)
        for _, per, best, _ in by_group(mask):
            worst = np.maximum(worst, (best[None, :] - per).max(axis=1))
        return worst

    def below(i: int) -> str:
        """Where point i falls furthest below the best channel on a group of all questions ("" if nowhere)."""
        worst, where = _TIE, ""
        for g, per, best, which in by_group(np.ones(len(qs), bool)):
            for k, metric in enumerate(("recall@10", "mrr@10")):
                if best[k] - per[i, k] > worst:
                    worst = float(best[k] - per[i, k])
                    where = f"{g or 'all'}: {metric} {per[i, k]:.4f} < {searched[which[k]]} {best[k]:.4f}"
        return where

    def pick(mask: np.ndarray) -> int:
        means = obj[:, mask].mean(axis=1)
        eligible = np.ones(len(fusions), bool)
        if never_below:
            short = shortfall(mask)
            eligible = short <= _TIE
            if not eligible.any():
                eligible = short <= short.min() + _TIE
        top = means[eligible].max()
        return min((int(i) for i in np.flatnonzero(eligible & (means >= top - _TIE))), key=preference)

    exact: dict[int, list[dict[str, float]]] = {}

    def mean(i: int, mask: np.ndarray) -> dict[str, float]:
        rows = exact.setdefault(i, [_exact(q, fusions[i]) for q in qs])
        return aggregate([r for r, m in zip(rows, mask, strict=True) if m])

    fold_of = _folds(ids, folds, seed)
    per_fold: list[dict[str, Any]] = []
    gain = np.zeros(len(qs))
    for fold in range(folds):
        test = fold_of == fold
        i = pick(~test)
        gain[test] = obj[i, test] - obj[0, test]
        per_fold.append({"fold": fold, "train": int((~test).sum()), "test": int(test.sum()),
                         "fusion": fusions[i].as_dict(), "held_in": mean(i, ~test), "held_out": mean(i, test),
                         "default_held_out": mean(0, test)})
    every = np.ones(len(qs), bool)
    best = pick(every)
    # One-standard-error rule (as in CART's pruning): the default, the simpler model, stays unless tuning
    # beats it on held-out questions by more than the noise of that comparison, so a fit that only wins in
    # sample is not stored. Not where the default falls below a gold set's best channel: the rule above wins.
    mean_gain = float(gain.mean())
    se = float(gain.std(ddof=1) / np.sqrt(len(qs))) if len(qs) > 1 else 0.0
    default_below = below(0) if never_below else ""
    # bool(): numpy's comparisons give np.bool_, which the JSON report and the stored record cannot hold
    kept = bool(best != 0 and mean_gain <= se + _TIE and not default_below)
    if kept:
        best = 0
    return TuneResult(
        best=fusions[best], default=default, folds=folds, objective=OBJECTIVE,
        held_in={m: float(np.mean([p["held_in"][m] for p in per_fold])) for m in REPORTED},
        held_out={m: float(np.mean([p["held_out"][m] for p in per_fold])) for m in REPORTED},
        default_scores=mean(0, every), per_fold=per_fold, grid_size=len(fusions),
        changed=_key(fusions[best], present) != base_key, held_out_gain=mean_gain, gain_se=se, kept_default=kept,
        default_below=default_below)


def verdict(result: TuneResult) -> str:
    """Why the fit was kept or adopted where its held-out gain alone would not decide it ("" otherwise)."""
    if result.kept_default:
        return "within one standard error, the default is kept"
    if result.default_below and result.changed:
        return f"adopted whatever the gain, as the default falls below a channel ({result.default_below})"
    return ""


def describe(result: TuneResult) -> str:
    """A short plain-text report: default vs held-in vs held-out per metric, and the chosen fusion."""
    lines = [f"fusion tuning: {result.folds}-fold cross-validation over {result.grid_size} grid points, "
             f"objective {result.objective}",
             f"{'metric':<12}{'default':>10}{'held-in':>10}{'held-out':>10}"]
    for m in REPORTED:
        lines.append(f"{m:<12}{result.default_scores[m]:>10.4f}{result.held_in[m]:>10.4f}"
                     f"{result.held_out[m]:>10.4f}")
    chosen = {repr(p["fusion"]) for p in result.per_fold}
    lines += [f"default:  {result.default.label()}",
              f"chosen:   {result.best.label()}" + ("" if result.changed else "  (same as default)"),
              f"held-out gain over the default: {result.held_out_gain:+.4f} (standard error {result.gain_se:.4f})"
              + (f": {v}" if (v := verdict(result)) else ""),
              f"folds agreed on {'one fusion' if len(chosen) == 1 else f'{len(chosen)} different fusions'}"]
    return "\n".join(lines)
