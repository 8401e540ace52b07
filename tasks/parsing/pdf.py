"""PDFs through PyMuPDF page by page (exact page numbers, headings by font size, optional tables); a page
without a usable text layer (none, garbage, spaced out, one big scan) is rendered and OCRed, a blank one is
not. PyMuPDF errors become 'oversized', 'out-of-memory' or 'corrupt' by cause."""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from typing import Any

import msgspec

from corpusync.core.errors import ConfigError, OcrError, ParseError
from schemas.records import Block, BlockKind, ParsedDocument, ParseOptions, SourceFile
from tasks.parsing import ocr
from tasks.parsing.common import _version, clean_text
from tasks.parsing.layout import MARGIN_BAND, PageBlock, heading_levels, looks_like_heading, strip_running_lines
from tasks.parsing.limits import _render_dpi, too_long

# --------------------------------------------------------------------------------------------------
# when a PDF page needs OCR

# garbage: U+FFFD, private-use glyphs, and unmapped "(cid:N)" codes (counted apart: a lone character class
# is the regular expression engine's fast scan)
_GARBAGE_CHAR = re.compile("[\ufffd\ue000-\uf8ff]")
_CID = re.compile(r"\(cid:\d+\)")


def _garbage(text: str) -> int:
    """The characters of the text that are garbage: an unmapped "(cid:N)" code counts all its characters (a
    line of them is all garbage, not one character in eight)."""
    return (0 if text.isascii() else len(_GARBAGE_CHAR.findall(text))) + (
        sum(map(len, _CID.findall(text))) if "(cid:" in text else 0)


def ocr_reason(text: str, image_cover: float, invisible_share: float) -> str | None:
    """Why a page's text layer cannot be trusted, or None when it can.

    - no-text: (almost) no characters;
    - garbage: mostly replacement characters, private-use glyphs or unmapped (cid:N) codes;
    - spaced-out: a text layer of single characters separated by spaces ("T h e  c a t");
    - scanned-image: the page is one big image and its text, if any, is an invisible OCR layer someone
      else made (re-OCR with a better model).
    """
    tokens = text.split()
    chars = "".join(tokens)  # the non-whitespace characters (str.split's whitespace is str.isspace's)
    if len(chars) < 20 and (image_cover > 0.3 or not chars):
        return "no-text"
    if chars and _garbage(text) > 0.2 * len(chars):
        return "garbage"
    if (len(tokens) >= 30 and list(map(len, tokens)).count(1) > 0.6 * len(tokens)  # cheap bound first
            and sum(1 for t in tokens if len(t) == 1 and t.isalpha() and t.isascii()) > 0.6 * len(tokens)):
        return "spaced-out"
    if image_cover >= 0.8 and invisible_share >= 0.5:
        return "scanned-image"
    return None


def _image_cover(rect: Any, images: list[_Box]) -> float:
    """Share of the page its images cover (overlaps counted twice, at most 1), from the image blocks of the
    page's JSON (bboxes in 1/_JSON_SCALE pt)."""
    area = rect.width * rect.height or 1.0
    total = 0.0
    for b in images:
        x0, y0 = b.x / _JSON_SCALE, b.y / _JSON_SCALE
        x1, y1 = x0 + b.w / _JSON_SCALE, y0 + b.h / _JSON_SCALE
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


_REASON_WORDS = {"no-text": "without text", "garbage": "garbage", "spaced-out": "spaced out",
                 "scanned-image": "scanned"}  # ocr_reason's reasons in an error message


def _layer_kept(reason: str, text: str) -> bool:
    """Whether a page's untrusted text layer is indexed when OCR cannot replace it (off, past its cap, or it
    read nothing): another OCR's invisible layer over a scan, and a few characters over an image (too few
    to trust over what OCR would read, better than nothing: pdf.js's scan-bad.pdf keeps its "pdf.js").
    Glyph soup and spaced-out letters are not."""
    return reason == "scanned-image" or (reason == "no-text" and bool(text.strip()))


BLANK_MAX_ITEMS = 16  # path segments a page without text or images may draw and still be blank (a frame, rules)


def _is_blank(page: Any) -> bool:
    """Nothing to OCR on a page without a text layer: no text operator, image or shading, and at most a few
    vector segments (outlined text takes several curve segments per glyph, so it is never this sparse)."""
    paths = False
    for kind, _ in page.get_bboxlog():
        if "path" not in kind:
            return False
        paths = True
    return not paths or sum(len(d["items"]) for d in page.get_drawings()) <= BLANK_MAX_ITEMS


