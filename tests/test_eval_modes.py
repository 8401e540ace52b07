"""Which modes an evaluation runs (hybrid+rerank with a reranker, a note without one, a ConfigError when it
is asked for without one) and what score_generation measures per mode (latency beside the quality metrics,
never per question; reranking through Searcher.search(mode="hybrid", rerank=True)). Pure: a recording fake
searcher and gold chunks handed in, no database."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from corpusync.core.errors import ConfigError
from evaluation import relevance as rel
from schemas.eval import GoldQuestion, GoldRef, GoldSet
from schemas.settings import Settings
from tasks import evaluate as ev_task


def _settings(tmp_path: Path, **kw: Any) -> Settings:
    return Settings(home=tmp_path / "home", **kw)


def test_plan_modes(tmp_path: Path) -> None:
    modes, notes = ev_task.plan_modes(_settings(tmp_path))
    assert modes == ["dense", "lexical", "hybrid"]
    assert len(notes) == 1 and "hybrid+rerank: skipped" in notes[0] and "CORPUSYNC_RERANKER_PATH" in notes[0]
    # a reranker configured: hybrid+rerank joins the default modes
    with_rr = _settings(tmp_path, reranker_path=tmp_path / "bge-reranker")
    assert ev_task.plan_modes(with_rr) == (["dense", "lexical", "hybrid", "hybrid+rerank"], [])
    # modes chosen explicitly are kept as chosen (plus the gate's mode)
    assert ev_task.plan_modes(_settings(tmp_path, reranker_path=tmp_path, eval_modes=["dense"])) == (
        ["dense", "hybrid"], [])
    assert ev_task.plan_modes(with_rr.model_copy(update={"eval_modes": ["hybrid+rerank"]}))[0] == [
        "hybrid+rerank", "hybrid"]
    # asked for without a reranker: a clear error, not a silent skip
    with pytest.raises(ConfigError, match=r"'hybrid\+rerank' needs a reranker.*CORPUSYNC_RERANKER_PATH"):
        ev_task.plan_modes(_settings(tmp_path, eval_modes=["hybrid", "hybrid+rerank"]))
    with pytest.raises(ConfigError, match="needs a reranker"):
        ev_task.plan_modes(_settings(tmp_path, gate_mode="hybrid+rerank"))
    with pytest.raises(ConfigError, match=r"unknown evaluation mode.*'hybird'"):
        ev_task.plan_modes(_settings(tmp_path, eval_modes=["hybird"]))


class FakeSearcher:
    """Records every search call; returns chunk ids per mode so each mode scores differently."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.embedder = SimpleNamespace(embed=lambda texts: SimpleNamespace(dense=[[0.0] * 4 for _ in texts]))

    def search(self, text: str, k: int = 10, mode: str = "hybrid", generation: int | None = None,
               query_vector: Any = None, filters: Any = None, rerank: bool = False) -> list[Any]:
        self.calls.append({"text": text, "mode": mode, "rerank": rerank, "k": k, "vector": query_vector})
        order = {("dense", False): [2, 1], ("lexical", False): [9, 8], ("hybrid", False): [1, 2],
                 ("hybrid", True): [3, 1]}[(mode, rerank)]
        return [SimpleNamespace(chunk_id=c, source="law-2023.md", text=f"chunk {c}") for c in order]


