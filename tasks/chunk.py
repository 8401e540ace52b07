"""chunk: split a parsed document into token-budgeted chunks with exact character spans.

Structure first: titles, Chinese legal headings (第X编/章/节) and short decimal-numbered lines ("8.3 Scope")
open a new section and extend the breadcrumb. A heading never stands alone: it is glued to the first content
after it (a Markdown table's header row likewise to its first row). An article (第X条, or a long "8.3.4 ..."
clause) is kept whole when it fits and never shares its start with overlap; a table stays whole when it
fits, else is split between rows with its header repeated in every piece (only a row over the budget is cut
inside, at a cell border or a space). Sentences (Chinese 。！？；, English . ! ? with common abbreviations) are
packed greedily, neighbours sharing ~overlap of the budget, and a section does not end in a scrap. A chunk
under `min_tokens` then merges with a neighbour (the next of its section, else the previous, across a section
boundary only when nothing else fits) or takes sentences from one; only a document that is itself that
short makes a smaller chunk.

Every chunk carries its breadcrumb (`context`: the section path joined by " > ", less the headings its text
opens with; at most a quarter of the budget, oldest levels dropped first). `model_text` (context, then text)
is what is embedded and indexed and what the budget bounds: at most `max_tokens` tokens of the embedding
model's own tokenizer (counted as is and NFKC-normalised) and at most `max_chars` = max_tokens * 8 characters
(a long run without spaces is a single [UNK] token, so tokens alone do not bound it). Same input + same
config -> same chunks and keys.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import dataclass, replace

from corpusync.adapters.embedding import Tokenizer
from corpusync.core.unicode_text import CJK
from schemas.records import Chunk, ChunkedDocument, ParsedDocument
from tasks.chunk_cut import Crumbs, split_long, strip_spans
from tasks.chunk_pack import Piece, Plan, settle

CHUNKER_VERSION = "4"
CHARS_PER_TOKEN = 8  # the character cap of a chunk's model text: max_tokens * 8

_ABBREV = {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "no", "fig", "al",
           "inc", "ltd", "co", "corp", "u.s", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep",
           "sept", "oct", "nov", "dec", "art", "sec", "approx", "cf", "pp", "vol"}
# A sentence ends after Chinese end punctuation (full- or half-width, plus closing quotes/brackets), or after
# . ! ? followed by whitespace (English). Newlines inside a block also end a segment.
_ZH_END = re.compile(r"[。｡！？；!?][”’」』）)\]］】\"'＂＇]*")
_EN_END = re.compile(r"[.!?][\"')\]]*(?=\s)")


@dataclass(frozen=True)
class ChunkConfig:
    max_tokens: int
    overlap: float
    strategy: str = "structure"  # or "fixed": token windows blind to structure (the benchmark baseline)
    min_tokens: int = 32  # smaller chunks merge with a neighbour (at most a third of max_tokens applies)
    version: str = CHUNKER_VERSION

    @property
    def max_chars(self) -> int:
        return self.max_tokens * CHARS_PER_TOKEN

    def as_dict(self) -> dict[str, object]:
        return {"strategy": self.strategy, "max_tokens": self.max_tokens, "min_tokens": self.min_tokens,
                "max_chars": self.max_chars, "overlap": self.overlap, "version": self.version}

    @property
    def fingerprint(self) -> str:
        return f"chunk={self.strategy}:{self.version}:{self.max_tokens}:{self.overlap}:{self.min_tokens}"


def sentence_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Split text[start:end] into sentence spans (whitespace between sentences is left out)."""
    cuts: set[int] = set()
    seg = text[start:end]
    for m in _ZH_END.finditer(seg):
        cuts.add(start + m.end())
    for m in _EN_END.finditer(seg):
        word = re.search(r"([A-Za-z.]+)[.!?][\"')\]]*$", seg[max(m.start() - 64, 0): m.end()])
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
    return strip_spans(text, [start, *sorted(c for c in cuts if start < c < end), end])


