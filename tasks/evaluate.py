"""evaluate: score a generation against gold sets, store the result, and gate it against the baseline.

The metrics, relevance rules and the gate itself are pure functions in evaluation/; this module reads the
generation from PostgreSQL, runs the queries, and stores evaluations (aggregate + per question).

Modes: `eval_modes` (plus the gate's mode). With a reranker configured (`reranker_path`) and `eval_modes` left
at its default, `hybrid+rerank` (hybrid search, its fused candidates re-ordered by the cross-encoder) is
evaluated too; without one it is skipped with a note, and asking for it explicitly is a ConfigError.
Per mode, the search latency of the questions (p50/p95 in ms, query embeddings computed beforehand in one
batch, after one untimed warm-up query) is stored beside the quality metrics and never gated.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from corpusync import db
from corpusync.errors import ConfigError
from evaluation import relevance as rel
from evaluation.gate import gate_checks
from evaluation.metrics import aggregate, first_relevant_rank, is_quality_metric, latency_summary, question_scores
from evaluation.ragas_eval import RagasSample, ragas_scores
from query.search import MODES, Searcher
from schemas.eval import Evaluation, GoldSet, QuestionResult
from schemas.settings import Settings

K_RETRIEVE = 20
RERANK_MODE = "hybrid+rerank"


@dataclass
class Baseline:
    id: int
    generation: int
    rows: dict[str, dict[str, Any]]  # question id -> {"scores": {...}, "retrieved": [chunk ids]}

    @property
    def per_question(self) -> dict[str, dict[str, float]]:
        return {qid: r["scores"] for qid, r in self.rows.items()}


def plan_modes(settings: Settings) -> tuple[list[str], list[str]]:
    """The modes to evaluate and notes on what was skipped. ConfigError on an unknown mode, or on
    hybrid+rerank asked for (eval_modes or gate_mode) with no reranker configured."""
    modes = list(dict.fromkeys(settings.eval_modes))
    if settings.gate_mode not in modes:
        modes.append(settings.gate_mode)
    known = (*MODES, RERANK_MODE)
    unknown = [m for m in modes if m not in known]
    if unknown:
        raise ConfigError(f"unknown evaluation mode(s) {', '.join(map(repr, unknown))} (CORPUSYNC_EVAL_MODES / "
                          f"CORPUSYNC_GATE_MODE): use {', '.join(known)}")
    notes: list[str] = []
    if settings.reranker_path is None:
        if RERANK_MODE in modes:
            raise ConfigError(f"evaluation mode {RERANK_MODE!r} needs a reranker: set CORPUSYNC_RERANKER_PATH to a "
                              "local bge-reranker directory, or leave the mode out of CORPUSYNC_EVAL_MODES / "
                              "CORPUSYNC_GATE_MODE")
        notes.append(f"{RERANK_MODE}: skipped (no reranker configured; set CORPUSYNC_RERANKER_PATH to evaluate it)")
    elif RERANK_MODE not in modes and "eval_modes" not in settings.model_fields_set:
        modes.append(RERANK_MODE)
    return modes, notes


def modes_for(settings: Settings) -> list[str]:
    return plan_modes(settings)[0]


def _search(searcher: Searcher, text: str, mode: str, generation: int, vector: Any) -> list[Any]:
    if mode == RERANK_MODE:
        return searcher.search(text, k=K_RETRIEVE, mode="hybrid", generation=generation, query_vector=vector,
                               rerank=True)
    return searcher.search(text, k=K_RETRIEVE, mode=mode, generation=generation,  # type: ignore[arg-type]
                           query_vector=vector)


def _chunks_of_gold(conn: psycopg.Connection, goldset: GoldSet, generation: int,
                    ) -> tuple[dict[str, list[str]], dict[str, list[rel.ChunkRef]]]:
    paths = [r["path"] for r in db.fetch_all(conn, "generation_documents", {"generation": generation})]
    refs = {ref for q in goldset.questions for ref in q.gold_documents}
    docs = rel.resolve_documents(refs, paths)
    wanted = sorted({p for ps in docs.values() for p in ps})
    by_path: dict[str, list[rel.ChunkRef]] = {}
    for r in db.fetch_all(conn, "generation_chunks_of", {"generation": generation, "paths": wanted}):
        by_path.setdefault(r["path"], []).append(rel.ChunkRef(
            int(r["chunk_id"]), r["path"], r["text"], r.get("page_start"), r.get("page_end")))
    return docs, by_path


def evaluate_generation(settings: Settings, conn: psycopg.Connection, searcher: Searcher, goldset: GoldSet,
                        generation: int, model_id: int | None = None) -> Evaluation:
    """Run every question of `goldset` against `generation` in each configured mode and score it."""
    modes, notes = plan_modes(settings)
    docs, by_path = _chunks_of_gold(conn, goldset, generation)
    questions = goldset.questions
    needs_dense = any(m != "lexical" for m in modes)
    vectors: Any = searcher.embedder.embed([q.question for q in questions]).dense if needs_dense else None
    results: list[QuestionResult] = []
    metrics: dict[str, dict[str, float]] = {}
    samples: list[RagasSample] = []
    fallback = missing = 0
    relevance = [rel.relevant_chunks(q, docs, by_path) for q in questions]
    for r in relevance:
        fallback += r.fallback
        missing += not r.relevant
    for mode in modes:
        per_q = []
        seconds = []
        if questions:  # warm-up, untimed: first-query costs (a reranker loading, caches) are not latency
            _search(searcher, questions[0].question, mode, generation, None if vectors is None else vectors[0])
        for i, (q, r) in enumerate(zip(questions, relevance, strict=True)):
            t0 = time.perf_counter()
            hits = _search(searcher, q.question, mode, generation, None if vectors is None else vectors[i])
            seconds.append(time.perf_counter() - t0)
            ranked = [h.chunk_id for h in hits]
            scores = question_scores(ranked, r.units, r.alternatives)
            per_q.append(scores)
            results.append(QuestionResult(
                question_id=q.id, mode=mode, retrieved=ranked, relevant_count=len(r.relevant),
                first_rank=first_relevant_rank(ranked, r.relevant), scores=scores,
                retrieved_sources=[h.source for h in hits], retrieved_texts=[h.text for h in hits],
            ))
            if mode == settings.gate_mode:
                ref_texts = q.evidence or list(dict.fromkeys(
                    c.text for g in q.gold_documents for path in docs.get(g, []) for c in by_path.get(path, ())
                    if c.chunk_id in r.relevant))[:5]
                samples.append(RagasSample(
                    question=q.question, retrieved_ids=[str(c) for c in ranked[:5]],
                    retrieved_texts=[h.text for h in hits[:5]], reference_ids=[str(c) for c in sorted(r.relevant)],
                    reference_texts=ref_texts, answers=q.answers,
                ))
        metrics[mode] = aggregate(per_q) | latency_summary(seconds)
    ragas = ragas_scores(samples, settings)
    return Evaluation(
        goldset=goldset.name, goldset_sha256=goldset.sha256, generation=generation, model_id=model_id,
        n_questions=len(questions), modes=modes, metrics=metrics, ragas=ragas, questions=results,
        fallback_questions=fallback, missing_questions=missing, notes=notes,
    )


def per_question(ev: Evaluation, mode: str) -> dict[str, dict[str, float]]:
    return {q.question_id: q.scores for q in ev.questions if q.mode == mode}


def find_baseline(conn: psycopg.Connection, goldset: str, generation: int, mode: str, *,
                  earlier: bool = False) -> Baseline | None:
    """The stored evaluation of `generation` (or, with earlier=True, of the last published generation
    before it) for this gold set, with its per-question scores in `mode`."""
    row = db.fetch_one(conn, "find_previous_published_evaluation" if earlier else "find_evaluation",
                       {"goldset": goldset, "generation": generation, "mode": mode})
    if row is None:
        return None
    qs = db.fetch_all(conn, "evaluation_questions", {"evaluation_id": row["id"], "mode": mode})
    return Baseline(int(row["id"]), int(row["generation"]), {r["question_id"]: r for r in qs})


def gate(settings: Settings, ev: Evaluation, baseline: Baseline | None) -> None:
    """Fill ev.checks / ev.passed from the configured floors and tolerances."""
    mode = settings.gate_mode
    ev.checks = gate_checks(
        ev.goldset, mode, per_question(ev, mode), baseline.per_question if baseline else None,
        tolerances=settings.gate_tolerances, floors=settings.gate_floors,
        samples=settings.gate_bootstrap_samples, confidence=settings.gate_confidence,
    )
    ev.baseline_id = baseline.id if baseline else None
    ev.baseline_generation = baseline.generation if baseline else None
    ev.passed = all(c.passed for c in ev.checks)
    ignored = sorted({k for k in [*settings.gate_tolerances, *settings.gate_floors]
                      if not is_quality_metric(k.split(":")[-1])
                      and (":" not in k or k.split(":", 1)[0] == ev.goldset)})
    if ignored:
        ev.notes.append(f"gate: {', '.join(ignored)} ignored (latency is reported, not gated)")


def store_evaluation(conn: psycopg.Connection, ev: Evaluation, run_id: int | None, config: dict[str, Any]) -> int:
    """One transaction: the evaluation row and a COPY of its per-question rows."""
    gated = ev.passed is not None
    if ev.notes:
        config = config | {"notes": ev.notes}
    with conn.transaction():
        row = db.fetch_one(conn, "insert_evaluation", {
            "run_id": run_id, "generation": ev.generation, "model_id": ev.model_id, "goldset": ev.goldset,
            "goldset_sha256": ev.goldset_sha256, "n_questions": ev.n_questions, "modes": ev.modes,
            "metrics": db.as_json(ev.metrics), "ragas": db.as_json(ev.ragas), "config": db.as_json(config),
            "baseline_id": ev.baseline_id,
            "gate": db.as_json([c.model_dump() for c in ev.checks]) if gated else None,
            "passed": ev.passed, "overridden": ev.overridden,
        })
        assert row is not None
        ev.id = int(row["id"])
        with conn.cursor() as cur, cur.copy(db.q("copy_evaluation_questions")) as copy:
            for q in ev.questions:
                copy.write_row((ev.id, q.mode, q.question_id, json.dumps(q.scores), q.first_rank, q.retrieved,
                                q.relevant_count))
    return ev.id


def set_report_path(conn: psycopg.Connection, ev: Evaluation, path: str) -> None:
    ev.report_path = path
    db.execute(conn, "set_evaluation_report", {"id": ev.id, "report_path": path})


def chunk_sources(conn: psycopg.Connection, ids: Sequence[int]) -> dict[int, tuple[str, str]]:
    rows = db.fetch_all(conn, "chunk_sources", {"ids": list(ids)})
    return {int(r["chunk_id"]): (r["path"], r["text"]) for r in rows}


def require_goldsets(specs: Sequence[str]) -> None:
    if not specs:
        raise ConfigError("no gold set given: pass --goldset PATH|NAME or set CORPUSYNC_GOLDSETS "
                          '(a JSON list, e.g. \'["examples/goldset.jsonl"]\')')


@dataclass
class GateOutcome:
    evaluations: list[Evaluation]
    report: str                                         # every gold set's section, for the Prefect artifact
    sections: list[str] = field(default_factory=list)   # one Markdown section per evaluation (same order)

    @property
    def report_path(self) -> str | None:
        """The report files written (one per gold set), comma separated; None if none could be written."""
        paths = [e.report_path for e in self.evaluations if e.report_path]
        return ", ".join(paths) if paths else None

    @property
    def passed(self) -> bool:
        return all(e.passed is not False for e in self.evaluations)

    def failures(self) -> list[str]:
        return [f"{c.goldset} {c.mode} {c.metric}: {c.reason}" for e in self.evaluations for c in e.checks
                if not c.passed]

    def summary(self) -> list[dict[str, Any]]:
        return [{"goldset": e.goldset, "generation": e.generation, "evaluation_id": e.id, "passed": e.passed,
                 "overridden": e.overridden, "baseline_generation": e.baseline_generation,
                 "n_questions": e.n_questions, "fallback_questions": e.fallback_questions,
                 "missing_questions": e.missing_questions, "modes": e.modes,
                 "metrics": e.metrics, "ragas": e.ragas.get("metrics", {}), "report": e.report_path,
                 "notes": e.notes, "checks": [c.model_dump() for c in e.checks]} for e in self.evaluations]


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

    Baseline: the evaluation of `baseline_generation` (the published one, for a refresh; evaluated now if
    it never was), or, when None, the last published generation before `generation` that has one.
    """
    from corpusync.errors import ModelMismatch
    from evaluation.goldsets import load_goldset, sample_questions

    require_goldsets(specs)
    config = settings.gate_config() | {"reranker_path": str(settings.reranker_path) if settings.reranker_path
                                       else None}
    mode = settings.gate_mode
    evaluations: list[Evaluation] = []
    parts: list[str] = []
    for spec in specs:
        gs = sample_questions(load_goldset(spec, settings.goldset_dirs),
                              max_questions or settings.eval_max_questions)
        baseline: Baseline | None = None
        if gated and baseline_generation:
            baseline = find_baseline(conn, gs.name, baseline_generation, mode)
            if baseline is None:
                # The live generation was never evaluated (the gate was configured after it was published).
                try:
                    base_ev = evaluate_generation(settings, conn, searcher, gs, baseline_generation)
                except ModelMismatch:
                    base_ev = None  # a deliberate model switch: the old index cannot be queried with the new model
                if base_ev is not None:
                    store_evaluation(conn, base_ev, run_id, config)
                    assert base_ev.id is not None
                    baseline = Baseline(base_ev.id, baseline_generation,
                                        {q.question_id: {"scores": q.scores, "retrieved": q.retrieved}
                                         for q in base_ev.questions if q.mode == mode})
        elif gated:
            baseline = find_baseline(conn, gs.name, generation, mode, earlier=True)
        ev = evaluate_generation(settings, conn, searcher, gs, generation,
                                 model_id=searcher.index_model_id(generation))
        if gated:
            gate(settings, ev, baseline)
            ev.overridden = bool(override and ev.passed is False)
        store_evaluation(conn, ev, run_id, config)
        evaluations.append(ev)
        parts.append(_report_part(conn, ev, gs, mode, baseline.rows if baseline else {}))
    report = REPORT_TITLE + "\n".join(parts)
    _write_reports(settings, conn, generation, parts, evaluations)
    return GateOutcome(evaluations, report, parts)


