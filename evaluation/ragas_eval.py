"""RAGAS context metrics on the retrieved top 5 of the gated mode.

Without an LLM (default, offline): ID-based context precision/recall (retrieved chunk ids vs the relevant
chunk ids) and the non-LLM, string-similarity context precision/recall (retrieved texts vs the gold
evidence, or the relevant chunks' texts when the gold set has no evidence).
With an OpenAI-compatible endpoint configured (settings.eval_llm_*): also LLM-judged context precision and
recall against the reference answers, and faithfulness of an answer the LLM writes from the contexts.
Metrics that cannot run are reported as skipped with the reason, never filled in.

The non-LLM metrics are deterministic, so the gate judges them like retrieval metrics: `per_question` holds
each sample's scores (a NaN score left out) for floors and the paired bootstrap against the baseline.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.eval import RAGAS_GATED_METRICS
from schemas.settings import Settings

NON_LLM = RAGAS_GATED_METRICS
LLM = ("llm_context_precision_with_reference", "context_recall", "faithfulness")


@dataclass
class RagasSample:
    question: str
    retrieved_ids: list[str]
    retrieved_texts: list[str]
    reference_ids: list[str]
    reference_texts: list[str]
    answers: list[str] = field(default_factory=list)


def _mean(values: Sequence[float]) -> float | None:
    ok = [v for v in values if v is not None and not math.isnan(v)]
    return sum(ok) / len(ok) if ok else None


def _non_llm(samples: Sequence[RagasSample]) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """(mean per metric, each sample's scores) of the offline context metrics."""
    from ragas.dataset_schema import SingleTurnSample
    from ragas.metrics._context_precision import IDBasedContextPrecision, NonLLMContextPrecisionWithReference
    from ragas.metrics._context_recall import IDBasedContextRecall, NonLLMContextRecall

    metrics = [IDBasedContextPrecision(), IDBasedContextRecall(), NonLLMContextPrecisionWithReference(),
               NonLLMContextRecall()]
    scores: dict[str, list[float]] = {m.name: [] for m in metrics}
    per_question: list[dict[str, float]] = []
    for s in samples:
        sample = SingleTurnSample(
            user_input=s.question, retrieved_contexts=s.retrieved_texts or [""],
            reference_contexts=s.reference_texts or [""], retrieved_context_ids=s.retrieved_ids or ["-"],
            reference_context_ids=s.reference_ids or ["-none-"],
        )
        mine = {m.name: float(m.single_turn_score(sample)) for m in metrics}
        for name, v in mine.items():
            scores[name].append(v)
        per_question.append({name: v for name, v in mine.items() if math.isfinite(v)})
    return {name: _mean(v) for name, v in scores.items()}, per_question


async def _llm_async(samples: Sequence[RagasSample], settings: Settings) -> dict[str, Any]:
    from langchain_openai import ChatOpenAI
    from ragas.dataset_schema import SingleTurnSample
    from ragas.llms import LangchainLLMWrapper
    from ragas.metrics._context_precision import LLMContextPrecisionWithReference
    from ragas.metrics._context_recall import LLMContextRecall
    from ragas.metrics._faithfulness import Faithfulness

    key = settings.eval_llm_api_key.get_secret_value() if settings.eval_llm_api_key else "not-needed"
    chat = ChatOpenAI(base_url=settings.eval_llm_base_url, model=settings.eval_llm_model, api_key=key,
                      temperature=0)
    llm = LangchainLLMWrapper(chat)
    metrics: list[Any] = [LLMContextPrecisionWithReference(llm=llm), LLMContextRecall(llm=llm),
                          Faithfulness(llm=llm)]
    scores: dict[str, list[float]] = {m.name: [] for m in metrics}
    for s in samples:
        context = "\n\n".join(s.retrieved_texts)
        reply = await chat.ainvoke(
            "Answer the question using only the context. Be brief.\n\n"
            f"Context:\n{context}\n\nQuestion: {s.question}"
        )
        sample = SingleTurnSample(user_input=s.question, retrieved_contexts=s.retrieved_texts,
                                  reference=s.answers[0] if s.answers else "", response=str(reply.content))
        for m in metrics:
            scores[m.name].append(float(await m.single_turn_ascore(sample)))
    return {name: _mean(v) for name, v in scores.items()}


def ragas_scores(samples: Sequence[RagasSample], settings: Settings) -> dict[str, Any]:
    """{'metrics': {name: mean}, 'skipped': {name: reason}, 'n': questions scored, 'per_question': [{name:
    score} per sample, the non-LLM metrics]} ('per_question' is for the gate; the caller does not store it)."""
    out: dict[str, Any] = {"metrics": {}, "skipped": {}, "n": len(samples), "per_question": []}
    if not samples:
        return out
    try:
        means, out["per_question"] = _non_llm(samples)
        out["metrics"].update(means)
    except ImportError as exc:
        out["skipped"].update({m: f"ragas is not installed ({exc.name}); pip install corpusync[eval]"
                               for m in NON_LLM})
    if not settings.eval_llm_base_url:
        out["skipped"].update({m: "no LLM configured (set CORPUSYNC_EVAL_LLM_BASE_URL)" for m in LLM})
        out["skipped"]["answer_relevancy"] = "needs an LLM and an embeddings endpoint; not configured"
        return out
    try:
        out["metrics"].update(asyncio.run(_llm_async(samples, settings)))
    except Exception as exc:  # an unreachable or failing endpoint must not fail the (deterministic) gate
        out["skipped"].update({m: f"LLM judge failed: {type(exc).__name__}: {exc}" for m in LLM})
    out["skipped"]["answer_relevancy"] = "needs an embeddings endpoint; not configured"
    return out
