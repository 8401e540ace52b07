"""The evaluate flow: `corpusync eval` as a Prefect deployment (prefect.yaml: corpusync-evaluate/evaluate).

Scores a generation (the published one by default) on gold sets, stores the evaluation, writes the reports
and attaches them as an artifact; with `gate` it compares with the baseline and fails the run on regression.
Parameters and settings as in flows/refresh.py.
"""

from __future__ import annotations

from typing import Any

from prefect.artifacts import create_markdown_artifact

from corpusync.core.errors import EvalGateFailed
from corpusync.store.db import open_database
from flows.base import flow_settings, settings_flow
from schemas.params import Floors, Generation, GoldSets, Questions, Tolerances


@settings_flow(name="corpusync-evaluate", log_prints=False)
def evaluate(
    goldsets: GoldSets = None,
    generation: Generation = None,
    gate: bool = False,
    limit: Questions = None,
    gate_tolerances: Tolerances = None,
    gate_floors: Floors = None,
) -> list[dict[str, Any]]:
    """Evaluate retrieval on gold sets (Recall@k, MRR, nDCG, latency per mode; RAGAS), one report per gold set.

    Args:
        goldsets: Gold sets (paths or names); unset: CORPUSYNC_GOLDSETS.
        generation: The generation to evaluate; unset: the published one.
        gate: Compare with the baseline's evaluation and fail the run on a regression.
        limit: At most this many questions per gold set (an ad-hoc evaluation, never a baseline).
        gate_tolerances: Tolerated drop per metric; unset: CORPUSYNC_GATE_TOLERANCES.
        gate_floors: Absolute minimum per metric; unset: CORPUSYNC_GATE_FLOORS.
    """
    from corpusync.app.evaluating import evaluate_and_gate
    from query.search import Searcher

    settings = flow_settings(gate_tolerances=gate_tolerances, gate_floors=gate_floors)
    with open_database(settings) as conn:
        searcher = Searcher(settings, conn)
        gen = generation if generation is not None else searcher.published_generation()
        outcome = evaluate_and_gate(settings, conn, searcher, gen, specs=goldsets or settings.goldsets,
                                    gated=gate, max_questions=limit)
    create_markdown_artifact(outcome.report, key="corpusync-evaluation", description="Gold-set evaluation")
    if gate and not outcome.passed:
        raise EvalGateFailed("evaluation gate failed: " + "; ".join(outcome.failures()))
    return outcome.summary()
