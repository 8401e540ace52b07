"""chunk: split a parsed document into token-budgeted chunks with exact character spans.

Titles open a new section (no overlap across sections) and extend the section path; inside a section,
sentences (Chinese 。！？；, English . ! ? with common abbreviations) are packed greedily up to the
budget, and neighbours share ~overlap of the budget. Token counts come from the embedding model's own
tokenizer and every chunk is re-counted, so no chunk exceeds the budget. Same input + same config ->
same chunks and keys.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import dataclass

from corpusync.embedders import Tokenizer
from schemas.records import Chunk, ChunkedDocument, ParsedDocument

CHUNKER_VERSION = "1"

_ABBREV = {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "no", "fig", "al",
           "inc", "ltd", "co", "corp", "u.s", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep",
           "sept", "oct", "nov", "dec", "art", "sec", "approx", "cf", "pp", "vol"}
# A sentence ends after Chinese end punctuation (plus closing quotes/brackets), or after . ! ? followed
# by whitespace (English). Newlines inside a block also end a segment.
_ZH_END = re.compile(r"[。！？；!?][”’」』）)\]】\"']*")
_EN_END = re.compile(r"[.!?][\"')\]]*(?=\s)")


@dataclass(frozen=True)
class ChunkConfig:
    max_tokens: int
    overlap: float
    strategy: str = "sentence"
    version: str = CHUNKER_VERSION

    def as_dict(self) -> dict[str, object]:
        return {"strategy": self.strategy, "max_tokens": self.max_tokens, "overlap": self.overlap,
                "version": self.version}

    @property
    def fingerprint(self) -> str:
        return f"chunk={self.strategy}:{self.version}:{self.max_tokens}:{self.overlap}"


def sentence_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Split text[start:end] into sentence spans (whitespace between sentences is left out)."""
    cuts: set[int] = set()
    seg = text[start:end]
    for m in _ZH_END.finditer(seg):
        cuts.add(start + m.end())
    for m in _EN_END.finditer(seg):
        word = re.search(r"([A-Za-z.]+)[.!?][\"')\]]*$", seg[: m.end()])
        if word and m.group(0)[0] == "." and (
            word.group(1).lower().rstrip(".") in _ABBREV or len(word.group(1)) == 1
        ):
            continue  # "Dr." / "e.g." / an initial: not a sentence end
        if m.group(0)[0] == "." and m.start() > 0 and seg[m.start() - 1].isdigit() and (
            m.end() < len(seg) and seg[m.end():m.end() + 2].strip()[:1].isdigit()
        ):
            continue
        cuts.add(start + m.end())
    for m in re.finditer(r"\n", seg):
        cuts.add(start + m.start())
    spans: list[tuple[int, int]] = []
    pos = start
    for cut in [*sorted(cuts), end]:
        if cut <= pos:
            continue
        s, e = pos, cut
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if e > s:
            spans.append((s, e))
        pos = cut
    return spans


