"""Gold-set formats: one reader per format (BEIR-style folders, SQuAD-format JSON (CMRC 2018), DuReader JSON
lines, corpusync's own JSON lines), each normalising its input into GoldSet/GoldQuestion and failing on bad
input with the line or field named. Kept apart from evaluation.goldsets (finding, keying, loading by shape,
sampling and exporting a gold set), which picks one of these readers.

A gold set that brings its own corpus (BEIR, SQuAD, DuReader) keeps its passages, and its gold references
name the files those passages become when the corpus is exported (`passage_filename`). BEIR and SQuAD
passages keep their title (BEIR `title`, SQuAD/CMRC the article's `title`) as the file's first line.

corpusync's own format (a `.jsonl` file), one question per line::

    {"id": "q1", "question": "...", "answers": ["..."], "document": "contracts/HT2023-0876.pdf", "pages": [3]}
    {"id": "q2", "question": "...", "documents": ["a.md", "b.md"]}
    {"id": "q3", "question": "...", "documents": [["law-2020.md", "law-2023.md"]]}
    {"id": "q4", "question": "...", "documents": [{"any_of": [{"document": "law-2020.pdf", "pages": [12]},
                                                              {"document": "law-2023.pdf", "pages": [14, "15-16"]}]}]}

- `id`, `question`: required. `answers`, `evidence` (gold passage texts): optional lists of strings.
- `document` (one gold document) or `documents` (a list; legacy names `gold_document`, `gold_documents`).
  Each entry of `documents` is one gold *unit*, and Recall counts units (every unit is needed for full
  recall). An entry is a document reference (a path relative to the corpus root, with or without its
  extension, or trailing path segments), an object `{"document": REF, "pages": [...]}`, or a set of
  alternatives, any one of which counts as finding the unit: `{"any_of": [ENTRY, ...]}` or, shorter, a
  JSON list `[ENTRY, ...]`.
- `pages`: 1-based page numbers (integers, or "N-M" ranges) of the gold document holding the answer; a
  chunk is relevant when its page span covers one. At top level it narrows `document` (or a `documents`
  list of one); inside an entry, that entry's document.
- `level`: 'document' (default: only chunks matching the evidence, an answer, or the pages are relevant)
  or 'passage' (every chunk of the gold document is); `lang`: optional language code.

A file that does not match its format fails with a ConfigError naming the line (or JSON path) and the
missing or bad field, and listing the formats understood (`FORMATS`).
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from corpusync.core.errors import ConfigError
from schemas.eval import GoldQuestion, GoldRef, GoldSet

_SAFE = re.compile(r"[^\w.\-]+", re.UNICODE)

FORMATS = (
    'corpusync JSON lines (.jsonl): {"id", "question", "answers"?, "document"|"documents", "evidence"?, '
    '"pages"?, "level"?, "lang"?}; '
    "BEIR folder: corpus.jsonl {_id, title?, text}, queries.jsonl {_id, text}, qrels.tsv or qrels/test.tsv "
    "(query-id, corpus-id, score); "
    'SQuAD JSON (.json, CMRC 2018): {"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", '
    '"answers": [{"text"}]}]}]}]}; '
    'DuReader JSON lines (search.*.jsonl): {"question_id", "question", "answers"?, "documents": [{"title", '
    '"paragraphs", "is_selected", "most_related_para"?}]}'
)


class _Bad(Exception):
    """A record that does not match its format: where (line or JSON path) and what."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)
        self.where, self.problem = where, problem


def _bad(source: Path | str, exc: _Bad) -> ConfigError:
    where = f" {exc.where}" if exc.where else ""
    return ConfigError(f"gold set {source}{where}: {exc.problem} (expected {FORMATS})")


def _get(record: Any, key: str, where: str) -> Any:
    if not isinstance(record, dict):
        raise _Bad(where, f"expected a JSON object, got {type(record).__name__}")
    if record.get(key) is None:
        raise _Bad(where, f'missing field "{key}"')
    return record[key]


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _Bad(where, f"not valid JSON ({exc})") from None


def _question(where: str, **fields: Any) -> GoldQuestion:
    try:
        return GoldQuestion(**fields)
    except ValidationError as exc:
        problems = "; ".join((f'field "{".".join(str(x) for x in e["loc"])}": ' if e["loc"] else "") + e["msg"]
                             for e in exc.errors())
        raise _Bad(where, problems) from None


def passage_filename(passage_id: str) -> str:
    """File name a passage gets when its gold set's corpus is exported (and that its gold refs name)."""
    return _SAFE.sub("_", passage_id).strip("._")[:180] + ".txt"


