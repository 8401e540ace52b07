"""Which chunks of a generation answer a gold question — decided on text, not chunk ids, so a gold set
stays valid when documents are re-chunked, re-parsed or re-embedded.

A question's gold is a list of *units* (Recall counts units); a unit is a list of alternative documents,
any one of which answers (the same article in two versions of a law), each optionally narrowed to pages.
A chunk is relevant to a unit when its document matches one of the unit's gold references and
- the reference lists pages: the chunk's page span (page_start..page_end) covers one of them;
- else level 'passage': always (the gold document is the gold passage);
- else level 'document': it overlaps a gold evidence passage (half of the chunk's or of the evidence's
  character 8-grams shared), or, without evidence, contains a reference answer (normalised text).
When gold pages are given but no chunk of that document carries page numbers (a Markdown file, an old
index), the text rules above decide instead and the question is reported as a fallback. When some
alternative of a unit is present but no chunk of any alternative passes its test (an answer cut by a chunk
boundary, a free-form answer, a page beyond the document), every chunk of the present alternatives counts,
and the question is reported as a fallback. A unit none of whose alternatives is in the generation is an
empty unit: a miss.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import PurePosixPath

from schemas.eval import ChunkRef, GoldQuestion, GoldRef

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


@dataclass
class Relevance:
    units: list[set[int]]          # one set of relevant chunk ids per gold unit (all its alternatives), found or not
    fallback: bool                 # some unit needed a fallback (whole document, or gold pages not checkable)
    alternatives: list[list[set[int]]] = field(default_factory=list)  # per unit, per alternative

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


def follow_renames(docs: Mapping[str, list[str]], renames: Sequence[tuple[str, str]],
                   present: Collection[str]) -> dict[str, list[str]]:
    """The references that name no document of a generation, followed through the renames of its lineage
    (old path, new path; oldest first): reference -> the paths of the generation its document moved to. A
    rename of a renamed document is followed on, a rename that happened before the document got there is
    not. A reference that names a document of its own is not followed: the path is a document's identity."""
    by_old: dict[str, list[tuple[int, str]]] = {}
    for i, (old, new) in enumerate(renames):
        by_old.setdefault(old, []).append((i, new))
    missing = [ref for ref, paths in docs.items() if not paths]
    out: dict[str, list[str]] = {}
    for ref, starts in resolve_documents(missing, by_old).items():
        reached: set[str] = set()
        todo = [(path, -1) for path in starts]
        taken: set[int] = set()  # the renames followed (by their index)
        while todo:
            path, after = todo.pop()
            for i, new in by_old.get(path, ()):
                if i > after and i not in taken:
                    taken.add(i)
                    reached.add(new)
                    todo.append((new, i))
        found = sorted(reached.intersection(present))
        if found:
            out[ref] = found
    return out


def _passing(q: GoldQuestion, ref: GoldRef, chunks: Sequence[ChunkRef], answers: Sequence[str],
             ) -> tuple[set[int], bool]:
    """The chunks of one gold reference that pass its test, and whether its gold pages could not be checked."""
    if ref.pages and any(c.page_start is not None for c in chunks):
        return {c.chunk_id for c in chunks if c.covers(ref.pages)}, False
    unchecked_pages = bool(ref.pages)
    if q.level == "passage":
        return {c.chunk_id for c in chunks}, unchecked_pages
    if q.evidence:
        return {c.chunk_id for c in chunks if any(overlaps(c.text, e) for e in q.evidence)}, unchecked_pages
    return {c.chunk_id for c in chunks if any(a in normalise(c.text) for a in answers)}, unchecked_pages


def relevant_chunks(q: GoldQuestion, docs: Mapping[str, list[str]],
                    chunks_by_path: Mapping[str, Sequence[ChunkRef]]) -> Relevance:
    """The relevant chunk ids of question `q`, grouped by gold unit (a unit none of whose documents is
    present: an empty set), and per alternative within each unit."""
    answers = [a for a in (normalise(a) for a in q.answers) if a]
    units: list[set[int]] = []
    alternatives: list[list[set[int]]] = []
    fallback = False
    for unit in q.units:
        present: list[list[ChunkRef]] = []
        alts: list[set[int]] = []
        for ref in unit:
            chunks = list(dict.fromkeys(c for p in docs.get(ref.document, []) for c in chunks_by_path.get(p, ())))
            present.append(chunks)
            if not chunks:
                alts.append(set())
                continue
            hit, unchecked = _passing(q, ref, chunks, answers)
            fallback |= unchecked
            alts.append(hit)
        if not any(alts) and any(present):
            fallback = True
            alts = [{c.chunk_id for c in chunks} for chunks in present]
        alternatives.append(alts)
        units.append(set().union(*alts))
    return Relevance(units, fallback, alternatives)
