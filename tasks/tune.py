"""tune: fit the hybrid fusion (channel weights, RRF k) on gold sets by k-fold cross-validation and store it
with the index, so queries, the SQL functions and the gate use it.

Each question is asked once with every channel on (weights 1, k = 3 x pool): every candidate comes back with
its rank and score in each channel, so any fusion of them is exactly what search_hybrid returns for it
(evaluation/fusion.py mirrors the SQL). The dense weight is scaled per question by how much of it the model
can read, as query.search does at query time. Questions of several gold sets are tuned together (one fusion
per index), and every set is reported on its own, so a gain on one set that costs another shows.

This is the pure half; reading the gold chunks and storing the fusion is corpusync.app.tuning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from evaluation import relevance as rel
from evaluation.fusion import CHANNELS, Fusion, candidates_from_hits
from evaluation.fusion_tuning import Grid, QuestionCandidates, TuneResult, score, tune
from schemas.eval import GoldSet
from schemas.settings import Settings
from tasks.evaluate import Searcher

if TYPE_CHECKING:
    from tasks.evaluate import GoldChunks

log = logging.getLogger("corpusync.tune")


@dataclass
class TuneOutcome:
    result: TuneResult
    score_method: TuneResult | None          # the normalised score combination, fitted the same way
    per_set: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # set -> default/best
    stored_id: int | None = None
    goldsets: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        r = self.result
        out = {"best": r.best.as_dict(), "default": r.default.as_dict(), "changed": r.changed, "folds": r.folds,
               "objective": r.objective, "default_scores": r.default_scores, "held_in": r.held_in,
               "held_out": r.held_out, "held_out_gain": r.held_out_gain, "gain_se": r.gain_se,
               "kept_default": r.kept_default, "default_below": r.default_below, "per_goldset": self.per_set,
               "grid_size": r.grid_size, "goldsets": self.goldsets, "stored_id": self.stored_id}
        if self.score_method is not None:
            s = self.score_method
            out["score_method"] = {"best": s.best.as_dict(), "held_in": s.held_in, "held_out": s.held_out}
        return out


def question_candidates(settings: Settings, searcher: Searcher, goldset: GoldSet, generation: int,
                        gold: GoldChunks) -> list[QuestionCandidates]:
    """Every question of the gold set with its candidates from all channels and its relevance units. `gold`:
    the generation's documents and chunks for the gold references (corpusync.app.evaluating.gold_chunks)."""
    from tasks.evaluate import K_RETRIEVE, embed_questions

    docs, by_path = gold.docs, gold.chunks
    questions = goldset.questions
    vectors = embed_questions(searcher.embedder, [q.question for q in questions],  # as the evaluation does
                              settings.embed_batch_tokens)
    sparse = searcher.embedder.identity.sparse_trained
    all_on = Fusion(weights={"dense": 1.0, "lexical": 1.0, "sparse": 1.0 if sparse else 0.0})
    pool = max(settings.candidate_pool, K_RETRIEVE)  # the pool the evaluation's queries run with
    out = []
    for q, vec in zip(questions, vectors, strict=True):
        hits = searcher.search(q.question, k=3 * pool, mode="hybrid", generation=generation, query_vector=vec,
                               fusion=all_on, pool=pool)
        scale = {"dense": searcher.dense_coverage(q.question)} if settings.dense_coverage_weighting else {}
        units = rel.relevant_chunks(q, docs, by_path).units
        out.append(QuestionCandidates(f"{goldset.name}:{q.id}", candidates_from_hits(hits), units, scale))
    return out


def fit(searcher: Searcher, by_set: dict[str, list[QuestionCandidates]], goldsets: Sequence[GoldSet],
        generation: int, model_id: int, *, folds: int = 5, seed: int = 0) -> TuneOutcome:
    """Fit on the questions of all `goldsets` together (`by_set`: each set's question_candidates) for the
    index's model `model_id`: the RRF fusion, and the normalised score combination reported next to it; each
    set scored on its own."""
    questions = [q for qs in by_set.values() for q in qs]
    channels = [c for c in CHANNELS if c != "sparse" or searcher.embedder.identity.sparse_trained]
    default = searcher.fusion(model_id, generation)
    rrf = tune(questions, default=default, channels=channels, folds=folds, seed=seed, grid=Grid(methods=("rrf",)))
    by_score = tune(questions, default=default, channels=channels, folds=folds, seed=seed,
                    grid=Grid(methods=("score",)))
    outcome = TuneOutcome(rrf, by_score, goldsets=[gs.name for gs in goldsets])
    for name, qs in by_set.items():
        outcome.per_set[name] = {"default": score(qs, rrf.default), "best": score(qs, rrf.best),
                                 "score_method": score(qs, by_score.best)} | {
            c: score(qs, Fusion(weights={x: float(x == c) for x in CHANNELS}), scaled=False) for c in channels}
    return outcome


def describe(outcome: TuneOutcome) -> str:
    """Plain text for the CLI: the cross-validated table, the score-method comparison, each gold set."""
    from evaluation.fusion_tuning import describe as describe_result

    lines = [describe_result(outcome.result)]
    if outcome.score_method is not None:
        s = outcome.score_method
        lines.append(f"normalised score combination: held-out objective {s.held_out['objective']:.4f} "
                     f"(RRF {outcome.result.held_out['objective']:.4f}) with {s.best.label()}")
    cols = [c for c in CHANNELS if any(c in v for v in outcome.per_set.values())] + ["default", "best"]
    names = {"default": "hybrid default", "best": "hybrid tuned"}
    lines.append(f"{'gold set':<18}" + "".join(f"{names.get(c, c):>22}" for c in cols) + "   (R@10 / MRR@10)")
    for name, v in outcome.per_set.items():
        lines.append(f"{name[:17]:<18}" + "".join(
            f"{v[c]['recall@10']:>14.4f} / {v[c]['mrr@10']:.3f}" for c in cols))
    lines.append(f"stored as fusion {outcome.stored_id} for this index's model (used by query, SQL and the gate)"
                 if outcome.stored_id else "not stored (--dry-run)")
    return "\n".join(lines)


def auto_tune_sets(settings: Settings, folds: int) -> list[GoldSet] | None:
    """The configured gold sets to tune on before the first gated evaluation (settings.fusion_auto_tune),
    None when there are too few questions to cross-validate."""
    from evaluation.goldsets import load_goldset, sample_questions

    sets = [sample_questions(load_goldset(s, settings.goldset_dirs), settings.eval_max_questions)
            for s in settings.goldsets]
    if sum(len(gs.questions) for gs in sets) < 4 * folds:
        log.info("fusion not tuned: %d gold questions are too few for %d-fold cross-validation",
                 sum(len(gs.questions) for gs in sets), folds)
        return None
    return sets
