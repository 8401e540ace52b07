"""Page layout of paginated text: running headers/footers and page numbers removed (and recorded), headings
told by font size."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from corpusync.core.unicode_text import HAN

# --------------------------------------------------------------------------------------------------
# running headers / footers

_PAGE_NUMBER = re.compile(
    r"^\W*(?:(?:page|seite|p\.)\s*)?(?:\d{1,5}|[ivxlc]{1,6})(?:\s*(?:of|/|von)\s*\d{1,5})?\W*$"
    r"|^\W*第\s*[0-9０-９一二三四五六七八九十百千]+\s*页(?:\s*[,，/]?\s*共\s*[0-9０-９]+\s*页)?\W*$",
)
# Share of the page height at the top and at the bottom where running headers/footers are looked for
# (scanned book pages carry theirs up to ~11% from the edge).
MARGIN_BAND = 0.12
_POSITION_BIN = 0.025  # running lines sit at the same height on every page: compare positions in 2.5% bins

# One text block of a page: its text and, when it lies in the top/bottom margin band, its vertical centre
# as a share of the page height (None: body text).
PageBlock = tuple[str, float | None]


_EDGE_NUMBER = re.compile(r"^(\d{1,5})(?=[^\d.])|(?<=[^\d.])(\d{1,5})$")  # "12 Title", "12第一篇", "Chapter 13"


def _line_keys(line: str, pos: float, page_index: int) -> set[tuple[str, int, int | None]]:
    """What makes two margin blocks "the same running line": the same text at the same height; or, when it
    starts or ends with a number, the same rest with that number at the same offset from the page index
    (a printed page number moves with the page; "Definition 20" atop one page and "Definition 26" atop
    another do not)."""
    text = " ".join(line.lower().split())
    band = round(pos / _POSITION_BIN)

    def squeeze(t: str) -> str:
        return "".join(t.split())  # OCR spacing varies from page to page

    keys: set[tuple[str, int, int | None]] = {(squeeze(text), band, None)}
    m = _EDGE_NUMBER.search(text)
    if m:
        keys.add((squeeze(text[: m.start()] + "#" + text[m.end():]), band,
                  int(m.group(1) or m.group(2)) - page_index))
    return keys


def strip_running_lines(pages: list[list[PageBlock]]) -> tuple[list[list[str]], dict[str, int]]:
    """Remove running headers/footers and page numbers.

    `pages`: per page, its text blocks in reading order (margin-band blocks carry their position). A
    margin block is removed when it is the top- or bottom-most block of its page and reads as a page number
    ("12", "- 12 -", "Page 3 of 9", "iv", "第 3 页"), or when the same text (a leading/trailing page number
    allowed to move with the page) sits at the same height in the margin of at least 3 pages (of every page
    for documents under 6 pages). A page's only text is never removed. Returns the kept blocks per page
    and what was removed, with counts (the audit kept with the document version).
    """
    n = len(pages)
    counts = Counter(k for i, page in enumerate(pages)
                     for k in set().union(*(_line_keys(t, pos, i) for t, pos in page if pos is not None)))
    threshold = 3 if n >= 6 else max(n, 2)
    removed: Counter[str] = Counter()
    kept: list[list[str]] = []
    for i, page in enumerate(pages):
        out = []
        margins = [pos for _, pos in page if pos is not None]
        top_band = [p for p in margins if p < 0.5]
        bottom_band = [p for p in margins if p >= 0.5]
        extremes = {min(top_band, default=-1.0), max(bottom_band, default=-1.0)}
        has_body = len(page) > len(margins)  # a page that is only a "header" keeps it
        for text, pos in page:
            drop = pos is not None and has_body and (
                (pos in extremes and _PAGE_NUMBER.match(text) is not None)
                or (n >= 2 and max(counts[k] for k in _line_keys(text, pos, i)) >= threshold))
            if drop:
                removed[text if len(text) <= 120 else text[:120] + "…"] += 1
            else:
                out.append(text)
        kept.append(out)
    return kept, dict(removed.most_common())


# --------------------------------------------------------------------------------------------------
# headings

def looks_like_heading(text: str) -> bool:
    """Short, at most 3 lines, has letters, and does not read as a sentence (no sentence punctuation at the
    end or inside: a paragraph typeset large is not a heading)."""
    cjk = len(HAN.findall(text))
    return (len(text) <= (32 if cjk > len(text) / 2 else 120) and text.count("\n") <= 2
            and sum(c.isalpha() for c in text) >= 2 and not re.search(r"[。！？；;,，、:：]$|[。；！？，,]", text))


def heading_levels(body_sizes: Counter[float], block_sizes: Iterable[float], ratio: float = 1.15,
                   max_levels: int = 4) -> dict[float, int]:
    """Font sizes clearly larger than the body text's (the size covering most characters) -> heading level
    (largest = 1), at most `max_levels` distinct sizes; sizes used by too much text are not headings."""
    if not body_sizes:
        return {}
    body = body_sizes.most_common(1)[0][0]
    total = sum(body_sizes.values())
    big = sorted({round(x, 1) for x in block_sizes if x >= body * ratio and body_sizes[round(x, 1)] < 0.2 * total},
                 reverse=True)
    return {size: level for level, size in enumerate(big[:max_levels], start=1)}