def _split_long(text: str, span: tuple[int, int], tok: Tokenizer, budget: int) -> list[tuple[int, int]]:
    """Cut one over-long sentence at token boundaries (preferring whitespace) into pieces under budget."""
    s, e = span
    offsets = tok.token_offsets(text[s:e])
    room = max(budget - 2, 1)  # special tokens
    pieces: list[tuple[int, int]] = []
    i = 0
    while i < len(offsets):
        j = min(i + room, len(offsets))
        if j < len(offsets):
            # back off to a token that starts after whitespace, if one is near
            for k in range(j, max(i + room // 2, i + 1), -1):
                if offsets[k][0] > 0 and text[s + offsets[k][0] - 1].isspace():
                    j = k
                    break
        a = s + offsets[i][0]
        b = s + (offsets[j][0] if j < len(offsets) else e - s)
        while b > a and text[b - 1].isspace():
            b -= 1
        if b > a:
            pieces.append((a, b))
        i = j
    return pieces or [span]


def chunk_key(path: str, content_sha256: str, config: ChunkConfig, start: int, end: int) -> str:
    raw = f"{path}\x00{content_sha256}\x00{config.fingerprint}\x00{start}:{end}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def chunk_document(doc: ParsedDocument, tok: Tokenizer, config: ChunkConfig) -> ChunkedDocument:
    text, block_spans = doc.layout()
    budget = config.max_tokens
    overlap_budget = int(budget * config.overlap)

    # 1. sections: runs of blocks between titles; each title starts a section and names it.
    units: list[tuple[int, list[tuple[int, int]], tuple[str, ...], str]] = []  # (section, spans, path, type)
    path: list[tuple[int, str]] = []
    section = 0
    for block, (bs, be) in zip(doc.blocks, block_spans, strict=True):
        if block.kind == "title":
            section += 1
            level = max(block.level, 1)
            path = [p for p in path if p[0] < level] + [(level, block.text[:200])]
        spans = [(bs, be)] if block.kind == "table" else sentence_spans(text, bs, be)
        kind = block.kind if block.kind in ("table", "ocr") else "text"
        units.append((section, spans, tuple(t for _, t in path), kind))

    # 2. sentences with token counts (one tokenizer call for the whole document).
    sents: list[tuple[int, int, int, tuple[str, ...], str]] = []  # start, end, section, path, type
    for section_id, spans, sec_path, ctype in units:
        for span in spans:
            sents.append((span[0], span[1], section_id, sec_path, ctype))
    counts = tok.count_tokens([text[s:e] for s, e, *_ in sents])
    pieces: list[tuple[int, int, int, tuple[str, ...], str, int]] = []
    for (s, e, sec, sp, ct), n in zip(sents, counts, strict=True):
        if n <= budget:
            pieces.append((s, e, sec, sp, ct, n - 2))
        else:
            for a, b in _split_long(text, (s, e), tok, budget):
                pieces.append((a, b, sec, sp, ct, -1))
    unknown = [i for i, p in enumerate(pieces) if p[5] < 0]
    if unknown:
        recount = tok.count_tokens([text[pieces[i][0]:pieces[i][1]] for i in unknown])
        for i, n in zip(unknown, recount, strict=True):
            p = pieces[i]
            pieces[i] = (p[0], p[1], p[2], p[3], p[4], n - 2)

    # 3. greedy packing within a section, with overlap carried from the previous chunk.
    groups: list[list[int]] = []
    i = 0
    while i < len(pieces):
        group = [i]
        used = pieces[i][5]
        j = i + 1
        while j < len(pieces) and pieces[j][2] == pieces[i][2] and pieces[j][4] == pieces[i][4]:
            if used + pieces[j][5] + 2 > budget:
                break
            group.append(j)
            used += pieces[j][5]
            j += 1
        groups.append(group)
        if j >= len(pieces) or pieces[j][2] != pieces[i][2] or overlap_budget == 0:
            i = j
            continue
        # next chunk starts with the tail of this one (<= overlap budget), but always makes progress
        back = j
        carried = 0
        while back - 1 > group[0] and carried + pieces[back - 1][5] <= overlap_budget:
            back -= 1
            carried += pieces[back][5]
        i = back if back < j else j

    # 4. materialise; re-count exact chunk text and shrink if joining changed the count.
    chunks: list[Chunk] = []
    page_starts = [s for s, _ in block_spans]
    pages = [b.page for b in doc.blocks]
    texts = [text[pieces[g[0]][0]:pieces[g[-1]][1]] for g in groups]
    exact = tok.count_tokens(texts)
    fixed: list[tuple[list[int], int]] = []
    for group, n in zip(groups, exact, strict=True):
        while n > budget and len(group) > 1:
            group = group[:-1]
            n = tok.count_tokens([text[pieces[group[0]][0]:pieces[group[-1]][1]]])[0]
        fixed.append((group, n))
    for ordinal, (group, n) in enumerate(fixed):
        s, e = pieces[group[0]][0], pieces[group[-1]][1]
        body = text[s:e]
        first_block = max(bisect.bisect_right(page_starts, s) - 1, 0)
        last_block = max(bisect.bisect_right(page_starts, e - 1) - 1, 0)
        page_vals = [p for p in pages[first_block:last_block + 1] if p is not None]
        chunks.append(
            Chunk(
                ordinal=ordinal,
                key=chunk_key(doc.source.path, doc.source.sha256, config, s, e),
                text=body,
                text_sha256=hashlib.sha256(body.encode()).hexdigest(),
                token_count=n,
                char_start=s,
                char_end=e,
                page_start=min(page_vals) if page_vals else None,
                page_end=max(page_vals) if page_vals else None,
                section_path=pieces[group[0]][3],
                chunk_type=pieces[group[0]][4],
            )
        )
    return ChunkedDocument(parsed=doc, chunks=chunks, char_count=len(text))

