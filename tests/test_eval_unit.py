"""Evaluation pure functions: metrics against hand-computed values, the paired bootstrap and the gate,
relevance rules, and the gold-set loaders on the real gold sets in ../shared/data/goldsets (else on the excerpts
bundled in tests/data/goldsets)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from evaluation import relevance as rel
from evaluation.gate import gate_checks
from evaluation.goldset_formats import goldset_hash, passage_filename
from evaluation.goldsets import export_corpus, load_goldset, sample_questions
from evaluation.metrics import (
    aggregate,
    hit_at_k,
    judged_relevant,
    latency_summary,
    mrr_at_k,
    ndcg_at_k,
    paired_bootstrap,
    question_scores,
    recall_at_k,
)
from evaluation.ragas_eval import RagasSample, ragas_scores
from evaluation.report import describe_gold, markdown
from schemas.eval import Evaluation, GoldQuestion, GoldRef, GoldSet, QuestionResult
from schemas.settings import Settings
from tasks import evaluate as ev
from tests.conftest import REPO, TEST_DATA, USING_SHARED_DATA

GOLDSETS = TEST_DATA / "goldsets"
# (questions, passages) of SQuAD v1.1 dev and CMRC 2018 dev: the full sets, or the bundled excerpts (their first
# 2 and 20 articles, tests/data/SOURCE.md)
SQUAD_SIZE, CMRC_SIZE = ((10570, 2067), (3219, 848)) if USING_SHARED_DATA else ((289, 45), (74, 20))


def test_metrics_hand_computed() -> None:
    ranked = [7, 3, 9, 4, 1, 8]
    relevant = {3, 4, 5}
    assert hit_at_k(ranked, relevant, 1) == 0.0
    assert hit_at_k(ranked, relevant, 2) == 1.0
    assert mrr_at_k(ranked, relevant, 10) == 0.5
    assert mrr_at_k(ranked, relevant, 1) == 0.0
    # DCG = 1/log2(3) + 1/log2(5); ideal with 3 relevant = 1 + 1/log2(3) + 1/log2(4)
    expected = (1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3) + 0.5)
    assert ndcg_at_k(ranked, relevant, 10) == pytest.approx(expected)
    # recall counts gold units: unit A = {3}, unit B = {4, 5}, unit C = {6} (never retrieved)
    units = [{3}, {4, 5}, {6}]
    assert recall_at_k(ranked, units, 1) == 0.0
    assert recall_at_k(ranked, units, 2) == pytest.approx(1 / 3)
    assert recall_at_k(ranked, units, 4) == pytest.approx(2 / 3)
    assert recall_at_k(ranked, [], 4) == 0.0
    s = question_scores(ranked, units)
    assert s["recall@5"] == pytest.approx(2 / 3) and s["mrr@10"] == 0.5 and s["hit@10"] == 1.0
    assert aggregate([{"m": 1.0}, {"m": 0.0}, {"m": 0.5}]) == {"m": 0.5}


def test_ndcg_perfect_and_empty() -> None:
    assert ndcg_at_k([1, 2], {1, 2}, 10) == pytest.approx(1.0)
    assert ndcg_at_k([1, 2], set(), 10) == 0.0


def test_paired_bootstrap() -> None:
    same = [1.0, 0.0, 1.0, 0.5] * 10
    assert paired_bootstrap(same, same) == (0.0, 0.0, 0.0)
    base = [1.0] * 40
    worse = [1.0] * 20 + [0.0] * 20
    d, lo, hi = paired_bootstrap(worse, base, samples=1000)
    assert d == pytest.approx(-0.5) and lo < -0.3 and hi < -0.3
    assert paired_bootstrap(worse, base, samples=1000) == (d, lo, hi)  # seeded: reproducible
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [1.0, 0.0])


def _scores(values: list[float], metric: str = "recall@5") -> dict[str, dict[str, float]]:
    return {f"q{i}": {metric: v} for i, v in enumerate(values)}


def test_gate_noop_noise_real_drop_and_floor() -> None:
    base = _scores([1.0] * 19 + [0.0])
    kw = {"tolerances": {"recall@5": 0.02}, "floors": {}, "samples": 1000}
    (noop,) = gate_checks("g", "hybrid", base, base, **kw)  # type: ignore[arg-type]
    assert noop.passed and noop.delta == 0.0 and noop.n_paired == 20
    # one question of 20 lost: a 0.05 drop, more than the tolerance but inside the noise -> passes
    one_lost = _scores([1.0] * 18 + [0.0, 0.0])
    (noisy,) = gate_checks("g", "hybrid", one_lost, base, **kw)  # type: ignore[arg-type]
    assert noisy.passed and noisy.delta == pytest.approx(-0.05) and noisy.ci_low is not None and noisy.ci_low < 0
    assert "noise" in noisy.reason
    # half the questions lost: fails, with the interval wholly below zero
    half = _scores([1.0] * 10 + [0.0] * 10)
    (real,) = gate_checks("g", "hybrid", half, base, **kw)  # type: ignore[arg-type]
    assert not real.passed and real.ci_high is not None and real.ci_high < 0
    # floors apply without a baseline; gold-set-specific thresholds override the generic ones
    checks = gate_checks("g", "hybrid", half, None, tolerances={}, floors={"recall@5": 0.4, "g:recall@5": 0.6})
    assert [c.passed for c in checks] == [False] and "floor" in checks[0].reason
    assert gate_checks("other", "hybrid", half, None, tolerances={}, floors={"g:recall@5": 0.9}) == []


def test_relevance_rules() -> None:
    assert rel.doc_matches("zh/DEV_0.txt", "zh/DEV_0.txt")
    assert rel.doc_matches("DEV_0", "zh/DEV_0.txt")
    assert not rel.doc_matches("DEV_0", "zh/DEV_01.txt")
    docs = rel.resolve_documents(["DEV_0", "en/Normans.md", "missing.txt"],
                                 ["zh/DEV_0.txt", "zh/DEV_01.txt", "en/Normans.md"])
    assert docs == {"DEV_0": ["zh/DEV_0.txt"], "en/Normans.md": ["en/Normans.md"], "missing.txt": []}
    chunks = {"a.md": [rel.ChunkRef(1, "a.md", "The Normans came from Normandy."),
                       rel.ChunkRef(2, "a.md", "Rollo signed a treaty in 911 with Charles III.")]}
    q = GoldQuestion(id="1", question="When?", gold_documents=["a.md", "b.md"], answers=["911"], level="document")
    r = rel.relevant_chunks(q, {"a.md": ["a.md"], "b.md": []}, chunks)
    assert r.units == [{2}, set()] and not r.fallback  # b.md is not in the generation: an empty unit
    q_fb = q.model_copy(update={"answers": ["in the year nine hundred eleven"]})
    assert rel.relevant_chunks(q_fb, {"a.md": ["a.md"]}, chunks).fallback
    q_ev = q.model_copy(update={"evidence": ["Rollo signed a treaty in 911 with Charles III, king of the Franks."]})
    assert rel.relevant_chunks(q_ev, {"a.md": ["a.md"]}, chunks).units[0] == {2}
    q_p = q.model_copy(update={"level": "passage"})
    assert rel.relevant_chunks(q_p, {"a.md": ["a.md"]}, chunks).units[0] == {1, 2}
    # normalisation: full-width, case and line breaks do not matter
    assert rel.normalise("ＨＴ2023-0876\n合同") == "ht2023-0876合同"


def test_gold_references_follow_renames_of_the_lineage() -> None:
    # a reference by name alone ("label") already finds archive/label.pdf by its trailing segments
    present = {"archive/label.pdf", "b/new.md", "x.md", "c/z.md"}
    renames = [("scans/label.pdf", "old/label.pdf"), ("old/label.pdf", "archive/label.pdf"),  # moved twice
               ("b/z.md", "c/z.md"),  # before y.md came to b/z.md: not where y.md went
               ("a/y.md", "b/z.md"),
               ("x.md", "x2.md"),  # x.md came back later: the path names its own document
               ("gone.md", "g2.md")]  # renamed, then deleted
    docs = rel.resolve_documents(["scans/label.pdf", "a/y.md", "x.md", "gone.md", "never.md"], present)
    assert docs["x.md"] == ["x.md"] and docs["scans/label.pdf"] == []
    assert rel.follow_renames(docs, renames, present) == {"scans/label.pdf": ["archive/label.pdf"]}
    # y.md moved to b/z.md, which is not in this generation; had it been, it would be followed there only
    assert rel.follow_renames(docs, renames, present | {"b/z.md"}) == {"scans/label.pdf": ["archive/label.pdf"],
                                                                       "a/y.md": ["b/z.md"]}
    goldset = GoldSet(name="g", source="g.jsonl",
                      questions=[GoldQuestion(id="1", question="?", gold_documents=["scans/label.pdf", "x.md"])])
    found, followed = ev.gold_documents(goldset, sorted(present), renames)
    assert found == {"scans/label.pdf": ["archive/label.pdf"], "x.md": ["x.md"]}
    assert followed == {"scans/label.pdf": ["archive/label.pdf"]}
    assert "scans/label.pdf -> archive/label.pdf" in ev.renamed_note(followed)
    assert ev.gold_documents(goldset, sorted(present)) == ({"scans/label.pdf": [], "x.md": ["x.md"]}, {})


def test_alternatives_count_once_in_recall_mrr_and_ndcg() -> None:
    # one unit, two acceptable versions: law-2020 has chunks {1, 2}, law-2023 has chunks {5}
    alternatives = [[{1, 2}, {5}]]
    units = [{1, 2, 5}]
    ranked = [9, 5, 8, 1, 2]
    s = question_scores(ranked, units, alternatives)
    assert s["recall@1"] == 0.0 and s["recall@5"] == 1.0  # the 2023 version found at rank 2: the unit counts
    assert s["mrr@10"] == 0.5 and s["hit@10"] == 1.0
    # nDCG judges the alternative found first (2023, one chunk); 2020's chunks are neither gain nor ideal
    assert judged_relevant(ranked, alternatives, 10) == {5}
    assert s["ndcg@10"] == pytest.approx((1 / math.log2(3)) / 1.0)
    # without alternatives the union would ask for 3 relevant chunks, and 1, 2 would add gain
    flat = question_scores(ranked, units)
    assert flat["recall@5"] == 1.0 and flat["ndcg@10"] != s["ndcg@10"]
    # nothing retrieved: the largest alternative is the ideal; a unit that is not present at all adds nothing
    assert judged_relevant([7, 8], [[{1, 2}, {5}], [set(), set()]], 10) == {1, 2}
    # two units, one with alternatives: recall 1/2 when only the plain unit is found
    two = question_scores([3], [{1, 5}, {3}], [[{1}, {5}], [{3}]])
    assert two["recall@5"] == 0.5 and 0.0 < two["ndcg@10"] <= 1.0


def test_latency_summary_and_not_gated() -> None:
    lat = latency_summary([0.010, 0.020, 0.030, 0.040, 1.0])
    assert lat["latency_ms_p50"] == pytest.approx(30.0)
    assert lat["latency_ms_p95"] == pytest.approx(40 + 0.8 * 960)  # linear interpolation between 40 and 1000 ms
    assert latency_summary([]) == {}
    base = _scores([1.0] * 20)
    # a latency threshold is not a quality floor/tolerance: no check, while recall@5 is still gated
    checks = gate_checks("g", "hybrid", base, base, tolerances={"latency_ms_p95": 5.0, "recall@5": 0.02},
                         floors={"latency_ms_p50": 100.0, "g:latency_ms_p95": 1.0}, samples=200)
    assert [c.metric for c in checks] == ["recall@5"] and checks[0].passed


def test_relevance_alternatives() -> None:
    chunks = {"law-2020.md": [rel.ChunkRef(1, "law-2020.md", "Article 5: the penalty is 7.5 percent."),
                              rel.ChunkRef(2, "law-2020.md", "Article 6: other things.")],
              "law-2023.md": [rel.ChunkRef(5, "law-2023.md", "Article 5: the penalty is 7.5 percent (amended).")]}
    q = GoldQuestion(id="1", question="Penalty?", answers=["7.5 percent"], level="document",
                     gold_units=[[GoldRef(document="law-2020.md"), GoldRef(document="law-2023.md")]])
    assert q.gold_documents == ["law-2020.md", "law-2023.md"]
    both = rel.relevant_chunks(q, {"law-2020.md": ["law-2020.md"], "law-2023.md": ["law-2023.md"]}, chunks)
    assert both.units == [{1, 5}] and both.alternatives == [[{1}, {5}]] and not both.fallback
    # only one version indexed: the unit is still found through it (no miss, no fallback)
    only_new = rel.relevant_chunks(q, {"law-2020.md": [], "law-2023.md": ["law-2023.md"]}, chunks)
    assert only_new.units == [{5}] and only_new.alternatives == [[set(), {5}]] and not only_new.fallback
    # neither indexed: one empty unit (a miss), not two
    none = rel.relevant_chunks(q, {"law-2020.md": [], "law-2023.md": []}, chunks)
    assert none.units == [set()] and not none.relevant
    # no alternative passes the answer test: whole-document fallback over the present alternatives
    q_fb = q.model_copy(update={"answers": ["nine"]})
    fb = rel.relevant_chunks(q_fb, {"law-2020.md": ["law-2020.md"], "law-2023.md": ["law-2023.md"]}, chunks)
    assert fb.fallback and fb.units == [{1, 2, 5}]
    # end to end with the metrics: the 2023 chunk at rank 1 recalls the unit
    assert question_scores([5, 9], both.units, both.alternatives)["recall@1"] == 1.0


def test_relevance_pages() -> None:
    def c(cid: int, start: int | None, end: int | None, text: str = "text") -> rel.ChunkRef:
        return rel.ChunkRef(cid, "r.pdf", text, start, end)

    chunks = {"r.pdf": [c(1, 1, 1), c(2, 2, 3), c(3, 3, 3, "the answer 42"), c(4, 4, 5)]}
    docs = {"r.pdf": ["r.pdf"]}
    q = GoldQuestion(id="1", question="?", answers=["42"], level="document",
                     gold_units=[[GoldRef(document="r.pdf", pages=[3])]])
    # pages decide: every chunk whose span covers page 3 (2-3 and 3-3), with or without the answer text
    r = rel.relevant_chunks(q, docs, chunks)
    assert r.units == [{2, 3}] and not r.fallback
    assert rel.relevant_chunks(q.model_copy(update={"gold_units": [[GoldRef(document="r.pdf", pages=[5])]]}),
                               docs, chunks).units == [{4}]
    assert c(9, 2, None).covers([2]) and not c(9, 2, None).covers([3]) and not c(9, None, None).covers([1])
    # a page beyond the document: whole-document fallback
    far = rel.relevant_chunks(q.model_copy(update={"gold_units": [[GoldRef(document="r.pdf", pages=[99])]]}),
                              docs, chunks)
    assert far.fallback and far.units == [{1, 2, 3, 4}]
    # no page numbers in the generation (Markdown, or rows without page_start): the text rules decide, reported
    no_pages = {"r.pdf": [rel.ChunkRef(x.chunk_id, x.path, x.text) for x in chunks["r.pdf"]]}
    np_ = rel.relevant_chunks(q, docs, no_pages)
    assert np_.units == [{3}] and np_.fallback
    # alternatives with different pages per version
    q_alt = GoldQuestion(id="2", question="?", gold_units=[[GoldRef(document="r.pdf", pages=[1]),
                                                            GoldRef(document="s.pdf", pages=[2])]])
    s_pdf = [rel.ChunkRef(7, "s.pdf", "x", 1, 1), rel.ChunkRef(8, "s.pdf", "y", 2, 2)]
    both = rel.relevant_chunks(q_alt, {"r.pdf": ["r.pdf"], "s.pdf": ["s.pdf"]}, chunks | {"s.pdf": s_pdf})
    assert both.alternatives == [[{1}, {8}]] and both.units == [{1, 8}]


def test_report_shows_latency_notes_and_alternatives() -> None:
    q = GoldQuestion(id="q1", question="Penalty?", gold_units=[[GoldRef(document="law-2020.pdf", pages=[12]),
                                                                GoldRef(document="law-2023.pdf", pages=[14])]])
    assert describe_gold(q) == "`law-2020.pdf` p.12 | `law-2023.pdf` p.14"
    metrics = {"recall@1": 0.0, "recall@5": 0.0, "recall@10": 0.0, "recall@20": 0.0, "mrr@10": 0.0,
               "ndcg@10": 0.0, "hit@10": 0.0}
    ev = Evaluation(goldset="law", goldset_sha256="ab" * 32, generation=3, n_questions=1, modes=["hybrid"],
                    metrics={"hybrid": metrics | {"latency_ms_p50": 12.34, "latency_ms_p95": 56.78}},
                    questions=[QuestionResult(question_id="q1", mode="hybrid", retrieved=[], relevant_count=0,
                                              first_rank=None, scores=metrics)],
                    notes=["hybrid+rerank: skipped (no reranker configured)"], missing_questions=1)
    md = markdown(ev, GoldSet(name="law", source="x", questions=[q]), "hybrid")
    assert "| search p50 ms | p95 ms |" in md and "| 12.3 | 56.8 |" in md
    assert "- note: hybrid+rerank: skipped" in md and "no relevant chunk in this generation: 1" in md
    assert "gold: `law-2020.pdf` p.12 | `law-2023.pdf` p.14" in md


def test_demo_goldset_loads() -> None:
    gs = load_goldset(REPO / "examples" / "goldset.jsonl")
    assert len(gs.questions) == 59 and gs.questions[0].level == "document"
    assert gs.sha256 == goldset_hash(reversed(gs.questions))  # order-independent
    assert sample_questions(gs, 10).questions == sample_questions(gs, 10).questions
    assert len(sample_questions(gs, 10).questions) == 10


def test_real_goldset_loaders(tmp_path: Path) -> None:
    squad = load_goldset("squad-v1.1-dev", [GOLDSETS])
    assert (len(squad.questions), len(squad.passages)) == SQUAD_SIZE
    q = squad.questions[0]
    assert q.gold_documents == ["1973_oil_crisis_000.txt"] and "October 1973" in q.answers
    cmrc = load_goldset(GOLDSETS / "cmrc2018")
    assert (len(cmrc.questions), len(cmrc.passages)) == CMRC_SIZE
    assert cmrc.questions[0].gold_documents == [passage_filename("DEV_0")]
    dur = load_goldset(GOLDSETS / "dureader2-demo")
    assert 0 < len(dur.questions) <= 100 and all(q.level == "document" for q in dur.questions)
    assert sum(bool(q.evidence) for q in dur.questions) > len(dur.questions) // 2
    # exporting a subset writes the gold passages of those questions plus distractors
    sub = sample_questions(cmrc, 5)
    n = export_corpus(cmrc, tmp_path / "c", only_gold_of=sub, distractors=3)
    names = {p.name for p in (tmp_path / "c").iterdir()}
    assert n == len(names) and {g for q in sub.questions for g in q.gold_documents} <= names
    with pytest.raises(Exception, match="not found"):
        load_goldset("no-such-goldset", [GOLDSETS])


def test_ragas_non_llm_offline_and_llm_skipped() -> None:
    samples = [RagasSample(question="capital of France?", retrieved_ids=["1", "2"],
                           retrieved_texts=["Paris is the capital of France.", "Berlin is in Germany."],
                           reference_ids=["1"], reference_texts=["Paris is the capital of France."])]
    out = ragas_scores(samples, Settings())
    m = out["metrics"]
    assert m["id_based_context_recall"] == 1.0 and m["id_based_context_precision"] == 0.5
    assert m["non_llm_context_recall"] == pytest.approx(1.0)
    assert set(out["skipped"]) >= {"faithfulness", "context_recall", "answer_relevancy"}
    assert "CORPUSYNC_EVAL_LLM_BASE_URL" in out["skipped"]["faithfulness"]
