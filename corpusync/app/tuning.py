"""Tune the hybrid fusion with the database: collect each gold set's candidates from the generation, fit
(tasks/tune.py) and store the chosen fusion with the index (corpusync.store.fusions). `corpusync tune` calls
tune_fusion; a refresh's first gated evaluation of an index calls auto_tune."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import psycopg

from corpusync.app.evaluating import gold_chunks
from corpusync.store import fusions
from evaluation.fusion_tuning import verdict
from schemas.eval import GoldSet
from schemas.settings import Settings
from tasks import tune as tune_stage
from tasks.tune import TuneOutcome

if TYPE_CHECKING:
    from evaluation.fusion_tuning import QuestionCandidates
    from query.search import Searcher

log = logging.getLogger("corpusync.tune")


def collect(settings: Settings, conn: psycopg.Connection, searcher: Searcher, goldset: GoldSet,
            generation: int) -> list[QuestionCandidates]:
    """Every question of the gold set with its candidates from all channels and its relevance units."""
    return tune_stage.question_candidates(settings, searcher, goldset, generation,
                                          gold_chunks(conn, goldset, generation))


def tune_fusion(settings: Settings, conn: psycopg.Connection, searcher: Searcher, goldsets: Sequence[GoldSet],
                generation: int, *, folds: int = 5, seed: int = 0, store: bool = True) -> TuneOutcome:
    """Fit on the questions of all `goldsets` together; store the chosen RRF fusion for the generation's model
    (unless store=False). The normalised score combination is fitted too and reported next to it."""
    model_id = searcher.index_model_id(generation)
    by_set = {gs.name: collect(settings, conn, searcher, gs, generation) for gs in goldsets}
    outcome = tune_stage.fit(searcher, by_set, goldsets, generation, model_id, folds=folds, seed=seed)
    if store:
        best = outcome.result.best
        outcome.stored_id = fusions.insert_fusion(
            conn, model_id=model_id, method=best.method, weights=best.weights, rrf_k=best.rrf_k,
            goldset=",".join(gs.name for gs in goldsets), goldset_sha256=",".join(gs.sha256 for gs in goldsets),
            generation=generation, folds=folds, report=outcome.as_dict())
    return outcome


def auto_tune(settings: Settings, conn: psycopg.Connection, searcher: Searcher, generation: int,
              folds: int = 5) -> TuneOutcome | None:
    """Before the first gated evaluation of an index: when no fusion was tuned for its model yet, tune one
    on the configured gold sets (settings.fusion_auto_tune), so hybrid starts out never below its best
    channel on them. Returns None when a fusion exists or there are too few questions to cross-validate."""
    if not settings.fusion_auto_tune or not settings.goldsets:
        return None
    if fusions.latest_fusion(conn, searcher.index_model_id(generation), generation) is not None:
        return None
    sets = tune_stage.auto_tune_sets(settings, folds)
    if sets is None:
        return None
    outcome = tune_fusion(settings, conn, searcher, sets, generation, folds=folds)
    searcher.forget_fusion()
    r = outcome.result
    log.info("fusion tuned on %s: %s (held-out objective %.4f, default %.4f; held-out gain %+.4f, standard "
             "error %.4f%s)", ", ".join(outcome.goldsets), r.best.label(), r.held_out["objective"],
             r.default_scores["objective"], r.held_out_gain, r.gain_se,
             f": {v}" if (v := verdict(r)) else "")
    return outcome