def chunk_key(path: str, content_sha256: str, config: ChunkConfig, start: int, end: int) -> str:
    raw = f"{path}\x00{content_sha256}\x00{config.fingerprint}\x00{start}:{end}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


# Structure markers at the start of a line. Chinese legal structure: 编/章/节 are headings, 条 is an article
# (kept whole when it fits); decimal numbering "8.3.4" (also full-width "８．３") is a heading on a short
# line, a clause otherwise.
_CN_NUM = r"[0-9０-９一二三四五六七八九十百千零〇两]+"
_CN_HEADING = re.compile(rf"^第{_CN_NUM}([编章节])(?=\s|$|[^\w])")
_CN_ARTICLE = re.compile(rf"^第{_CN_NUM}条")
_DECIMAL = re.compile(r"^(\d{1,3}(?:[.．]\d{1,3}){1,5})[.．]?(?=\s)")
# "一、总则" / "（一）适用范围" head a part; "1、xxx" in web text is a list item, not a heading
_CN_ITEM = re.compile(r"^(?:[（(][一二三四五六七八九十]+[）)]|[一二三四五六七八九十]+、)")
_LEGAL_LEVEL = {"编": 7, "章": 8, "节": 9}
_ARTICLE_LEVEL = 10
# A Markdown delimiter row: | --- | :--: | (pipes, dashes, colons, spaces only, so escapes cannot occur)
_DELIM_ROW = re.compile(r"\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*")


def _short_heading(line: str) -> bool:
    return len(line) <= 60 and not re.search(r"[。！？；.!?;:：,，]$", line)


def classify_line(line: str) -> tuple[str, int, str] | None:
    """('heading', level, label) / ('clause', level, label) for a structural line start, else None."""
    if m := _CN_HEADING.match(line):
        return "heading", _LEGAL_LEVEL[m.group(1)], line[:60]
    if m := _CN_ARTICLE.match(line):
        return "clause", _ARTICLE_LEVEL, m.group(0)
    if (m := _DECIMAL.match(line)) and (len(re.findall("[.．]", m.group(1))) > 1 or re.match(
            rf"\s*[A-Z{CJK}]", line[m.end():])):  # "3.5 million" is a quantity, "3.5 Scope" a clause
        depth = len(re.findall("[.．]", m.group(1)))
        if _short_heading(line):
            return "heading", 7 + depth, line[:60]
        return "clause", 10 + depth, m.group(1)
    if _CN_ITEM.match(line) and _short_heading(line):
        return "heading", 9, line[:60]
    return None


def _table_pieces(text: str, bs: int, be: int, section: int, path: tuple[str, ...], unit: int) -> list[Piece]:
    """One piece per row; a Markdown header (header row + delimiter row) is a heading piece, glued to the
    first row and repeated in front of every later chunk of the table."""
    lines: list[tuple[int, int]] = []
    pos = bs
    for line in text[bs:be].split("\n"):
        if line.strip():
            lines.append((pos, pos + len(line)))
        pos += len(line) + 1
    out: list[Piece] = []
    header = ""
    if len(lines) >= 2 and "|" in text[slice(*lines[1])] and _DELIM_ROW.fullmatch(text[slice(*lines[1])]):
        header = text[lines[0][0]:lines[1][1]] + "\n"
        out.append(Piece(lines[0][0], lines[1][1], section, path, "table", unit, heading=True))
        lines = lines[2:]
    return out + [Piece(a, b, section, path, "table", unit, header=header, rest_header=header) for a, b in lines]