def _report_part(conn: psycopg.Connection, ev: Evaluation, gs: GoldSet, mode: str, base_rows: dict[str, Any]) -> str:
    from evaluation.report import markdown

    return markdown(ev, gs, mode, baseline_questions=base_rows, lookup=lambda ids: chunk_sources(conn, ids))


REPORT_TITLE = "# corpusync evaluation\n\n"


def report_filename(generation: int, ev: Evaluation) -> str:
    """reports/eval-g<generation>-<gold set>-e<evaluation id>.md: one file per gold set and evaluation."""
    from evaluation.goldsets import passage_filename

    return f"eval-g{generation}-{passage_filename(ev.goldset).removesuffix('.txt')}-e{ev.id}.md"


def _write_reports(settings: Settings, conn: psycopg.Connection, generation: int, parts: Sequence[str],
                   evaluations: Sequence[Evaluation]) -> None:
    """One report per gold set (report_filename), its path stored with its evaluation, and
    reports/history-<goldset>.svg per gold set."""
    from evaluation.goldsets import passage_filename
    from evaluation.report import history_svg

    out = settings.reports_dir
    try:
        out.mkdir(parents=True, exist_ok=True)
        for ev, part in zip(evaluations, parts, strict=True):
            path = out / report_filename(generation, ev)
            path.write_text(REPORT_TITLE + part, encoding="utf-8")
            set_report_path(conn, ev, str(path))
            points = db.fetch_all(conn, "eval_history", {"goldset": ev.goldset, "mode": settings.gate_mode})
            svg = history_svg(points, f"{ev.goldset} ({settings.gate_mode}): history")
            (out / ("history-" + passage_filename(ev.goldset).removesuffix(".txt") + ".svg")).write_text(svg)
    except OSError:
        return  # reports are a convenience; the results are in the database either way