def _mupdf_error(path: str, exc: Exception, what: str) -> ParseError:
    """A PyMuPDF exception by cause: past a MuPDF limit -> oversized, out of memory -> out-of-memory, else the
    file is damaged -> corrupt."""
    name, msg = type(exc).__name__, str(exc)
    if name == "FzErrorLimit":
        return ParseError(path, "oversized", f"{what}: past a MuPDF limit: {msg}")
    if name == "FzErrorSystem" and re.search(r"(?i)memory|alloc", msg):
        return ParseError(path, "out-of-memory", f"{what}: {msg}")
    return ParseError(path, "corrupt", f"{what}: {msg}")


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


# MuPDF's JSON writer prints bboxes and font sizes as C int(value * scale): to 0.001 pt, for coordinates
# under 2 million pt (a page is at most 14,400; a line or image past that limit reads as without area).
_JSON_SCALE = 1000

Bbox = tuple[float, float, float, float]


# The parts of MuPDF's page JSON the blocks are built from, decoded straight into these records: the rest
# (each line's font name, family, weight and style, its origin and writing mode) is skipped without
# building Python objects for it, and the records are not tracked by the garbage collector.
class _Box(msgspec.Struct, gc=False):
    x: int
    y: int
    w: int
    h: int


class _Font(msgspec.Struct, gc=False):
    size: int


class _Line(msgspec.Struct, gc=False):
    bbox: _Box
    text: str
    font: _Font | None = None  # absent on a line without characters


class _Block(msgspec.Struct, gc=False):
    type: str
    bbox: _Box
    lines: list[_Line] = []  # an image block has none (msgspec copies the empty default)


class _Page(msgspec.Struct, gc=False):
    blocks: list[_Block]


_PAGE_DECODER = msgspec.json.Decoder(_Page)


def _page_json(page: Any) -> tuple[_Page, Any]:
    """The page's text and image blocks as MuPDF's C JSON writer prints them, and the text page's rect.

    One text page serves the text and the image cover: the JSON costs one decode where get_text("dict")
    built Python dicts per span and get_image_info ran the page a second time. The flags are the dict's
    (0: ligatures split, whitespace as spaces, no clipping) plus images kept as blocks (an image drawn
    between two lines of a paragraph then ends its block: seen on 9 of 1,105 pages)."""
    import pymupdf
    from pymupdf import mupdf

    tp = page.get_textpage(flags=pymupdf.TEXT_PRESERVE_IMAGES)
    buf = mupdf.fz_new_buffer(1 << 14)
    out = mupdf.FzOutput(buf)
    mupdf.fz_print_stext_page_as_json(out, tp.this, _JSON_SCALE)
    out.fz_close_output()
    raw = mupdf.fz_buffer_extract(buf)
    try:
        return _PAGE_DECODER.decode(raw), tp.rect
    except msgspec.DecodeError:
        # UTF-8, but for a lone surrogate a font's ToUnicode may map a glyph to: replaced like other bad codes
        return _PAGE_DECODER.decode(raw.decode("utf-8", "replace").encode()), tp.rect


def _page_blocks(page: Any, rect: Any = None) -> tuple[list[tuple[Bbox, str, float]], float]:
    """Text blocks of a page in MuPDF's order (bbox, text with lines joined by newlines, the font size
    that covers most of its characters) and the share of the page its images cover.

    As get_text("dict") did, a line outside the page or without area (zero-width glyphs over a figure) is
    left out. The JSON gives each line the size of its first character: a line weighs its characters
    at that size (the dict weighed each span's). `rect`: page.rect, when the caller has it (computed on
    each access)."""
    data, tp_rect = _page_json(page)
    s = _JSON_SCALE
    left, top, right, bottom = tp_rect.x0 * s, tp_rect.y0 * s, tp_rect.x1 * s, tp_rect.y1 * s

    def outside(b: _Box) -> bool:
        return b.w <= 0 or b.h <= 0 or b.x >= right or b.y >= bottom or b.x + b.w <= left or b.y + b.h <= top

    out: list[tuple[Bbox, str, float]] = []
    images: list[_Box] = []
    for block in data.blocks:
        bb = block.bbox
        if block.type != "text":
            images.append(bb)
            continue
        # a block inside the page (most): only its lines without area are left out
        if bb.x >= left and bb.y >= top and bb.x + bb.w <= right and bb.y + bb.h <= bottom:
            kept = [ln for ln in block.lines if ln.bbox.w > 0 and ln.bbox.h > 0]
        else:
            kept = [ln for ln in block.lines if not outside(ln.bbox)]
        text = "\n".join([ln.text for ln in kept])
        if not text.strip():
            continue
        if len(kept) < len(block.lines):  # the bbox of the lines kept
            x0, y0 = min(ln.bbox.x for ln in kept), min(ln.bbox.y for ln in kept)
            x1, y1 = max(ln.bbox.x + ln.bbox.w for ln in kept), max(ln.bbox.y + ln.bbox.h for ln in kept)
        else:
            x0, y0, x1, y1 = bb.x, bb.y, bb.x + bb.w, bb.y + bb.h
        sizes = {ln.font.size for ln in kept if ln.font is not None}  # in 1/_JSON_SCALE pt
        if len(sizes) == 1:  # most blocks
            dominant = round(sizes.pop() / s, 1)
        else:  # characters per size
            by_size: dict[float, int] = {}
            for ln in kept:
                if ln.font is not None:
                    size = ln.font.size / s
                    by_size[size] = by_size.get(size, 0) + len(ln.text.strip())
            dominant = _dominant_size(by_size)
        out.append(((x0 / s, y0 / s, x1 / s, y1 / s), text, dominant))
    return out, _image_cover(page.rect if rect is None else rect, images)


