"""evaluate: score a generation against gold sets and gate it against the baseline: the pure half.

The metrics, relevance rules and the gate itself are pure functions in evaluation/; this module runs a gold
set's questions through a Searcher (the query layer) and scores them, given the generation's chunks of the
gold documents. Reading and storing evaluations, finding baselines and writing the reports is
corpusync.app.evaluating (its SQL: corpusync.store.evaluations); nothing here touches the database.

Modes: `eval_modes` (plus the gate's mode). With a reranker configured (`reranker_path`) and `eval_modes` left
at its default, `hybrid+rerank` (hybrid search, its fused candidates re-ordered by the cross-encoder) is
evaluated too; without one it is skipped with a note, and asking for it explicitly is a ConfigError.
Per mode, the search latency of the questions (p50/p95 in ms, after one untimed warm-up query) is stored beside
the quality metrics and never gated. Query embeddings are computed beforehand in batches bounded by
`embed_batch_tokens` and halved on out-of-memory, as a refresh embeds chunks (`embed_questions`).

Baseline: an evaluation of the same gold set (its stable key) and the same question set (content hash and
question ids; never an ad-hoc `eval --limit` run) with every tolerance-gated metric per question
(`choose_baseline`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, Protocol

from corpusync.adapters.embedding import Embedder, EmbeddingOutput
from corpusync.core.errors import ConfigError
from evaluation import relevance as rel
from evaluation.gate import (
    baseline_mismatch,
    check_threshold_goldsets,
    gate_checks,
    gated_metrics,
    ignored_thresholds,
)
from evaluation.metrics import aggregate, first_relevant_rank, latency_summary, question_scores
from evaluation.ragas_eval import RagasSample, ragas_scores
from schemas.eval import MODES, ChunkRef, Evaluation, GateOutcome, GoldSet, QuestionResult
from schemas.settings import Settings

K_RETRIEVE = 20
RERANK_MODE = "hybrid+rerank"


class Searcher(Protocol):
    """What scoring and tuning ask of the query layer (query.search.Searcher answers it): searches of a given
    generation, the model that embeds the questions, the stored fusion, the model's coverage of a text. A
    protocol, so the stages stay free of the database the searcher reads."""

    @property
    def embedder(self) -> Embedder: ...

    def search(self, text: str, *, k: int = 10, mode: Any = "hybrid", generation: int | None = None,
               query_vector: Any = None, rerank: bool = False, fusion: Any = None,
               pool: int | None = None) -> list[Any]: ...

    def dense_coverage(self, text: str) -> float: ...

    def fusion(self, model_id: int, generation: int) -> Any: ...
REPORT_TITLE = "# corpusync evaluation\n\n"
__all__ = ["GateOutcome", "score_generation"]

class GoldChunks(NamedTuple):
    """A generation's view of a gold set (corpusync.app.evaluating.gold_chunks reads it)."""

    docs: dict[str, list[str]]  # gold reference -> its document paths in the generation
    chunks: dict[str, list[ChunkRef]]  # path -> its chunks, in document order
    followed: Mapping[str, list[str]] = {}  # the references found only through renames -> their new paths


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
    return searcher.search(text, k=K_RETRIEVE, mode=mode, generation=generation,
                           query_vector=vector)


