"""Typed records of the evaluation stage: gold questions, per-question results, gate checks; and the names
of the metrics a gate threshold may name (here, so settings can check them without importing numpy)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from corpusync.core.errors import ConfigError

# The retrieval modes a search runs (query.search) and an evaluation scores (tasks.evaluate).
Mode = Literal["hybrid", "dense", "lexical", "sparse"]
MODES: tuple[Mode, ...] = ("hybrid", "dense", "lexical", "sparse")

GoldLevel = Literal["passage", "document"]

K_VALUES = (1, 5, 10, 20)
RETRIEVAL_METRICS = (*(f"recall@{k}" for k in K_VALUES), "mrr@10", "ndcg@10", "hit@10")
# RAGAS context metrics computed offline (no LLM), per question of the gate's mode: gated like retrieval metrics
RAGAS_GATED_METRICS = ("id_based_context_precision", "id_based_context_recall",
                       "non_llm_context_precision_with_reference", "non_llm_context_recall")
LATENCY_METRICS = ("latency_ms_p50", "latency_ms_p95")
GATED_METRICS = (*RETRIEVAL_METRICS, *RAGAS_GATED_METRICS)  # quality scores in 0..1, higher is better
# what a CORPUSYNC_GATE_FLOORS / _TOLERANCES key may name (latency: accepted, reported as ignored)
THRESHOLD_METRICS = (*GATED_METRICS, *LATENCY_METRICS)


def split_threshold_key(key: str) -> tuple[str | None, str]:
    """'goldset:metric' -> ('goldset', 'metric'); 'metric' -> (None, 'metric'). Metric names hold no colon."""
    prefix, sep, metric = key.rpartition(":")
    return (prefix, metric) if sep else (None, metric)


def check_thresholds(setting: str, table: Mapping[str, float], *, tolerance: bool) -> None:
    """ConfigError for a key naming no metric (a typo must not leave a metric ungated), a value that is not a
    finite number (a NaN floor never fails), a negative tolerance or a quality floor outside 0..1."""
    valid = ", ".join(THRESHOLD_METRICS)
    for key, value in table.items():
        prefix, metric = split_threshold_key(key)
        if metric not in THRESHOLD_METRICS or prefix == "":
            raise ConfigError(f"{setting}: unknown metric in key {key!r}; a key is 'metric' or 'goldset:metric' "
                              f"with metric one of: {valid}")
        if not math.isfinite(value):
            raise ConfigError(f"{setting}: {key!r} is {value}, not a finite number")
        if tolerance and value < 0:
            raise ConfigError(f"{setting}: {key!r} is {value}; a tolerated drop is 0 or more")
        if not tolerance and metric in GATED_METRICS and not 0.0 <= value <= 1.0:
            raise ConfigError(f"{setting}: {key!r} is {value}; {metric} is a score in 0..1")


class GoldRef(BaseModel):
    """One acceptable document of a gold unit, optionally narrowed to pages."""

    document: str = Field(description="Document reference (path, path without extension, or passage id).")
    pages: list[int] = Field(
        default_factory=list,
        description="1-based pages of the document that hold the answer: a chunk is relevant when its page "
        "span (page_start..page_end) covers one of them. Empty: any page.",
    )


class GoldQuestion(BaseModel):
    """One question of a gold set, in the normalised form every loader produces.

    Gold *units* are what Recall counts: by default each gold document is one unit. `gold_units` (set by
    corpusync's JSON lines when a question lists alternatives or pages) makes each unit a list of
    alternatives, any one of which counts, each optionally narrowed to pages.
    """

    id: str
    question: str
    gold_documents: list[str] = Field(
        default_factory=list,
        description="Every document the question references (all alternatives of all units): a path relative "
        "to the corpus root, or a passage/document id (matched against the path without its extension).",
    )
    gold_units: list[list[GoldRef]] = Field(
        default_factory=list,
        description="Gold units, each a list of alternatives (any one counts). Empty: one unit per gold "
        "document, any page.",
    )
    answers: list[str] = Field(default_factory=list, description="Reference answer strings.")
    evidence: list[str] = Field(
        default_factory=list, description="Gold evidence passages (text) inside the gold documents."
    )
    level: GoldLevel = Field(
        "passage",
        description="'passage': every chunk of a gold document is relevant (the document IS the gold "
        "passage); 'document': only chunks overlapping the evidence or containing an answer are.",
    )
    lang: str = ""

    @model_validator(mode="after")
    def _need_gold(self) -> GoldQuestion:
        if any(not unit for unit in self.gold_units):
            raise ValueError("a gold unit needs at least one document")
        if self.gold_units:  # the flat list follows the units (every alternative, first seen first)
            self.gold_documents = list(dict.fromkeys(r.document for unit in self.gold_units for r in unit))
        if not self.gold_documents:
            raise ValueError("a gold question needs at least one gold document")
        return self

    @property
    def units(self) -> list[list[GoldRef]]:
        """The gold units: `gold_units`, or one single-document unit per gold document."""
        return self.gold_units or [[GoldRef(document=d)] for d in self.gold_documents]


class GoldSet(BaseModel):
    """A named gold set; `passages` holds its own corpus when it brings one (BEIR, SQuAD, DuReader)."""

    name: str = Field(description="Readable name (file stem or folder name): reports, JSON, threshold keys.")
    source: str
    questions: list[GoldQuestion]
    passages: dict[str, str] = Field(default_factory=dict, description="passage id -> text (its corpus)")
    sha256: str = Field("", description="Content hash of the questions and gold references.")
    key: str = Field(
        "", description="Stable identity: the name plus a short hash of the gold set's absolute path, so two "
        "gold sets with the same file name in different folders keep apart baselines and history. Empty: name.")

    @model_validator(mode="after")
    def _default_key(self) -> GoldSet:
        self.key = self.key or self.name
        return self


@dataclass(frozen=True)
class ChunkRef:
    """A chunk of a generation as relevance judges it (corpusync.store.evaluations.gold_chunks reads them)."""

    chunk_id: int
    path: str
    text: str
    page_start: int | None = None
    page_end: int | None = None

    def covers(self, pages: Iterable[int]) -> bool:
        """The chunk's page span includes one of `pages` (never, without page numbers)."""
        if self.page_start is None:
            return False
        end = self.page_end if self.page_end is not None else self.page_start
        return any(self.page_start <= p <= end for p in pages)


class QuestionResult(BaseModel):
    """What one question retrieved in one mode, and its scores."""

    question_id: str
    mode: str
    retrieved: list[int]
    relevant_count: int
    first_rank: int | None
    scores: dict[str, float]
    retrieved_sources: list[str] = Field(default_factory=list)
    retrieved_texts: list[str] = Field(default_factory=list, exclude=True)


class GateCheck(BaseModel):
    """One metric's verdict: absolute floor and/or tolerated drop against the baseline."""

    goldset: str
    mode: str
    metric: str
    candidate: float
    baseline: float | None = None
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n_paired: int = 0
    tolerance: float | None = None
    floor: float | None = None
    passed: bool
    reason: str = ""


class Evaluation(BaseModel):
    """One gold set evaluated against one generation."""

    id: int | None = None
    goldset: str
    goldset_sha256: str
    goldset_key: str = Field("", description="GoldSet.key (empty: the name).")
    goldset_source: str = ""
    question_limit: int | None = Field(
        None, description="An ad-hoc limit (eval --limit) that left out questions the gate evaluates: such an "
        "evaluation is never a gate baseline.")
    generation: int
    model_id: int | None = None
    n_questions: int
    modes: list[str]
    metrics: dict[str, dict[str, float]]
    ragas: dict[str, Any] = Field(default_factory=dict)
    questions: list[QuestionResult] = Field(default_factory=list)
    baseline_id: int | None = None
    baseline_generation: int | None = None
    baseline_computed: bool = Field(False, description="The baseline was evaluated now (no stored evaluation "
                                    "of the same question set).")
    baseline_note: str = Field("", description="How the baseline was chosen, or why there is none.")
    checks: list[GateCheck] = Field(default_factory=list)
    passed: bool | None = None
    overridden: bool = False
    report_path: str | None = None
    fallback_questions: int = Field(
        0, description="Questions whose relevance fell back to whole documents (or ignored gold pages the "
        "generation has no page numbers for).")
    missing_questions: int = Field(0, description="Questions with no relevant chunk in this generation.")
    notes: list[str] = Field(default_factory=list, description="What was skipped or ignored, and why.")


@dataclass
class GateOutcome:
    """What evaluate_and_gate returns: the evaluations (one per gold set), their reports, the verdict."""

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
        names = [e.goldset for e in self.evaluations]
        return [f"{e.goldset_key if names.count(e.goldset) > 1 else c.goldset} {c.mode} {c.metric}: {c.reason}"
                for e in self.evaluations for c in e.checks if not c.passed]

    def summary(self) -> list[dict[str, Any]]:
        return [{"goldset": e.goldset, "goldset_key": e.goldset_key, "goldset_source": e.goldset_source,
                 "generation": e.generation, "evaluation_id": e.id, "passed": e.passed,
                 "overridden": e.overridden, "baseline_generation": e.baseline_generation,
                 "baseline_id": e.baseline_id, "baseline_computed": e.baseline_computed,
                 "baseline_note": e.baseline_note, "question_limit": e.question_limit,
                 "n_questions": e.n_questions, "fallback_questions": e.fallback_questions,
                 "missing_questions": e.missing_questions, "modes": e.modes,
                 "metrics": e.metrics, "ragas": e.ragas.get("metrics", {}), "report": e.report_path,
                 "notes": e.notes, "checks": [c.model_dump() for c in e.checks]} for e in self.evaluations]