def _dominant_size(by_size: dict[float, int]) -> float:
    """The font size (to 0.1 pt) that covers most characters; the first seen wins a tie (0.0: no line)."""
    rounded: dict[float, int] = {}
    for size, n in by_size.items():
        key = round(size, 1)
        rounded[key] = rounded.get(key, 0) + n
    return max(rounded, key=rounded.__getitem__) if rounded else 0.0


@cache
def _document_class() -> type:
    """pymupdf.Document, less what it reads on every open and the parse never uses: the outline and the
    Info metadata (init_doc, ~0.5 ms a file: 2-3% of a text PDF's parse). Should PyMuPDF rename init_doc,
    the override is not called (the parse stays right, only slower) and
    test_pdf_opened_without_outline_or_metadata_and_blocks_pickle_whole fails."""
    import pymupdf

    class _Document(pymupdf.Document):
        def init_doc(self) -> None:
            self._outline = None

    return _Document


def _parse_pdf(src: SourceFile, data: bytes, options: ParseOptions) -> ParsedDocument:
    if not data.startswith(b"%PDF") and b"%PDF" not in data[:1024]:
        raise ParseError(src.path, "wrong-format", "the file has a .pdf name but no PDF header")
    try:
        doc = _document_class()(stream=data, filetype="pdf")
    except MemoryError:
        raise
    except Exception as exc:
        raise _mupdf_error(src.path, exc, "PyMuPDF cannot open it") from exc
    with doc:
        if doc.needs_pass:
            raise ParseError(src.path, "encrypted", "the PDF needs a password to open")
        if doc.page_count == 0:
            raise ParseError(src.path, "corrupt", "no readable page (truncated or damaged file)")
        page_count = doc.page_count
        repaired = doc.is_repaired
        # per page: text blocks (flagged when in the margin bands) or OCR blocks
        pages: list[list[PageBlock]] = []
        special: dict[int, list[Block]] = {}  # page index -> OCR / table blocks
        ocr_pages: list[dict] = []
        skipped_ocr: list[int] = []  # pages that needed OCR and did not get it (OCR off, or past the cap)
        untrusted: Counter[str] = Counter()  # their reasons
        blank: list[int] = []
        ocr_done: set[int] = set()
        chars = number = 0
        sizes: dict[tuple[int, str], float] = {}  # (page index, block text) -> font size
        body_sizes: Counter[float] = Counter()
        try:
            for page in doc.pages():
                index = page.number
                number = index + 1
                rect = page.rect  # computed on each access
                h = rect.height or 1.0
                found, cover = _page_blocks(page, rect)
                text_blocks = []  # (bbox, stripped text)
                for bb, t, size in found:
                    stripped = t.strip()
                    text_blocks.append((bb, stripped))
                    sizes[(index, stripped)] = size
                    body_sizes[size] += len(t)  # sizes come rounded to 0.1 pt
                full = "\n".join([t for _, t, _ in found])
                reason = ocr_reason(full, cover, _invisible_share(page) if cover >= 0.8 else 0.0)
                if reason:
                    if reason == "no-text" and cover == 0.0 and _is_blank(page):
                        blank.append(number)
                    elif options.ocr_engine != "none" and len(ocr_pages) < options.ocr_max_pages:
                        dpi = _render_dpi(page, src.path, options.ocr_dpi)
                        read = ocr._ocr_paragraphs(ocr._render(page, dpi), number, options, reason, ocr_pages)
                        if dpi != options.ocr_dpi:
                            ocr_pages[-1]["dpi"] = dpi
                        usable = any(clean_text(t) for t, _ in read)
                        if usable or not _layer_kept(reason, full):
                            if not usable and full.strip():  # glyph soup or spaced-out letters
                                untrusted[reason] += 1
                            pages.append(read)
                            ocr_done.add(index)
                            chars += sum(len(t) for t, _ in read)
                            if chars > options.max_chars:
                                raise too_long(src.path, chars, options.max_chars, f"by page {number}, ")
                            continue
                        ocr_pages[-1]["kept_text_layer"] = True  # OCR read nothing: the layer is all there is
                    else:  # OCR off or past ocr_max_pages
                        skipped_ocr.append(number)
                        untrusted[reason] += 1
                        if not _layer_kept(reason, full):
                            pages.append([])
                            continue
                chars += len(full)
                if chars > options.max_chars:
                    raise too_long(src.path, chars, options.max_chars, f"by page {number}, ")
                tables = _page_tables(page) if options.pdf_tables else []
                if tables:
                    special[index] = [Block("table", md, number) for _, md in tables]
                    text_blocks = [(bb, t) for bb, t in text_blocks if not any(_inside(bb, tb) for tb, _ in tables)]
                band = MARGIN_BAND * h
                top, bottom = rect.y0 + band, rect.y1 - band
                pages.append([(t, ((bb[1] + bb[3]) / 2 - rect.y0) / h if bb[3] <= top or bb[1] >= bottom else None)
                              for bb, t in text_blocks])
        except (ParseError, MemoryError):
            raise
        except (OcrError, ConfigError) as exc:
            raise ParseError(src.path, "ocr-error", f"OCR of page {number} failed: {exc}") from exc
        except Exception as exc:
            raise _mupdf_error(src.path, exc, f"PyMuPDF failed while reading page {number}") from exc
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
            level = levels.get(sizes.get((i, t), 0.0)) if levels else None  # sizes come rounded to 0.1 pt
            if level and kind == "text" and looks_like_heading(cleaned):
                page_out.append(Block("title", cleaned.replace("\n", " "), i + 1, level=level))
            else:
                page_out.append(Block(kind, cleaned, i + 1))
        if not page_out:
            empty_pages.append(i + 1)
        blocks.extend(page_out)
    if not blocks and repaired and len(blank) == page_count:
        raise ParseError(src.path, "corrupt", f"damaged (MuPDF had to repair it) and none of its {page_count} "
                         "pages has any content left (truncated?)")
    if not blocks:
        unusable = ", ".join(f"{n} {_REASON_WORDS[why]}" for why, n in sorted(untrusted.items()))
        what = f"a usable text layer ({unusable})" if unusable else "a text layer"
        if options.ocr_engine == "none":
            hint = "OCR is off (CORPUSYNC_OCR_ENGINE=none)"
        elif blank:
            hint = (f"{len(blank)} blank pages (no text, images or drawings) were not OCRed"
                    + (", OCR found no text on the others" if len(blank) < page_count else ""))
        elif skipped_ocr:
            hint = f"past CORPUSYNC_OCR_MAX_PAGES={options.ocr_max_pages}, pages are not OCRed"
        else:
            hint = "OCR found no text either"
        raise ParseError(src.path, "no-text", f"none of its {page_count} pages has {what}; {hint}")
    metadata: dict = {}
    if empty_pages:
        metadata["pages_without_text"] = empty_pages
    if blank:
        metadata["blank_pages"] = blank
    if ocr_pages:
        metadata["ocr_pages"] = ocr_pages
        # a page whose text layer was kept is not indexed from its (empty) OCR reading
        metadata["low_confidence_pages"] = [p["page"] for p in ocr_pages
                                            if p["low_confidence"] and not p.get("kept_text_layer")]
    if skipped_ocr:
        metadata["ocr_skipped_pages"] = skipped_ocr
    engine, version = ocr.recorded_engine(ocr_pages)
    return ParsedDocument(
        src, blocks, parser="pymupdf", parser_version=_version("PyMuPDF"),
        media_type="application/pdf", page_count=page_count,
        ocr_engine=engine, ocr_engine_version=version, metadata=metadata,
        cleaning={"removed_running_lines": removed} if removed else {},
    )