def gold_documents(goldset: GoldSet, paths: Iterable[str], renames: Sequence[tuple[str, str]] = (),
                   ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each document reference of the gold set's questions -> the paths of a generation it names, directly or
    through the renames of the generation's lineage (old path, new path; oldest first); and the references
    found only through renames (evaluation.relevance.follow_renames)."""
    present = list(paths)
    docs = rel.resolve_documents({ref for q in goldset.questions for ref in q.gold_documents}, present)
    followed = rel.follow_renames(docs, renames, set(present))
    return docs | followed, followed


def renamed_note(followed: Mapping[str, list[str]], shown: int = 3) -> str:
    """The evaluation's note on gold references found under another path."""
    pairs = [f"{ref} -> {', '.join(paths)}" for ref, paths in sorted(followed.items())]
    more = f"; and {len(pairs) - shown} more" if len(pairs) > shown else ""
    return (f"{len(pairs)} gold document reference(s) followed to where the document was renamed or moved: "
            + "; ".join(pairs[:shown]) + more)


def wanted_paths(docs: Mapping[str, Iterable[str]]) -> list[str]:
    """The paths whose chunks relevance needs: every document a gold reference resolved to."""
    return sorted({p for ps in docs.values() for p in ps})


def score_generation(settings: Settings, searcher: Searcher, goldset: GoldSet, generation: int, gold: GoldChunks,
                     model_id: int | None = None) -> Evaluation:
    """Run every question of `goldset` against `generation` in each configured mode and score it. `gold`: the
    generation's documents and chunks for the gold references (corpusync.app.evaluating.gold_chunks)."""
    modes, notes = plan_modes(settings)
    docs, by_path = gold.docs, gold.chunks
    if gold.followed:
        notes.append(renamed_note(gold.followed))
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


def choose_baseline(candidates: Iterable[Mapping[str, Any]], goldset: GoldSet,
                    rows_of: Callable[[int], dict[str, dict[str, Any]]],
                    needed: Sequence[str] = ()) -> tuple[Baseline | None, str]:
    """The first of `candidates` (stored evaluations of one generation, newest first) that can be the baseline
    of `goldset` (evaluation.gate.baseline_mismatch), or None and why the newest cannot ('' when none is).
    `rows_of(evaluation id)`: its per-question rows, read only for a candidate that gets that far."""
    ids = [q.id for q in goldset.questions]
    loaded: dict[int, dict[str, dict[str, Any]]] = {}

    def scores(eid: int) -> dict[str, dict[str, float]]:
        loaded[eid] = rows_of(eid)
        return {qid: r["scores"] for qid, r in loaded[eid].items()}

    first_reason = ""
    for row in candidates:
        eid = int(row["id"])
        reason = baseline_mismatch(row, goldset.sha256, ids, partial(scores, eid), needed)
        if reason is None:
            return Baseline(eid, int(row["generation"]), loaded[eid]), ""
        first_reason = first_reason or reason
    return None, first_reason


def needed_metrics(settings: Settings, goldset: GoldSet) -> list[str]:
    """The metrics a baseline of `goldset` must hold per question: those a tolerance gates."""
    return gated_metrics((settings.gate_tolerances,), {goldset.name, goldset.key})


def computed_baseline(ev: Evaluation, generation: int, mode: str) -> Baseline:
    """The baseline an evaluation made now is (none stored could serve); `ev` has been stored."""
    assert ev.id is not None
    rows = {q.question_id: {"scores": q.scores, "retrieved": q.retrieved} for q in ev.questions if q.mode == mode}
    return Baseline(ev.id, generation, rows, computed=True)


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


def require_goldsets(specs: Sequence[str]) -> None:
    if not specs:
        raise ConfigError("no gold set given: pass --goldset PATH|NAME or set CORPUSYNC_GOLDSETS "
                          '(a JSON list, e.g. \'["examples/goldset.jsonl"]\')')


def load_goldsets(settings: Settings, specs: Sequence[str],
                  max_questions: int | None) -> list[tuple[GoldSet, int | None]]:
    """Check thresholds and gold sets, then load every gold set, before anything is evaluated. Each comes with
    its question limit when `max_questions` leaves out questions the gate evaluates
    (settings.eval_max_questions): an ad-hoc evaluation, recorded as such and never a baseline; else None."""
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
    return sets


def gate_config(settings: Settings) -> dict[str, Any]:
    """The configuration stored with each evaluation: the gate's settings and the reranker."""
    return settings.gate_config() | {"reranker_path": str(settings.reranker_path) if settings.reranker_path
                                     else None}


def _safe(name: str) -> str:
    from evaluation.goldset_formats import passage_filename

    return passage_filename(name).removesuffix(".txt")


def report_filename(generation: int, ev: Evaluation) -> str:
    """reports/eval-g<generation>-<gold set>-e<evaluation id>.md: one file per gold set and evaluation."""
    return f"eval-g{generation}-{_safe(ev.goldset)}-e{ev.id}.md"


def history_filename(goldset_key: str) -> str:
    """reports/history-<gold set key>.svg: the metric history plot of one gold set."""
    return f"history-{_safe(goldset_key)}.svg"