def test_evaluate_generation_modes_latency_and_rerank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    qs = [GoldQuestion(id="alt", question="Penalty?", answers=["7.5"], level="document",
                       gold_units=[[GoldRef(document="law-2020.md"), GoldRef(document="law-2023.md")]]),
          GoldQuestion(id="missing", question="Gone?", gold_documents=["deleted.md"]),
          GoldQuestion(id="fb", question="Free form?", answers=["not in any chunk"], gold_documents=["other.md"],
                       level="document")]
    gs = GoldSet(name="law", source="x", questions=qs)
    docs = {"law-2020.md": [], "law-2023.md": ["law-2023.md"], "deleted.md": [], "other.md": ["other.md"]}
    by_path = {"law-2023.md": [rel.ChunkRef(1, "law-2023.md", "Penalty: 7.5 percent."),
                               rel.ChunkRef(2, "law-2023.md", "Something else.")],
               "other.md": [rel.ChunkRef(3, "other.md", "Unrelated words.")]}
    monkeypatch.setattr(ev_task, "ragas_scores", lambda samples, settings: {"metrics": {}, "n": len(samples)})
    searcher = FakeSearcher()
    settings = _settings(tmp_path, reranker_path=tmp_path / "bge-reranker")
    ev = ev_task.score_generation(settings, searcher, gs, 4, ev_task.GoldChunks(docs, by_path))  # type: ignore[arg-type]

    assert ev.modes == ["dense", "lexical", "hybrid", "hybrid+rerank"] and ev.notes == []
    # hybrid+rerank is hybrid search with rerank=True; the other modes never rerank
    rr = [c for c in searcher.calls if c["rerank"]]
    assert rr and all(c["mode"] == "hybrid" for c in rr)
    assert {c["mode"] for c in searcher.calls if not c["rerank"]} == {"dense", "lexical", "hybrid"}
    # one untimed warm-up per mode, then one call per question; precomputed vectors are passed (not lexical)
    assert len(searcher.calls) == 4 * (1 + len(qs))
    assert all(c["vector"] is not None for c in searcher.calls if c["mode"] != "lexical")
    for mode in ev.modes:
        m = ev.metrics[mode]
        assert m["latency_ms_p50"] >= 0.0 and m["latency_ms_p95"] >= m["latency_ms_p50"]
        assert "recall@5" in m
    assert all("latency_ms_p50" not in q.scores for q in ev.questions)  # per-question scores: quality only
    by = {(q.mode, q.question_id): q for q in ev.questions}
    # the alternative present (law-2023) answers: chunk 1 relevant; hybrid ranks it first, dense second
    assert by[("hybrid", "alt")].scores["mrr@10"] == 1.0 and by[("dense", "alt")].scores["mrr@10"] == 0.5
    assert by[("hybrid+rerank", "alt")].first_rank == 2 and by[("lexical", "alt")].scores["recall@20"] == 0.0
    assert ev.missing_questions == 1 and ev.fallback_questions == 1
    # the rerank mode's numbers are its own
    assert ev.metrics["hybrid+rerank"]["mrr@10"] != ev.metrics["hybrid"]["mrr@10"]


def test_without_reranker_the_mode_is_skipped_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gs = GoldSet(name="g", source="x", questions=[GoldQuestion(id="1", question="q", gold_documents=["a.md"])])
    gold = ev_task.GoldChunks({"a.md": ["a.md"]}, {"a.md": [rel.ChunkRef(1, "a.md", "x")]})
    monkeypatch.setattr(ev_task, "ragas_scores", lambda samples, settings: {})
    searcher = FakeSearcher()
    ev = ev_task.score_generation(_settings(tmp_path), searcher, gs, 1, gold)  # type: ignore[arg-type]
    assert "hybrid+rerank" not in ev.modes and not any(c["rerank"] for c in searcher.calls)
    assert ev.notes and "hybrid+rerank: skipped" in ev.notes[0]
    outcome = ev_task.GateOutcome([ev], "r", ["r"])
    (summary,) = outcome.summary()
    assert summary["notes"] == ev.notes and summary["missing_questions"] == 0
    assert summary["fallback_questions"] == 0 and summary["n_questions"] == 1


def test_gate_notes_ignored_latency_thresholds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gs = GoldSet(name="g", source="x", questions=[GoldQuestion(id="1", question="q", gold_documents=["a.md"])])
    gold = ev_task.GoldChunks({"a.md": ["a.md"]}, {"a.md": [rel.ChunkRef(1, "a.md", "x")]})
    monkeypatch.setattr(ev_task, "ragas_scores", lambda samples, settings: {})
    settings = _settings(tmp_path, gate_floors={"latency_ms_p95": 50.0, "recall@5": 0.5},
                         gate_tolerances={"g:latency_ms_p50": 1.0})
    ev = ev_task.score_generation(settings, FakeSearcher(), gs, 1, gold)  # type: ignore[arg-type]
    ev_task.gate(settings, ev, None)
    assert [c.metric for c in ev.checks] == ["recall@5"] and ev.passed is True
    assert any("g:latency_ms_p50, latency_ms_p95 ignored" in n for n in ev.notes)
