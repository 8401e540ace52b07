"""Typed records of the evaluation stage: gold questions, per-question results, gate checks."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

GoldLevel = Literal["passage", "document"]


class GoldQuestion(BaseModel):
    """One question of a gold set, in the normalised form every loader produces."""

    id: str
    question: str
    gold_documents: list[str] = Field(
        description="Document references: a path relative to the corpus root, or a passage/document id "
        "(matched against the path without its extension)."
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

    @field_validator("gold_documents")
    @classmethod
    def _need_gold(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("a gold question needs at least one gold document")
        return v


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
    fallback_questions: int = Field(0, description="Questions whose relevance fell back to whole documents.")
    missing_questions: int = Field(0, description="Questions with no relevant chunk in this generation.")