def _structure_pieces(doc: ParsedDocument, text: str, block_spans: list[tuple[int, int]]) -> list[Piece]:
    pieces: list[Piece] = []
    path: list[tuple[int, str]] = []
    section = unit = 0
    in_clause = False
    for block, (bs, be) in zip(doc.blocks, block_spans, strict=True):
        if block.kind == "title":
            section += 1
            in_clause = False
            level = max(block.level, 1)
            path = [p for p in path if p[0] < level] + [(level, block.text[:200])]
        if block.kind == "table":
            unit += 1
            in_clause = False
            pieces += _table_pieces(text, bs, be, section, tuple(t for _, t in path), unit)
            continue
        ctype = "ocr" if block.kind == "ocr" else "text"
        for s, e in sentence_spans(text, bs, be):
            # sentence spans never cross a newline, so a span that starts a line is (the start of) that line
            line_start = s == bs or text[s - 1] == "\n"
            kind = classify_line(text[s:e]) if line_start and block.kind != "title" else None
            heading = block.kind == "title"
            if kind is not None:
                what, level, label = kind
                heading = what == "heading"
                if heading:
                    section += 1
                    in_clause = False
                else:
                    unit += 1
                    in_clause = True
                path = [p for p in path if p[0] < level] + [(level, label)]
            pieces.append(Piece(s, e, section, tuple(t for _, t in path), ctype, unit if in_clause else 0,
                                 heading=heading))
    return pieces


def _glue(pieces: list[Piece]) -> list[Piece]:
    """Headings join the first content after them (which gives its section, path, type and unit); headings
    at the very end become one piece that later merges with a neighbour."""
    out: list[Piece] = []
    chain: list[Piece] = []
    for p in pieces:
        if p.heading:
            chain.append(p)
            continue
        if chain:
            p = replace(p, start=chain[0].start, header=chain[0].header, protect=chain[-1].end)
            chain = []
        out.append(p)
    if chain:
        out.append(replace(chain[-1], start=chain[0].start, header=chain[0].header))
    return out


def chunk_document(doc: ParsedDocument, tok: Tokenizer, config: ChunkConfig) -> ChunkedDocument:
    text, block_spans = doc.layout()
    budget = config.max_tokens
    min_t = min(config.min_tokens, budget // 3)
    crumbs = Crumbs(tok, budget, config.max_chars)

    # 1. pieces: sentences (headings glued to what follows) or table rows, carrying section, breadcrumb,
    #    type and clause unit; counted with the model's tokenizer, over-long ones cut
    if config.strategy == "fixed":
        pieces = [Piece(a, b, 0, (), "text", 0)
                  for a, b in split_long(text, 0, len(text), tok, budget - 2, config.max_chars)] if text else []
    else:
        pieces = _glue(_structure_pieces(doc, text, block_spans))
    plan = Plan(text, pieces, tok, crumbs, budget, config.max_chars)

    # 2. group into chunks; small ones merge with a neighbour
    groups = plan.pack(int(budget * config.overlap), min_t)
    if min_t > 0:
        groups = plan.merge_small(groups, min_t)

    # 3. materialise, every chunk's model text re-counted exactly and within budget
    chunks: list[Chunk] = []
    page_starts = [s for s, _ in block_spans]
    pages = [b.page for b in doc.blocks]
    for ordinal, (d, body, ctx, n) in enumerate(settle(plan, groups)):
        s, e = d.start, d.end
        first_block = max(bisect.bisect_right(page_starts, s) - 1, 0)
        last_block = max(bisect.bisect_right(page_starts, e - 1) - 1, 0)
        page_vals = [p for p in pages[first_block:last_block + 1] if p is not None]
        chunk = Chunk(
            ordinal=ordinal,
            key=chunk_key(doc.source.path, doc.source.sha256, config, s, e),
            text=body,
            text_sha256="",
            token_count=n,
            char_start=s,
            char_end=e,
            page_start=min(page_vals) if page_vals else None,
            page_end=max(page_vals) if page_vals else None,
            section_path=d.path,
            chunk_type=d.ctype,
            prefix=d.prefix,
            context=ctx,
        )
        chunks.append(replace(chunk, text_sha256=hashlib.sha256(chunk.model_text.encode()).hexdigest()))
    return ChunkedDocument(parsed=doc, chunks=chunks, char_count=len(text))