def goldset_hash(questions: Iterable[GoldQuestion]) -> str:
    """Content hash over questions and gold references (order-independent), stored with every evaluation.
    (A question without alternatives or pages hashes as it did before `gold_units` existed.)"""
    h = hashlib.sha256()
    for q in sorted(questions, key=lambda q: q.id):
        d = q.model_dump(mode="json")
        if not d.get("gold_units"):
            d.pop("gold_units", None)
        h.update(json.dumps(d, sort_keys=True, ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()


def _finish(name: str, source: Path, questions: list[GoldQuestion], passages: dict[str, str]) -> GoldSet:
    if not questions:
        raise ConfigError(f"gold set {source}: no questions found (expected {FORMATS})")
    seen: set[str] = set()
    for q in questions:
        if q.id in seen:
            raise ConfigError(f"gold set {source}: duplicate question id {q.id!r}")
        seen.add(q.id)
    return GoldSet(name=name, source=str(source), questions=questions, passages=passages,
                   sha256=goldset_hash(questions))


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def _pages(value: Any, where: str) -> list[int]:
    """[3, "5-7"] -> [3, 5, 6, 7] (1-based page numbers)."""
    if not isinstance(value, list):
        value = [value]
    out: list[int] = []
    for v in value:
        if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
            out.append(v)
            continue
        m = _RANGE.match(v) if isinstance(v, str) else None
        lo, hi = (int(m.group(1)), int(m.group(2) or m.group(1))) if m else (0, 0)
        if not m or lo < 1 or hi < lo or hi - lo > 10_000:
            raise _Bad(where, f'field "pages": {v!r} is not a page number (1-based integer) or a range "N-M"')
        out.extend(range(lo, hi + 1))
    return sorted(set(out))


def _alternative(entry: Any, where: str) -> GoldRef:
    if isinstance(entry, str) and entry.strip():
        return GoldRef(document=entry)
    if isinstance(entry, dict) and "any_of" not in entry:
        doc = _get(entry, "document", where)
        if not isinstance(doc, str) or not doc.strip():
            raise _Bad(where, f'field "document": expected a document reference (string), got {doc!r}')
        return GoldRef(document=doc, pages=_pages(entry["pages"], where) if entry.get("pages") is not None else [])
    raise _Bad(where, f'expected a document reference or {{"document", "pages"?}}, got {json.dumps(entry)}')


def _unit(entry: Any, where: str) -> list[GoldRef]:
    alts = entry["any_of"] if isinstance(entry, dict) and "any_of" in entry else entry
    if isinstance(alts, list):
        if not alts:
            raise _Bad(where, "an empty list of alternative documents")
        return [_alternative(a, where) for a in alts]
    return [_alternative(alts, where)]


def _units(r: dict[str, Any], where: str) -> list[list[GoldRef]]:
    single = next((r[k] for k in ("document", "gold_document") if r.get(k) is not None), None)
    many = next((r[k] for k in ("documents", "gold_documents") if r.get(k) is not None), None)
    if single is None and many is None:
        raise _Bad(where, 'missing field "document" (or "documents")')
    if many is not None and not isinstance(many, list):
        raise _Bad(where, f'field "documents": expected a list, got {type(many).__name__}')
    units = ([_unit(single, where)] if single is not None else []) + [_unit(e, where) for e in many or []]
    if not units:
        raise _Bad(where, 'field "documents" is empty: a gold question needs at least one gold document')
    if r.get("pages") is not None:
        if len(units) != 1 or len(units[0]) != 1 or units[0][0].pages:
            raise _Bad(where, 'field "pages" at top level needs exactly one gold document; with several, put '
                       '"pages" in each: {"document": ..., "pages": [...]}')
        units[0][0].pages = _pages(r["pages"], where)
    return units


def load_corpusync_jsonl(path: Path, name: str | None = None) -> GoldSet:
    """corpusync's own format, one question per line (see the module docstring): id, question, answers,
    document(s) with alternatives and pages, evidence, level (default 'document': the gold is a whole file
    of an ordinary corpus), lang."""
    questions = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"line {n}"
        try:
            r = _json(line, where)
            if isinstance(r, dict) and "question_id" in r and "id" not in r:
                raise _Bad(where, 'missing field "id": this looks like DuReader JSON lines; give the folder, or '
                           "name the file search.*.jsonl")
            qid, text = _get(r, "id", where), _get(r, "question", where)
            units = _units(r, where)
            simple = all(len(u) == 1 and not u[0].pages for u in units)
            questions.append(_question(
                where, id=str(qid), question=text, gold_documents=[u[0].document for u in units] if simple else [],
                gold_units=[] if simple else units, answers=r.get("answers", []), evidence=r.get("evidence", []),
                level=r.get("level", "document"), lang=r.get("lang", ""),
            ))
        except _Bad as exc:
            raise _bad(path, exc) from None
    return _finish(name or path.stem, path, questions, {})


def _jsonl(path: Path) -> Iterable[tuple[str, Any]]:
    """(where, record) per non-empty line of a JSON-lines file."""
    if not path.exists():
        raise _Bad("", f"no {path.name}")
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if line.strip():
                where = f"{path.name} line {n}"
                yield where, _json(line, where)


def _title_and(title: Any, text: str) -> str:
    """A passage's text with its title (underscores as spaces) as first line, the way BEIR's is exported."""
    t = str(title or "").replace("_", " ").strip()
    return (f"{t}\n\n" if t else "") + text


def load_beir(folder: Path, name: str | None = None) -> GoldSet:
    """BEIR layout: corpus.jsonl (_id, title, text), queries.jsonl (_id, text[, answers]), qrels.tsv or
    qrels/test.tsv (query-id, corpus-id, score > 0 = relevant)."""
    try:
        return _load_beir(folder, name)
    except _Bad as exc:
        raise _bad(folder, exc) from None


def _load_beir(folder: Path, name: str | None) -> GoldSet:
    qrels_path = next((p for p in (folder / "qrels.tsv", folder / "qrels" / "test.tsv") if p.exists()), None)
    if qrels_path is None:
        raise _Bad("", "no qrels.tsv (nor qrels/test.tsv)")
    passages: dict[str, str] = {}
    for where, r in _jsonl(folder / "corpus.jsonl"):
        passages[str(_get(r, "_id", where))] = _title_and(r.get("title"), _get(r, "text", where))
    qrels: dict[str, list[str]] = {}
    with qrels_path.open(encoding="utf-8", newline="") as f:
        for n, row in enumerate(csv.reader(f, delimiter="\t"), start=1):
            if len(row) < 3 or row[0] == "query-id":
                continue
            try:
                relevant = float(row[2]) > 0
            except ValueError:
                raise _Bad(f"{qrels_path.name} line {n}", f"score {row[2]!r} is not a number") from None
            if relevant:
                qrels.setdefault(row[0], []).append(row[1])
    questions = []
    for where, r in _jsonl(folder / "queries.jsonl"):
        qid = str(_get(r, "_id", where))
        gold = qrels.get(qid)
        if not gold or r.get("is_impossible"):
            continue
        questions.append(_question(
            where, id=qid, question=_get(r, "text", where), gold_documents=[passage_filename(g) for g in gold],
            answers=list(dict.fromkeys(r.get("answers", []))), level="passage",
        ))
    return _finish(name or folder.name, folder, questions, passages)


def load_squad(paths: list[Path], name: str) -> GoldSet:
    """SQuAD v1.1 JSON (CMRC 2018 uses it): each paragraph is a passage (its article's title kept as its
    first line, as for BEIR), gold = the question's paragraph."""
    passages: dict[str, str] = {}
    questions = []
    for path in paths:
        try:
            top = _json(path.read_text(encoding="utf-8"), "")
            data = _get(top, "data", "")
            if not isinstance(data, list):
                raise _Bad("", f'field "data": expected a list of articles, got {type(data).__name__}')
            for ai, article in enumerate(data):
                for pi, para in enumerate(_get(article, "paragraphs", f"data[{ai}]")):
                    where = f"data[{ai}].paragraphs[{pi}]"
                    title = article.get("title")
                    pid = str(para.get("id") or f"{title if title is not None else ai}_{pi:03d}")
                    passages[pid] = _title_and(title, _get(para, "context", where))
                    for qi, qa in enumerate(_get(para, "qas", where)):
                        qwhere = f"{where}.qas[{qi}]"
                        texts = [str(_get(a, "text", f"{qwhere}.answers[{i}]"))
                                 for i, a in enumerate(qa.get("answers") or [])]
                        answers = list(dict.fromkeys(t for t in texts if t.strip()))
                        questions.append(_question(
                            qwhere, id=str(_get(qa, "id", qwhere)), question=_get(qa, "question", qwhere),
                            gold_documents=[passage_filename(pid)], answers=answers, level="passage",
                        ))
        except _Bad as exc:
            raise _bad(path, exc) from None
        except (AttributeError, TypeError) as exc:  # a list where an object belongs, or the reverse
            raise _bad(path, _Bad("", f"unexpected structure ({exc})")) from None
    return _finish(name, paths[0], questions, passages)


def load_dureader(paths: list[Path], name: str) -> GoldSet:
    """DuReader 2.0 JSON lines: corpus = every document of every question; gold = the documents marked
    is_selected, evidence = their most_related_para (the DuReader authors' best-overlap paragraph)."""
    passages: dict[str, str] = {}
    questions = []
    for path in paths:
        try:
            for where, r in _jsonl(path):
                qid = str(_get(r, "question_id", where))
                gold, evidence = [], []
                for di, doc in enumerate(_get(r, "documents", where)):
                    pid = f"{qid}_{di}"
                    paras = _get(doc, "paragraphs", f"{where} documents[{di}]")
                    passages[pid] = (str(doc.get("title") or "").strip() + "\n\n" + "\n\n".join(paras)).strip()
                    if doc.get("is_selected"):
                        gold.append(passage_filename(pid))
                        mrp = doc.get("most_related_para")
                        if isinstance(mrp, int) and 0 <= mrp < len(paras):
                            evidence.append(paras[mrp])
                if gold:
                    questions.append(_question(
                        where, id=qid, question=_get(r, "question", where), gold_documents=gold,
                        answers=r.get("answers", []), evidence=evidence, level="document", lang="zh",
                    ))
        except _Bad as exc:
            raise _bad(path, exc) from None
        except (AttributeError, TypeError) as exc:
            raise _bad(path, _Bad("", f"unexpected structure ({exc})")) from None
    return _finish(name, paths[0], questions, passages)
