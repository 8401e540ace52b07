"""chunk: split a parsed document into token-budgeted chunks with exact character spans.

Structure first: titles, Chinese legal headings (第X编/章/节) and short decimal-numbered lines ("8.3 Scope")
open a new section (no overlap across sections) and extend the breadcrumb; an article (第X条, or a long
"8.3.4 ..." clause) is kept whole when it fits and never shares its start with overlap; a table stays
whole when it fits, else is split by rows with its header row repeated in every piece. Then sentences
(Chinese 。！？；, English . ! ? with common abbreviations) are packed greedily up to the budget, and
neighbours share ~overlap of the budget. Token counts come from the embedding model's own
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

CHUNKER_VERSION = "3"

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
    strategy: str = "structure"  # or "fixed": token windows blind to structure (the benchmark baseline)
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


# Structure markers at the start of a line. Chinese legal structure: 编/章/节 are headings, 条 is an article
# (kept whole when it fits); decimal numbering "8.3.4" is a heading on a short line, a clause otherwise.
_CN_NUM = r"[0-9０-９一二三四五六七八九十百千零〇两]+"
_CN_HEADING = re.compile(rf"^第{_CN_NUM}([编章节])(?=\s|$|[^\w])")
_CN_ARTICLE = re.compile(rf"^第{_CN_NUM}条")
_DECIMAL = re.compile(r"^(\d{1,3}(?:\.\d{1,3}){1,5})\.?(?=\s)")
# "一、总则" / "（一）适用范围" head a part; "1、xxx" in web text is a list item, not a heading
_CN_ITEM = re.compile(r"^(?:[（(][一二三四五六七八九十]+[）)]|[一二三四五六七八九十]+、)")
_LEGAL_LEVEL = {"编": 7, "章": 8, "节": 9}
_ARTICLE_LEVEL = 10


def _short_heading(line: str) -> bool:
    return len(line) <= 60 and not re.search(r"[。！？；.!?;:：,，]$", line)


def classify_line(line: str) -> tuple[str, int, str] | None:
    """('heading', level, label) / ('clause', level, label) for a structural line start, else None."""
    if m := _CN_HEADING.match(line):
        return "heading", _LEGAL_LEVEL[m.group(1)], line[:60]
    if m := _CN_ARTICLE.match(line):
        return "clause", _ARTICLE_LEVEL, m.group(0)
    if (m := _DECIMAL.match(line)) and (m.group(1).count(".") > 1 or re.match(
            r"\s*[A-Z\u4e00-\u9fff]", line[m.end():])):  # "3.5 million" is a quantity, "3.5 Scope" a clause
        depth = m.group(1).count(".")
        if _short_heading(line):
            return "heading", 7 + depth, line[:60]
        return "clause", 10 + depth, m.group(1)
    if _CN_ITEM.match(line) and _short_heading(line):
        return "heading", 9, line[:60]
    return None


@dataclass
class _Piece:
    start: int
    end: int
    section: int
    path: tuple[str, ...]
    ctype: str
    unit: int  # pieces of one clause (or one table piece) share a unit; 0 = free text
    tokens: int = -1
    prefix: str = ""


def _table_pieces(text: str, bs: int, be: int, tok: Tokenizer, budget: int, section: int,
                  path: tuple[str, ...], unit: int) -> list[_Piece]:
    """A Markdown table whole when it fits; otherwise groups of rows, each with the header repeated."""
    lines: list[tuple[int, int]] = []
    pos = bs
    for line in text[bs:be].split("\n"):
        lines.append((pos, pos + len(line)))
        pos += len(line) + 1
    whole = tok.count_tokens([text[bs:be]])[0]
    has_header = len(lines) > 2 and re.fullmatch(r"\|?(\s*:?-+:?\s*\|)+\s*:?-*:?\s*\|?", text[slice(*lines[1])])
    if whole <= budget or not has_header:
        return [_Piece(bs, be, section, path, "table", unit)]
    header = text[lines[0][0]:lines[1][1]] + "\n"
    head_tokens = tok.count_tokens([header])[0] - 2
    rows = lines[2:]
    counts = tok.count_tokens([text[a:b] for a, b in rows])
    out: list[_Piece] = []
    group: list[int] = []
    used = head_tokens
    def emit(group: list[int]) -> None:
        # the first piece spans the header itself; the others repeat it as a prefix
        first = not out
        out.append(_Piece(bs if first else rows[group[0]][0], rows[group[-1]][1], section, path, "table",
                          unit + len(out), prefix="" if first else header))

    for i, n in enumerate(counts):
        n -= 2
        if group and used + n + 3 > budget:
            emit(group)
            group, used = [], head_tokens
        group.append(i)
        used += n + 1
    if group:
        emit(group)
    return out


def _structure_pieces(doc: ParsedDocument, text: str, block_spans: list[tuple[int, int]], tok: Tokenizer,
                      budget: int) -> list[_Piece]:
    pieces: list[_Piece] = []
    path: list[tuple[int, str]] = []
    section = 0
    unit = 0
    in_clause = False
    for block, (bs, be) in zip(doc.blocks, block_spans, strict=True):
        if block.kind == "title":
            section += 1
            in_clause = False
            level = max(block.level, 1)
            path = [p for p in path if p[0] < level] + [(level, block.text[:200])]
        if block.kind == "table":
            unit += 1000
            in_clause = False
            pieces += _table_pieces(text, bs, be, tok, budget, section, tuple(t for _, t in path), unit)
            continue
        ctype = "ocr" if block.kind == "ocr" else "text"
        for s, e in sentence_spans(text, bs, be):
            # sentence spans never cross a newline, so a span that starts a line is (the start of) that line
            line_start = s == bs or text[s - 1] == "\n"
            kind = classify_line(text[s:e]) if line_start and block.kind != "title" else None
            if kind is not None:
                what, level, label = kind
                if what == "heading":
                    section += 1
                    in_clause = False
                else:
                    unit += 1
                    in_clause = True
                path = [p for p in path if p[0] < level] + [(level, label)]
            pieces.append(_Piece(s, e, section, tuple(t for _, t in path), ctype, unit if in_clause else 0))
    return pieces


def _fixed_pieces(text: str, tok: Tokenizer, budget: int) -> list[_Piece]:
    """Baseline: fixed windows of the token budget over the whole text, blind to structure."""
    return [_Piece(a, b, 0, (), "text", 0) for a, b in _split_long(text, (0, len(text)), tok, budget)] if text else []


def _pack(pieces: list[_Piece], budget: int, overlap_budget: int) -> list[list[int]]:
    """Group pieces into chunks: a clause (unit) that fits stays whole and is never split by overlap;
    free text is packed greedily with overlap; nothing crosses a section or a chunk-type change."""
    runs: list[list[int]] = []  # consecutive pieces of the same section / type / unit
    for i, p in enumerate(pieces):
        prev = pieces[runs[-1][-1]] if runs else None
        if prev is not None and (prev.section, prev.ctype, prev.unit) == (p.section, p.ctype, p.unit) \
                and p.ctype != "table":
            runs[-1].append(i)
        else:
            runs.append([i])
    groups: list[list[int]] = []
    whole: list[bool] = []  # the group is a complete run (mergeable with its neighbours)
    for run in runs:
        total = sum(pieces[i].tokens for i in run) + len(run) + 1
        if total <= budget:
            groups.append(list(run))
            whole.append(True)
            continue
        i = 0
        while i < len(run):
            group = [run[i]]
            used = pieces[run[i]].tokens
            j = i + 1
            while j < len(run) and used + pieces[run[j]].tokens + 2 <= budget:
                group.append(run[j])
                used += pieces[run[j]].tokens + 1
                j += 1
            groups.append(group)
            whole.append(False)
            if j >= len(run) or overlap_budget == 0:
                i = j
                continue
            back, carried = j, 0
            while back - 1 > i and carried + pieces[run[back - 1]].tokens <= overlap_budget:
                back -= 1
                carried += pieces[run[back]].tokens
            i = back if back < j else j
    # merge neighbouring complete runs (small clauses, short paragraphs) of one section while they fit
    merged: list[list[int]] = []
    merged_whole: list[bool] = []
    for g, w in zip(groups, whole, strict=True):
        if merged and w and merged_whole[-1]:
            a, b = pieces[merged[-1][0]], pieces[g[0]]
            size = sum(pieces[i].tokens + 1 for i in merged[-1] + g) + 1
            if a.section == b.section and a.ctype == b.ctype != "table" and size <= budget:
                merged[-1] = merged[-1] + g
                continue
        merged.append(g)
        merged_whole.append(w)
    return merged


def chunk_document(doc: ParsedDocument, tok: Tokenizer, config: ChunkConfig) -> ChunkedDocument:
    text, block_spans = doc.layout()
    budget = config.max_tokens
    overlap_budget = int(budget * config.overlap)

    # 1. pieces: sentences (or table row groups) carrying section, breadcrumb, type and clause unit
    if config.strategy == "fixed":
        pieces = _fixed_pieces(text, tok, budget)
    else:
        pieces = _structure_pieces(doc, text, block_spans, tok, budget)

    # 2. token counts with the model's tokenizer; over-long sentences cut at token boundaries
    counts = tok.count_tokens([p.prefix + text[p.start:p.end] for p in pieces])
    split: list[_Piece] = []
    for p, n in zip(pieces, counts, strict=True):
        if n <= budget or p.prefix:
            p.tokens = n - 2
            split.append(p)
        else:
            split += [_Piece(a, b, p.section, p.path, p.ctype, p.unit) for a, b in _split_long(text, (p.start, p.end),
                                                                                                tok, budget)]
    unknown = [p for p in split if p.tokens < 0]
    for p, n in zip(unknown, tok.count_tokens([text[p.start:p.end] for p in unknown]), strict=True):
        p.tokens = n - 2
    pieces = split

    # 3. group into chunks
    groups = _pack(pieces, budget, overlap_budget)

    # 4. materialise; the exact chunk text is re-counted, and a group that came out over budget (joining
    #    changed the count) is halved until it fits, so nothing is dropped
    def body(g: list[int]) -> str:
        return pieces[g[0]].prefix + text[pieces[g[0]].start:pieces[g[-1]].end]

    todo = list(groups)
    final: list[tuple[list[int], int]] = []
    while todo:
        counts = tok.count_tokens([body(g) for g in todo])
        nxt: list[list[int]] = []
        for g, n in zip(todo, counts, strict=True):
            if n > budget and len(g) > 1:
                nxt += [g[: len(g) // 2], g[len(g) // 2:]]
            else:
                final.append((g, n))
        todo = nxt
    final.sort(key=lambda x: (pieces[x[0][0]].start, pieces[x[0][-1]].end))
    chunks: list[Chunk] = []
    page_starts = [s for s, _ in block_spans]
    pages = [b.page for b in doc.blocks]
    for ordinal, (group, n) in enumerate(final):
        first, last = pieces[group[0]], pieces[group[-1]]
        s, e = first.start, last.end
        content = body(group)
        first_block = max(bisect.bisect_right(page_starts, s) - 1, 0)
        last_block = max(bisect.bisect_right(page_starts, e - 1) - 1, 0)
        page_vals = [p for p in pages[first_block:last_block + 1] if p is not None]
        chunks.append(
            Chunk(
                ordinal=ordinal,
                key=chunk_key(doc.source.path, doc.source.sha256, config, s, e),
                text=content,
                text_sha256=hashlib.sha256(content.encode()).hexdigest(),
                token_count=n,
                char_start=s,
                char_end=e,
                page_start=min(page_vals) if page_vals else None,
                page_end=max(page_vals) if page_vals else None,
                section_path=first.path,
                chunk_type=first.ctype,
                prefix=first.prefix,
            )
        )
    return ChunkedDocument(parsed=doc, chunks=chunks, char_count=len(text))
