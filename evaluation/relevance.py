"""Which chunks of a generation answer a gold question — decided on text, not chunk ids, so a gold set
stays valid when documents are re-chunked, re-parsed or re-embedded.

A chunk is relevant to a question when its document matches a gold reference and
- level 'passage': always (the gold document is the gold passage);
- level 'document': it overlaps a gold evidence passage (half of the chunk's or of the evidence's
  character 8-grams shared), or, without evidence, contains a reference answer (normalised text).
When a gold document is present but no chunk of it passes that test (an answer cut by a chunk boundary,
a free-form answer), every chunk of the document counts, and the question is reported as a fallback.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import PurePosixPath

from schemas.eval import GoldQuestion

_NGRAM = 8
_OVERLAP = 0.5


def normalise(text: str) -> str:
    """NFKC, lower case, no whitespace (Chinese line joins and English re-wrapping compare equal)."""
    return "".join(unicodedata.normalize("NFKC", text).lower().split())


def _stem(path: str) -> str:
    p = PurePosixPath(path)
    return str(p.with_suffix("")) if p.suffix else path


def doc_matches(ref: str, path: str) -> bool:
    """A gold reference names a document by path, by path without extension, or by trailing segments."""
    if ref == path:
        return True
    r, p = _stem(ref), _stem(path)
    return r == p or p.endswith("/" + r) or path.endswith("/" + ref)


@lru_cache(maxsize=4096)
def _grams(text: str) -> frozenset[str]:
    t = normalise(text)
    if len(t) < _NGRAM:
        return frozenset([t]) if t else frozenset()
    return frozenset(t[i:i + _NGRAM] for i in range(len(t) - _NGRAM + 1))


def overlaps(chunk_text: str, evidence: str) -> bool:
    a, b = _grams(chunk_text), _grams(evidence)
    if not a or not b:
        return False
    shared = len(a & b)
    return shared >= _OVERLAP * len(a) or shared >= _OVERLAP * len(b)


@dataclass(frozen=True)
class ChunkRef:
    chunk_id: int
    path: str
    text: str


@dataclass
class Relevance:
    units: list[set[int]]          # one set of relevant chunk ids per gold document found or not
    fallback: bool                 # some gold document needed the whole-document fallback

    @property
    def relevant(self) -> set[int]:
        return set().union(*self.units) if self.units else set()


def resolve_documents(refs: Iterable[str], paths: Iterable[str]) -> dict[str, list[str]]:
    """Gold reference -> indexed document paths it names."""
    by_stem: dict[str, list[str]] = {}
    all_paths = list(paths)
    for p in all_paths:
        by_stem.setdefault(_stem(p), []).append(p)
        by_stem.setdefault(_stem(PurePosixPath(p).name), []).append(p)
    out: dict[str, list[str]] = {}
    for ref in refs:
        cands = by_stem.get(_stem(ref), []) + by_stem.get(_stem(PurePosixPath(ref).name), [])
        out[ref] = sorted({p for p in cands if doc_matches(ref, p)})
    return out


def relevant_chunks(q: GoldQuestion, docs: Mapping[str, list[str]],
                    chunks_by_path: Mapping[str, Sequence[ChunkRef]]) -> Relevance:
    """The relevant chunk ids of question `q`, grouped by gold document (a missing document: empty set)."""
    answers = [a for a in (normalise(a) for a in q.answers) if a]
    units: list[set[int]] = []
    fallback = False
    for ref in q.gold_documents:
        chunks = [c for p in docs.get(ref, []) for c in chunks_by_path.get(p, ())]
        if q.level == "passage" or not chunks:
            units.append({c.chunk_id for c in chunks})
            continue
        if q.evidence:
            hit = {c.chunk_id for c in chunks if any(overlaps(c.text, e) for e in q.evidence)}
        else:
            hit = {c.chunk_id for c in chunks if any(a in normalise(c.text) for a in answers)}
        if not hit:
            fallback = True
            hit = {c.chunk_id for c in chunks}
        units.append(hit)
    return Relevance(units, fallback)
