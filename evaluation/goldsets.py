"""Gold-set loaders: BEIR-style folders, SQuAD-format JSON (CMRC 2018), DuReader JSON lines and
corpusync's own JSON lines, all normalised into GoldSet/GoldQuestion.

A gold set that brings its own corpus (BEIR, SQuAD, DuReader) can be written out as a folder of text
files (`export_corpus`) and indexed like any corpus; its gold references then name those files.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path

from corpusync.errors import ConfigError
from schemas.eval import GoldQuestion, GoldSet

_SAFE = re.compile(r"[^\w.\-]+", re.UNICODE)


def passage_filename(passage_id: str) -> str:
    """File name a passage gets when its gold set's corpus is exported (and that its gold refs name)."""
    return _SAFE.sub("_", passage_id).strip("._")[:180] + ".txt"


def goldset_hash(questions: Iterable[GoldQuestion]) -> str:
    """Content hash over questions and gold references (order-independent), stored with every evaluation."""
    h = hashlib.sha256()
    for q in sorted(questions, key=lambda q: q.id):
        h.update(json.dumps(q.model_dump(mode="json"), sort_keys=True, ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()


def _finish(name: str, source: Path, questions: list[GoldQuestion], passages: dict[str, str]) -> GoldSet:
    if not questions:
        raise ConfigError(f"gold set {source}: no questions found")
    seen: set[str] = set()
    for q in questions:
        if q.id in seen:
            raise ConfigError(f"gold set {source}: duplicate question id {q.id!r}")
        seen.add(q.id)
    return GoldSet(name=name, source=str(source), questions=questions, passages=passages,
                   sha256=goldset_hash(questions))


def load_corpusync_jsonl(path: Path, name: str | None = None) -> GoldSet:
    """corpusync's own format, one question per line: id, question, answers, gold_document(s), evidence,
    level (default 'document': the gold is a whole file of an ordinary corpus), lang."""
    questions = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            docs = r.get("gold_documents") or ([r["gold_document"]] if r.get("gold_document") else [])
            questions.append(GoldQuestion(
                id=str(r["id"]), question=r["question"], gold_documents=docs, answers=r.get("answers", []),
                evidence=r.get("evidence", []), level=r.get("level", "document"), lang=r.get("lang", ""),
            ))
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"gold set {path}, line {n}: {exc}") from exc
    return _finish(name or path.stem, path, questions, {})


def load_beir(folder: Path, name: str | None = None) -> GoldSet:
    """BEIR layout: corpus.jsonl (_id, title, text), queries.jsonl (_id, text[, answers]), qrels.tsv or
    qrels/test.tsv (query-id, corpus-id, score > 0 = relevant)."""
    qrels_path = next((p for p in (folder / "qrels.tsv", folder / "qrels" / "test.tsv") if p.exists()), None)
    if qrels_path is None:
        raise ConfigError(f"gold set {folder}: no qrels.tsv")
    passages: dict[str, str] = {}
    with (folder / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                title = (r.get("title") or "").replace("_", " ").strip()
                passages[str(r["_id"])] = (f"{title}\n\n" if title else "") + r["text"]
    qrels: dict[str, list[str]] = {}
    with qrels_path.open(encoding="utf-8", newline="") as f:
        for row in csv.reader(f, delimiter="\t"):
            if len(row) < 3 or row[0] == "query-id":
                continue
            if float(row[2]) > 0:
                qrels.setdefault(row[0], []).append(row[1])
    questions = []
    with (folder / "queries.jsonl").open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            gold = qrels.get(str(r["_id"]))
            if not gold or r.get("is_impossible"):
                continue
            questions.append(GoldQuestion(
                id=str(r["_id"]), question=r["text"], gold_documents=[passage_filename(g) for g in gold],
                answers=list(dict.fromkeys(r.get("answers", []))), level="passage",
            ))
    return _finish(name or folder.name, folder, questions, passages)


def load_squad(paths: list[Path], name: str) -> GoldSet:
    """SQuAD v1.1 JSON (CMRC 2018 uses it): each paragraph is a passage, gold = the question's paragraph."""
    passages: dict[str, str] = {}
    questions = []
    for path in paths:
        data = json.loads(path.read_text(encoding="utf-8"))["data"]
        for ai, article in enumerate(data):
            for pi, para in enumerate(article["paragraphs"]):
                pid = str(para.get("id") or f"{article.get('title', ai)}_{pi:03d}")
                passages[pid] = para["context"]
                for qa in para["qas"]:
                    answers = list(dict.fromkeys(a["text"] for a in qa.get("answers", []) if a["text"].strip()))
                    questions.append(GoldQuestion(
                        id=str(qa["id"]), question=qa["question"], gold_documents=[passage_filename(pid)],
                        answers=answers, level="passage",
                    ))
    return _finish(name, paths[0], questions, passages)


def load_dureader(paths: list[Path], name: str) -> GoldSet:
    """DuReader 2.0 JSON lines: corpus = every document of every question; gold = the documents marked
    is_selected, evidence = their most_related_para (the DuReader authors' best-overlap paragraph)."""
    passages: dict[str, str] = {}
    questions = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            qid = str(r["question_id"])
            gold, evidence = [], []
            for di, doc in enumerate(r["documents"]):
                pid = f"{qid}_{di}"
                passages[pid] = (doc.get("title", "").strip() + "\n\n" + "\n\n".join(doc["paragraphs"])).strip()
                if doc.get("is_selected"):
                    gold.append(passage_filename(pid))
                    mrp = doc.get("most_related_para")
                    if isinstance(mrp, int) and 0 <= mrp < len(doc["paragraphs"]):
                        evidence.append(doc["paragraphs"][mrp])
            if gold:
                questions.append(GoldQuestion(
                    id=qid, question=r["question"], gold_documents=gold, answers=r.get("answers", []),
                    evidence=evidence, level="document", lang="zh",
                ))
    return _finish(name, paths[0], questions, passages)


def load_goldset(spec: str | Path, search_dirs: Iterable[Path] = ()) -> GoldSet:
    """Load a gold set from a path (file or folder), or by folder name under one of `search_dirs`.

    Format by shape: a folder with queries.jsonl -> BEIR; a folder with SQuAD-style *.json (CMRC) -> SQuAD
    (dev first, then trial); a folder with search.*.jsonl -> DuReader (dev first); a .jsonl file ->
    corpusync's own format; a .json file -> SQuAD.
    """
    path = Path(spec)
    if not path.exists():
        for d in search_dirs:
            if (d / str(spec)).exists():
                path = d / str(spec)
                break
        else:
            where = ", ".join(str(d) for d in search_dirs) or "nowhere else"
            raise ConfigError(f"gold set {spec!r} not found (looked at the path and under {where})")
    if path.is_file():
        if path.suffix == ".jsonl":
            return load_corpusync_jsonl(path)
        return load_squad([path], path.stem)
    if (path / "queries.jsonl").exists():
        return load_beir(path)
    squad = sorted(path.glob("*dev*.json")) + sorted(path.glob("*trial*.json"))
    if squad:
        return load_squad(squad[:1], path.name)
    dureader = sorted(path.glob("search.dev*.jsonl"))
    if dureader:
        return load_dureader(dureader[:1], path.name)
    raise ConfigError(f"gold set {path}: unrecognised layout (expected BEIR, SQuAD JSON, DuReader or .jsonl)")


def sample_questions(goldset: GoldSet, limit: int | None) -> GoldSet:
    """The first `limit` questions in a fixed, content-based order (same subset on every run)."""
    if limit is None or limit >= len(goldset.questions):
        return goldset
    keyed = sorted(goldset.questions, key=lambda q: hashlib.sha256(q.id.encode()).hexdigest())[:limit]
    return goldset.model_copy(update={"questions": keyed, "sha256": goldset_hash(keyed),
                                      "name": goldset.name})


def export_corpus(goldset: GoldSet, folder: Path, *, only_gold_of: GoldSet | None = None,
                  distractors: int | None = None) -> int:
    """Write the gold set's passages as text files (names from passage_filename) into `folder`.

    With `only_gold_of`, write the gold passages of those questions plus up to `distractors` others (in a
    fixed order), for a smaller corpus that still has something to confuse retrieval with.
    """
    if not goldset.passages:
        raise ConfigError(f"gold set {goldset.name} brings no corpus to export; index its documents instead")
    folder.mkdir(parents=True, exist_ok=True)
    names = {passage_filename(pid): pid for pid in goldset.passages}
    chosen: list[str]
    if only_gold_of is None:
        chosen = list(names)
    else:
        gold = {g for q in only_gold_of.questions for g in q.gold_documents if g in names}
        rest = sorted((n for n in names if n not in gold), key=lambda n: hashlib.sha256(n.encode()).hexdigest())
        chosen = sorted(gold) + rest[: distractors or 0]
    for n in chosen:
        (folder / n).write_text(goldset.passages[names[n]], encoding="utf-8")
    return len(chosen)
