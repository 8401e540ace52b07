"""Evaluate a generation with the database: read its chunks of the gold documents, score it (tasks/evaluate.py),
gate it against a baseline, store the evaluation and write the reports. The refresh's evaluate step
(corpusync.app.pipeline), `corpusync eval` and the evaluate flow call `evaluate_and_gate`.

Baseline: a stored evaluation of the same question set (tasks.evaluate.choose_baseline); when the baseline
generation has none, it is evaluated now, and the report and summary say so and why. Reports are written
private (folder 0700, files 0600): they quote questions and chunk text. Its SQL is corpusync.store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from corpusync.core.errors import ModelMismatch
from corpusync.store import evaluations, generations
from schemas.eval import Evaluation, GateOutcome, GoldSet
from schemas.settings import Settings
from tasks import evaluate as ev_stage
from tasks.evaluate import REPORT_TITLE, Baseline, GoldChunks

if TYPE_CHECKING:
    from query.search import Searcher

__all__ = ["GateOutcome", "evaluate_and_gate", "evaluate_generation", "find_baseline", "gold_chunks"]


def gold_chunks(conn: psycopg.Connection, goldset: GoldSet, generation: int) -> GoldChunks:
    """The generation's documents for each gold reference (followed through renames where the reference names
    none), and their chunks by path."""
    docs, followed = ev_stage.gold_documents(goldset, evaluations.generation_paths(conn, generation),
                                             evaluations.lineage_renames(conn, generation))
    return GoldChunks(docs, evaluations.gold_chunks(conn, generation, ev_stage.wanted_paths(docs)), followed)


def evaluate_generation(settings: Settings, conn: psycopg.Connection, searcher: Searcher, goldset: GoldSet,
                        generation: int, model_id: int | None = None) -> Evaluation:
    """Run every question of `goldset` against `generation` in each configured mode and score it."""
    return ev_stage.score_generation(settings, searcher, goldset, generation, gold_chunks(conn, goldset, generation),
                                     model_id=model_id)


def find_baseline(conn: psycopg.Connection, goldset: GoldSet, generation: int, mode: str,
                  needed: Sequence[str] = ()) -> tuple[Baseline | None, str]:
    """The newest stored evaluation of `generation` that can be the baseline of `goldset` (see
    evaluation.gate.baseline_mismatch), or None and why the newest stored one cannot ('' when none is)."""
    candidates = evaluations.goldset_evaluations(conn, goldset.key, goldset.name, generation, mode)
    return ev_stage.choose_baseline(candidates, goldset, lambda eid: evaluations.question_rows(conn, eid, mode),
                                    needed)


def resolve_baseline(settings: Settings, conn: psycopg.Connection, searcher: Searcher, goldset: GoldSet,
                     generation: int, *, baseline_generation: int | None, run_id: int | None,
                     config: dict[str, Any], question_limit: int | None) -> tuple[Baseline | None, str]:
    """The baseline for `generation` and how it was chosen. Its generation: `baseline_generation` (the live
    one, for a refresh) or the newest earlier generation that was published. A stored evaluation of the same
    question set is used; otherwise that generation is evaluated now and stored (unless its rows are pruned,
    or it was built with another embedding model: then there is none, and the note says why)."""
    mode = settings.gate_mode
    if baseline_generation:
        target, status, searchable = baseline_generation, "published", True
    else:
        row = generations.previous_published(conn, generation)
        if row is None:
            return None, "none: no earlier generation was published"
        target, status, searchable = int(row["generation"]), str(row["status"]), bool(row["searchable"])
    stored, why = find_baseline(conn, goldset, target, mode, ev_stage.needed_metrics(settings, goldset))
    if stored is not None:
        return stored, ""
    why = why or f"generation {target} has no stored evaluation of this gold set"
    if not searchable:
        return None, f"none: {why}, and generation {target} can no longer be searched ({status})"
    try:
        base = evaluate_generation(settings, conn, searcher, goldset, target, model_id=searcher.index_model_id(target))
    except ModelMismatch:  # a deliberate model switch: the old index cannot be queried with the new model
        return None, f"none: {why}, and generation {target} was built with another embedding model"
    base.question_limit = question_limit
    evaluations.store_evaluation(conn, base, run_id, config)
    return ev_stage.computed_baseline(base, target, mode), f"evaluated now: {why}"


def evaluate_and_gate(
    settings: Settings,
    conn: psycopg.Connection,
    searcher: Searcher,
    generation: int,
    *,
    specs: Sequence[str],
    run_id: int | None = None,
    gated: bool = True,
    baseline_generation: int | None = None,
    override: bool = False,
    max_questions: int | None = None,
) -> GateOutcome:
    """Evaluate `generation` on each gold set, gate it, store everything and write the report.

    Thresholds and gold sets are checked, and every gold set loaded, before anything is evaluated
    (tasks.evaluate.load_goldsets). Baseline: see `resolve_baseline` (for a refresh, `baseline_generation` is
    the published generation). A `max_questions` that leaves out questions the gate evaluates makes an ad-hoc
    evaluation, recorded as such and never a baseline.
    """
    sets = ev_stage.load_goldsets(settings, specs, max_questions)
    config = ev_stage.gate_config(settings)
    mode = settings.gate_mode
    evaluated: list[Evaluation] = []
    parts: list[str] = []
    for gs, limit in sets:
        baseline: Baseline | None = None
        note = ""
        if gated:
            baseline, note = resolve_baseline(settings, conn, searcher, gs, generation,
                                              baseline_generation=baseline_generation, run_id=run_id,
                                              config=config, question_limit=limit)
        ev = evaluate_generation(settings, conn, searcher, gs, generation,
                                 model_id=searcher.index_model_id(generation))
        ev.question_limit = limit
        if gated:
            ev_stage.gate(settings, ev, baseline, note)
            ev.overridden = bool(override and ev.passed is False)
        evaluations.store_evaluation(conn, ev, run_id, config)
        evaluated.append(ev)
        parts.append(_report_part(conn, ev, gs, mode, baseline.rows if baseline else {}))
    report = REPORT_TITLE + "\n".join(parts)
    _write_reports(settings, conn, generation, parts, evaluated)
    return GateOutcome(evaluated, report, parts)


def _report_part(conn: psycopg.Connection, ev: Evaluation, gs: GoldSet, mode: str, base_rows: dict[str, Any]) -> str:
    from evaluation.report import markdown

    return markdown(ev, gs, mode, baseline_questions=base_rows,
                    lookup=lambda ids: evaluations.chunk_sources(conn, ids))


def _write_reports(settings: Settings, conn: psycopg.Connection, generation: int, parts: Sequence[str],
                   evaluated: Sequence[Evaluation]) -> None:
    """One report per gold set (tasks.evaluate.report_filename), its path stored with its evaluation, and
    reports/history-<gold set key>.svg per gold set; the folder 0700 and every file 0600."""
    from evaluation.report import history_svg, private_dir, write_private

    try:
        out = private_dir(settings.reports_dir, tighten=("eval-*.md", "history-*.svg"))
        for ev, part in zip(evaluated, parts, strict=True):
            path = out / ev_stage.report_filename(generation, ev)
            write_private(path, REPORT_TITLE + part)
            evaluations.set_report_path(conn, ev, str(path))
            key = ev.goldset_key or ev.goldset
            points = evaluations.goldset_history(conn, key, ev.goldset, settings.gate_mode)
            svg = history_svg(points, f"{key} ({settings.gate_mode}): history")
            write_private(out / ev_stage.history_filename(key), svg)
    except OSError:
        return  # reports are a convenience; the results are in the database either way
