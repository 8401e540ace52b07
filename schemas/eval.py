"""Typed records of the evaluation stage: gold questions, per-question results, gate checks."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

GoldLevel = Literal["passage", "document"]


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

    name: str
    source: str
    questions: list[GoldQuestion]
    passages: dict[str, str] = Field(default_factory=dict, description="passage id -> text (its corpus)")
    sha256: str = Field("", description="Content hash of the questions and gold references.")


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
    generation: int
    model_id: int | None = None
    n_questions: int
    modes: list[str]
    metrics: dict[str, dict[str, float]]
    ragas: dict[str, Any] = Field(default_factory=dict)
    questions: list[QuestionResult] = Field(default_factory=list)
    baseline_id: int | None = None
    baseline_generation: int | None = None
    checks: list[GateCheck] = Field(default_factory=list)
    passed: bool | None = None
    overridden: bool = False
    report_path: str | None = None
    fallback_questions: int = Field(
        0, description="Questions whose relevance fell back to whole documents (or ignored gold pages the "
        "generation has no page numbers for).")
    missing_questions: int = Field(0, description="Questions with no relevant chunk in this generation.")
    notes: list[str] = Field(default_factory=list, description="What was skipped or ignored, and why.")
