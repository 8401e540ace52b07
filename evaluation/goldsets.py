"""Gold sets as the rest of corpusync uses them: find one by path or name (`resolve_goldset`), name and key it
(`goldset_name`, `goldset_key`, `goldset_identity`), load it whatever its format (`load_goldset`, which
picks a reader of evaluation.goldset_formats by the path's shape), take a fixed subset of its questions
(`sample_questions`) and write the corpus it brings out as a folder of text files (`export_corpus`), which
is then indexed like any corpus; its gold references name those files.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from corpusync.core.errors import ConfigError
from evaluation.goldset_formats import (
    FORMATS,
    goldset_hash,
    load_beir,
    load_corpusync_jsonl,
    load_dureader,
    load_squad,
    passage_filename,
)
from schemas.eval import GoldSet


def resolve_goldset(spec: str | Path, search_dirs: Iterable[Path] = ()) -> Path:
    """The path a gold-set spec names: the path itself, or a folder/file of that name under `search_dirs`."""
    path = Path(spec)
    if path.exists():
        return path
    for d in search_dirs:
        if (d / str(spec)).exists():
            return d / str(spec)
    where = ", ".join(str(d) for d in search_dirs) or "nowhere else"
    raise ConfigError(f"gold set {spec!r} not found (looked at the path and under {where})")


def goldset_name(path: Path) -> str:
    """A gold set's readable name: its file's stem or its folder's name (what reports and JSON show)."""
    return path.stem if path.is_file() else path.name


def goldset_key(path: Path, name: str | None = None) -> str:
    """A gold set's stable identity: its name plus the first 8 hex digits of the sha256 of its absolute,
    normalised path (symlinks not resolved, so a deployment behind a moving symlink keeps its key). Two gold
    sets named alike in different folders (a/gold.jsonl, b/gold.jsonl) get different keys."""
    where = os.path.normpath(path.absolute()).replace(os.sep, "/")
    return f"{name or goldset_name(path)}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"


def goldset_identity(spec: str | Path, search_dirs: Iterable[Path] = ()) -> tuple[str, str]:
    """(name, key) of a spec without reading the gold set (ConfigError when it is not found)."""
    path = resolve_goldset(spec, search_dirs)
    return goldset_name(path), goldset_key(path)


def load_goldset(spec: str | Path, search_dirs: Iterable[Path] = ()) -> GoldSet:
    """Load a gold set from a path (file or folder), or by folder name under one of `search_dirs`; its `key`
    is `goldset_key` of that path.

    Format by shape: a folder with queries.jsonl -> BEIR; a folder with SQuAD-style *.json (CMRC) -> SQuAD
    (dev first, then trial); a folder with search.*.jsonl -> DuReader (dev first); a .jsonl file ->
    corpusync's own format; a .json file -> SQuAD.
    """
    path = resolve_goldset(spec, search_dirs)
    gs = _load(path)
    gs.key = goldset_key(path, gs.name)
    return gs


def _load(path: Path) -> GoldSet:
    name = goldset_name(path)
    if path.is_file():
        if path.suffix == ".jsonl":
            if re.match(r"search\..*\.jsonl$", path.name):
                return load_dureader([path], name)
            return load_corpusync_jsonl(path, name)
        return load_squad([path], name)
    if (path / "queries.jsonl").exists():
        return load_beir(path, name)
    squad = sorted(path.glob("*dev*.json")) + sorted(path.glob("*trial*.json"))
    if squad:
        return load_squad(squad[:1], name)
    dureader = sorted(path.glob("search.dev*.jsonl"))
    if dureader:
        return load_dureader(dureader[:1], name)
    raise ConfigError(f"gold set {path}: unrecognised layout (expected {FORMATS})")


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
