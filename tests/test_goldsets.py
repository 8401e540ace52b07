"""Gold-set loaders: corpusync JSON lines with alternatives and pages, clear errors for bad files in every
format, SQuAD titles kept on export like BEIR's, and a stable content hash for gold sets without the new
fields. Pure: small files written in tmp_path."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from corpusync.core.errors import ConfigError
from evaluation.goldset_formats import FORMATS, goldset_hash, passage_filename
from evaluation.goldsets import export_corpus, load_goldset
from schemas.eval import GoldQuestion, GoldRef


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows) + "\n",
                    encoding="utf-8")
    return path


def test_corpusync_jsonl_units_alternatives_and_pages(tmp_path: Path) -> None:
    gs = load_goldset(_jsonl(tmp_path / "law.jsonl", [
        {"id": "plain", "question": "q?", "gold_document": "en/Normans.md", "answers": ["911"]},
        {"id": "two", "question": "q?", "documents": ["a.md", "b.md"]},
        {"id": "alt", "question": "q?", "documents": [["law-2020.md", "law-2023.md"]]},
        {"id": "anyof", "question": "q?", "documents": [
            {"any_of": [{"document": "law-2020.pdf", "pages": [12]},
                        {"document": "law-2023.pdf", "pages": [14, "15-16"]}]},
            "annex.md"]},
        {"id": "paged", "question": "q?", "document": "report.pdf", "pages": ["3-4", 7]},
    ]))
    q = {x.id: x for x in gs.questions}
    # without alternatives or pages: one unit per document, as before, and no gold_units stored
    assert q["plain"].gold_documents == ["en/Normans.md"] and q["plain"].gold_units == []
    assert q["plain"].level == "document" and q["plain"].answers == ["911"]
    assert [[r.document for r in u] for u in q["two"].units] == [["a.md"], ["b.md"]]
    # a JSON list is a set of alternatives: ONE unit, two acceptable documents
    assert [[r.document for r in u] for u in q["alt"].units] == [["law-2020.md", "law-2023.md"]]
    assert q["alt"].gold_documents == ["law-2020.md", "law-2023.md"]  # every alternative, for export/resolving
    assert q["anyof"].units == [[GoldRef(document="law-2020.pdf", pages=[12]),
                                 GoldRef(document="law-2023.pdf", pages=[14, 15, 16])],
                                [GoldRef(document="annex.md")]]
    assert q["paged"].units == [[GoldRef(document="report.pdf", pages=[3, 4, 7])]]


def test_hash_unchanged_for_gold_sets_without_alternatives(tmp_path: Path) -> None:
    """The content hash of an existing gold set (no alternatives, no pages) is the one it always had."""
    gs = load_goldset(_jsonl(tmp_path / "g.jsonl", [
        {"id": "1", "question": "Who?", "gold_document": "a.md", "answers": ["x"], "lang": "en"}]))
    legacy = {"id": "1", "question": "Who?", "gold_documents": ["a.md"], "answers": ["x"], "evidence": [],
              "level": "document", "lang": "en"}
    expected = hashlib.sha256(json.dumps(legacy, sort_keys=True, ensure_ascii=False).encode() + b"\n").hexdigest()
    assert gs.sha256 == expected
    # alternatives and pages are part of the hash
    alt = GoldQuestion(id="1", question="Who?", gold_units=[[GoldRef(document="a.md"), GoldRef(document="b.md")]])
    paged = GoldQuestion(id="1", question="Who?", gold_units=[[GoldRef(document="a.md", pages=[2])]])
    assert len({goldset_hash([alt]), goldset_hash([paged]), expected}) == 3


@pytest.mark.parametrize(("row", "message"), [
    ({"question": "q?", "document": "a.md"}, 'line 1: missing field "id"'),
    ({"id": "1", "document": "a.md"}, 'line 1: missing field "question"'),
    ({"id": "1", "question": "q?", "answers": ["x"]}, 'line 1: missing field "document" (or "documents")'),
    ({"id": "1", "question": "q?", "documents": []}, 'line 1: field "documents" is empty'),
    ({"id": "1", "question": "q?", "documents": "a.md"}, 'line 1: field "documents": expected a list'),
    ({"id": "1", "question": "q?", "documents": [[]]}, "line 1: an empty list of alternative documents"),
    ({"id": "1", "question": "q?", "documents": [{"pages": [1]}]}, 'line 1: missing field "document"'),
    ({"id": "1", "question": "q?", "document": "a.pdf", "pages": [0]}, 'field "pages": 0 is not a page number'),
    ({"id": "1", "question": "q?", "document": "a.pdf", "pages": ["3-1"]}, "'3-1' is not a page number"),
    ({"id": "1", "question": "q?", "documents": ["a.pdf", "b.pdf"], "pages": [2]},
     'field "pages" at top level needs exactly one gold document'),
    ({"id": "1", "question": "q?", "document": "a.md", "answers": "x"}, 'line 1: field "answers": Input should'),
    ({"id": "1", "question": "q?", "document": "a.md", "level": "chapter"}, 'field "level"'),
    ("{not json", "line 1: not valid JSON"),
    ('["a list"]', "line 1: expected a JSON object, got list"),
    ({"question_id": 5, "question": "q?", "documents": []}, "this looks like DuReader JSON lines"),
])
def test_bad_corpusync_jsonl_names_line_field_and_formats(tmp_path: Path, row: Any, message: str) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", [row])
    with pytest.raises(ConfigError) as err:
        load_goldset(path)
    text = str(err.value)
    assert text.startswith(f"gold set {path} line 1: ") and message in text
    assert f"(expected {FORMATS})" in text
    for fmt in ("corpusync JSON lines", "BEIR folder", "SQuAD JSON", "DuReader JSON lines"):
        assert fmt in text


def test_bad_line_number_is_the_file_line(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "g.jsonl", [{"id": "1", "question": "q?", "document": "a.md"}, "",
                                         {"id": "2", "question": "q?"}])
    with pytest.raises(ConfigError, match='line 3: missing field "document"'):
        load_goldset(path)


def _squad(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


SQUAD = {"version": "1.1", "data": [{"title": "Super_Bowl_50", "paragraphs": [
    {"context": "Super Bowl 50 was an American football game. The Denver Broncos won.",
     "qas": [{"id": "q1", "question": "Who won?", "answers": [{"text": "Denver Broncos", "answer_start": 47},
                                                              {"text": "Denver Broncos", "answer_start": 47}]}]}]},
    {"title": "战国无双3", "paragraphs": [{"id": "DEV_0", "context": "《战国无双3》是由光荣和ω-force开发的。",
                                           "qas": [{"id": "z1", "question": "谁开发的？",
                                                    "answers": [{"text": "光荣和ω-force"}]}]}]}]}


def test_squad_export_keeps_article_titles_like_beir(tmp_path: Path) -> None:
    gs = load_goldset(_squad(tmp_path / "dev.json", SQUAD))
    assert [q.gold_documents for q in gs.questions] == [["Super_Bowl_50_000.txt"], ["DEV_0.txt"]]
    assert gs.questions[0].answers == ["Denver Broncos"] and gs.questions[0].level == "passage"
    n = export_corpus(gs, tmp_path / "out")
    assert n == 2
    assert (tmp_path / "out" / "Super_Bowl_50_000.txt").read_text(encoding="utf-8") == (
        "Super Bowl 50\n\nSuper Bowl 50 was an American football game. The Denver Broncos won.")
    assert (tmp_path / "out" / passage_filename("DEV_0")).read_text(encoding="utf-8").startswith("战国无双3\n\n《战国")
    # BEIR does the same with its corpus titles
    beir = tmp_path / "beir"
    beir.mkdir()
    _jsonl(beir / "corpus.jsonl", [{"_id": "p1", "title": "Super_Bowl_50", "text": "The Broncos won."}])
    _jsonl(beir / "queries.jsonl", [{"_id": "q1", "text": "Who won?"}])
    (beir / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tp1\t1\n")
    export_corpus(load_goldset(beir), tmp_path / "out-beir")
    assert (tmp_path / "out-beir" / "p1.txt").read_text(encoding="utf-8") == "Super Bowl 50\n\nThe Broncos won."


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.pop("data"), ': missing field "data"'),
    (lambda d: d["data"][0]["paragraphs"][0].pop("context"), ' data[0].paragraphs[0]: missing field "context"'),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].pop("question"),
     ' data[0].paragraphs[0].qas[0]: missing field "question"'),
    (lambda d: d["data"][1]["paragraphs"][0]["qas"][0].pop("id"), ' data[1].paragraphs[0].qas[0]: missing field "id"'),
    (lambda d: d["data"][0].pop("paragraphs"), ' data[0]: missing field "paragraphs"'),
])
def test_bad_squad_names_json_path_and_field(tmp_path: Path, mutate: Any, message: str) -> None:
    data = json.loads(json.dumps(SQUAD))
    mutate(data)
    path = _squad(tmp_path / "dev.json", data)
    with pytest.raises(ConfigError) as err:
        load_goldset(path)
    assert str(err.value).startswith(f"gold set {path}{message}") and "SQuAD JSON" in str(err.value)


def test_bad_beir_and_dureader(tmp_path: Path) -> None:
    beir = tmp_path / "beir"
    beir.mkdir()
    _jsonl(beir / "queries.jsonl", [{"_id": "q1", "text": "Who won?"}])
    with pytest.raises(ConfigError, match=r"no qrels\.tsv"):
        load_goldset(beir)
    (beir / "qrels.tsv").write_text("q1\tp1\t1\n")
    with pytest.raises(ConfigError, match=r"no corpus\.jsonl"):
        load_goldset(beir)
    _jsonl(beir / "corpus.jsonl", [{"_id": "p1", "title": "t"}])
    with pytest.raises(ConfigError, match=r'corpus\.jsonl line 1: missing field "text"'):
        load_goldset(beir)
    _jsonl(beir / "corpus.jsonl", [{"_id": "p1", "text": "x"}])
    _jsonl(beir / "queries.jsonl", [{"_id": "q1", "query": "Who won?"}])
    with pytest.raises(ConfigError, match=r'queries\.jsonl line 1: missing field "text".*BEIR folder'):
        load_goldset(beir)

    dur = tmp_path / "dureader"
    dur.mkdir()
    good = {"question_id": 7, "question": "什么？", "answers": ["甲"],
            "documents": [{"title": "T", "paragraphs": ["甲乙", "丙"], "is_selected": True, "most_related_para": 0}]}
    _jsonl(dur / "search.dev.jsonl", [good, {"question": "无编号", "documents": []}])
    with pytest.raises(ConfigError, match=r'search\.dev\.jsonl line 2: missing field "question_id"'):
        load_goldset(dur)
    # a DuReader file given directly is read as DuReader, not as corpusync JSON lines
    _jsonl(dur / "search.dev.jsonl", [good])
    gs = load_goldset(dur / "search.dev.jsonl")
    assert gs.questions[0].evidence == ["甲乙"] and gs.passages == {"7_0": "T\n\n甲乙\n\n丙"}


def test_unrecognised_folder_lists_formats(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"unrecognised layout.*corpusync JSON lines.*BEIR folder"):
        load_goldset(tmp_path / "empty")
