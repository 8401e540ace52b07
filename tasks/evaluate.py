"""evaluate: score a generation against gold sets, store the result, and gate it against the baseline.

The metrics, relevance rules and the gate itself are pure functions in evaluation/; this module reads the
generation from PostgreSQL, runs the queries, and stores evaluations (aggregate + per question).

Modes: `eval_modes` (plus the gate's mode). With a reranker configured (`reranker_path`) and `eval_modes` left
at its default, `hybrid+rerank` (hybrid search, its fused candidates re-ordered by the cross-encoder) is
evaluated too; without one it is skipped with a note, and asking for it explicitly is a ConfigError.
Per mode, the search latency of the questions (p50/p95 in ms, after one untimed warm-up query) is stored beside
the quality metrics and never gated. Query embeddings are computed beforehand in batches bounded by
`embed_batch_tokens` and halved on out-of-memory, as a refresh embeds chunks (`embed_questions`).

Baseline: an evaluation of the same gold set (its stable key) and the same question set (content hash and
question ids; never an ad-hoc `eval --limit` run) with every tolerance-gated metric per question. When the
baseline generation has none stored, it is evaluated now, and the report and summary say so and why.
Reports are written private (folder 0700, files 0600): they quote questions and chunk text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg

from corpusync import db
from corpusync.embedders import Embedder, EmbeddingOutput
from corpusync.errors import ConfigError, ModelMismatch
from evaluation import relevance as rel
from evaluation.gate import baseline_mismatch, check_threshold_goldsets, gate_checks, gated_metrics, ignored_thresholds
from evaluation.metrics import aggregate, first_relevant_rank, latency_summary, question_scores
from evaluation.ragas_eval import RagasSample, ragas_scores
from query.search import MODES, Searcher
from schemas.eval import Evaluation, GateOutcome, GoldSet, QuestionResult
from schemas.settings import Settings

K_RETRIEVE = 20
RERANK_MODE = "hybrid+rerank"
__all__ = ["GateOutcome", "evaluate_and_gate", "evaluate_generation"]


@dataclass
class Baseline:
    id: int
    generation: int
    rows: dict[str, dict[str, Any]]  # question id -> {"scores": {...}, "retrieved": [chunk ids]}
    computed: bool = False  # evaluated now: no stored evaluation of the same question set

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


class _Truncating:
    """An embedder whose token counts stop at the model's window: a longer question is truncated when it is
    embedded (as a search truncates it), so it must not trip the check that guards chunks."""

    def __init__(self, inner: Embedder) -> None:
        self._inner = inner
        self.identity = inner.identity

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [min(n, self.identity.max_tokens) for n in self._inner.count_tokens(texts)]

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return self._inner.token_offsets(text)

    def embed(self, texts: Sequence[str]) -> EmbeddingOutput:
        return self._inner.embed(texts)

    def __getattr__(self, name: str) -> Any:  # workers, prepare, forward, device: the model's own
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def embed_questions(embedder: Any, texts: Sequence[str], token_budget: int) -> Any:
    """Dense vectors of `texts` in input order, embedded in length-sorted batches of at most `token_budget`
    padded tokens, a batch halved on out-of-memory (tasks.embed.encode_texts, the refresh's own batching).
    An object without a tokenizer (not an Embedder) cannot be budgeted: one call."""
    if not isinstance(embedder, Embedder):
        return embedder.embed(list(texts)).dense
    from tasks.embed import encode_texts

    return encode_texts(_Truncating(embedder), texts, token_budget).dense


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
    needs_dense = any(m != "lexical" for m in modes) and bool(questions)
    vectors: Any = (embed_questions(searcher.embedder, [q.question for q in questions], settings.embed_batch_tokens)
                    if needs_dense else None)
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
    ragas_per_question = ragas.pop("per_question", None) or []
    if ragas_per_question:  # the gate judges RAGAS context metrics per question, like retrieval metrics
        gated = [r for r in results if r.mode == settings.gate_mode]
        for res, extra in zip(gated, ragas_per_question, strict=True):
            res.scores = {**res.scores, **extra}
    return Evaluation(
        goldset=goldset.name, goldset_key=goldset.key, goldset_source=goldset.source,
        goldset_sha256=goldset.sha256, generation=generation, model_id=model_id,
        n_questions=len(questions), modes=modes, metrics=metrics, ragas=ragas, questions=results,
        fallback_questions=fallback, missing_questions=missing, notes=notes,
    )


def per_question(ev: Evaluation, mode: str) -> dict[str, dict[str, float]]:
    return {q.question_id: q.scores for q in ev.questions if q.mode == mode}


def _question_rows(conn: psycopg.Connection, evaluation_id: int, mode: str) -> dict[str, dict[str, Any]]:
    rows = db.fetch_all(conn, "evaluation_questions", {"evaluation_id": evaluation_id, "mode": mode})
    return {r["question_id"]: r for r in rows}


def find_baseline(conn: psycopg.Connection, goldset: GoldSet, generation: int, mode: str,
                  needed: Sequence[str] = ()) -> tuple[Baseline | None, str]:
    """The newest stored evaluation of `generation` that can be the baseline of `goldset` (see
    evaluation.gate.baseline_mismatch), or None and why the newest stored one cannot ('' when none is)."""
    ids = [q.id for q in goldset.questions]
    loaded: dict[int, dict[str, dict[str, Any]]] = {}

    def scores(eid: int) -> dict[str, dict[str, float]]:
        loaded[eid] = _question_rows(conn, eid, mode)
        return {qid: r["scores"] for qid, r in loaded[eid].items()}

    first_reason = ""
    for row in db.fetch_all(conn, "goldset_evaluations", {"goldset_key": goldset.key, "goldset": goldset.name,
                                                           "generation": generation, "mode": mode}):
        eid = int(row["id"])
        reason = baseline_mismatch(row, goldset.sha256, ids, partial(scores, eid), needed)
        if reason is None:
            return Baseline(eid, int(row["generation"]), loaded[eid]), ""
        first_reason = first_reason or reason
    return None, first_reason


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
        row = db.fetch_one(conn, "previous_published_generation", {"generation": generation})
        if row is None:
            return None, "none: no earlier generation was published"
        target, status, searchable = int(row["generation"]), str(row["status"]), bool(row["searchable"])
    needed = gated_metrics((settings.gate_tolerances,), {goldset.name, goldset.key})
    stored, why = find_baseline(conn, goldset, target, mode, needed)
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
    store_evaluation(conn, base, run_id, config)
    assert base.id is not None
    rows = {q.question_id: {"scores": q.scores, "retrieved": q.retrieved} for q in base.questions if q.mode == mode}
    return Baseline(base.id, target, rows, computed=True), f"evaluated now: {why}"


def gate(settings: Settings, ev: Evaluation, baseline: Baseline | None, note: str = "") -> None:
    """Fill ev.checks / ev.passed from the configured floors and tolerances, and how the baseline was found."""
    mode = settings.gate_mode
    ev.checks = gate_checks(
        ev.goldset, mode, per_question(ev, mode), baseline.per_question if baseline else None,
        tolerances=settings.gate_tolerances, floors=settings.gate_floors, key=ev.goldset_key or None,
        samples=settings.gate_bootstrap_samples, confidence=settings.gate_confidence,
    )
    ev.baseline_id = baseline.id if baseline else None
    ev.baseline_generation = baseline.generation if baseline else None
    ev.baseline_computed = bool(baseline and baseline.computed)
    ev.baseline_note = note
    ev.passed = all(c.passed for c in ev.checks)
    ignored = ignored_thresholds((settings.gate_tolerances, settings.gate_floors), {ev.goldset, ev.goldset_key})
    if ignored:
        ev.notes.append(f"gate: {', '.join(ignored)} ignored (latency is reported, not gated)")


def store_evaluation(conn: psycopg.Connection, ev: Evaluation, run_id: int | None, config: dict[str, Any]) -> int:
    """One transaction: the evaluation row and a COPY of its per-question rows."""
    gated = ev.passed is not None
    if ev.notes:
        config = config | {"notes": ev.notes}
    with conn.transaction():
        row = db.fetch_one(conn, "insert_keyed_evaluation", {
            "run_id": run_id, "generation": ev.generation, "model_id": ev.model_id, "goldset": ev.goldset,
            "goldset_key": ev.goldset_key or ev.goldset, "goldset_source": ev.goldset_source or None,
            "goldset_sha256": ev.goldset_sha256, "n_questions": ev.n_questions, "question_limit": ev.question_limit,
            "modes": ev.modes,
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

    Thresholds and gold sets are checked, and every gold set loaded, before anything is evaluated. Baseline:
    see `resolve_baseline` (for a refresh, `baseline_generation` is the published generation). A
    `max_questions` that leaves out questions the gate evaluates (settings.eval_max_questions) makes an ad-hoc
    evaluation, recorded as such and never a baseline.
    """
    from evaluation.goldsets import load_goldset, sample_questions

    require_goldsets(specs)
    check_threshold_goldsets(settings.gate_tolerances, settings.gate_floors, specs, settings.goldsets,
                             settings.goldset_dirs)
    sets = []
    for spec in specs:
        full = load_goldset(spec, settings.goldset_dirs)
        gs = sample_questions(full, max_questions or settings.eval_max_questions)
        adhoc = gs.sha256 != sample_questions(full, settings.eval_max_questions).sha256
        sets.append((gs, max_questions if adhoc else None))
    config = settings.gate_config() | {"reranker_path": str(settings.reranker_path) if settings.reranker_path
                                       else None}
    mode = settings.gate_mode
    evaluations: list[Evaluation] = []
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
            gate(settings, ev, baseline, note)
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


def _safe(name: str) -> str:
    from evaluation.goldsets import passage_filename

    return passage_filename(name).removesuffix(".txt")


def report_filename(generation: int, ev: Evaluation) -> str:
    """reports/eval-g<generation>-<gold set>-e<evaluation id>.md: one file per gold set and evaluation."""
    return f"eval-g{generation}-{_safe(ev.goldset)}-e{ev.id}.md"


def _write_reports(settings: Settings, conn: psycopg.Connection, generation: int, parts: Sequence[str],
                   evaluations: Sequence[Evaluation]) -> None:
    """One report per gold set (report_filename), its path stored with its evaluation, and
    reports/history-<gold set key>.svg per gold set; the folder 0700 and every file 0600."""
    from evaluation.report import history_svg, private_dir, write_private

    try:
        out = private_dir(settings.reports_dir, tighten=("eval-*.md", "history-*.svg"))
        for ev, part in zip(evaluations, parts, strict=True):
            path = out / report_filename(generation, ev)
            write_private(path, REPORT_TITLE + part)
            set_report_path(conn, ev, str(path))
            key = ev.goldset_key or ev.goldset
            points = db.fetch_all(conn, "goldset_history", {"goldset_key": key, "goldset": ev.goldset,
                                                            "mode": settings.gate_mode})
            svg = history_svg(points, f"{key} ({settings.gate_mode}): history")
            write_private(out / f"history-{_safe(key)}.svg", svg)
    except OSError:
        return  # reports are a convenience; the results are in the database either way
