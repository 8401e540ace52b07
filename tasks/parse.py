"""parse/clean: turn a source file into cleaned, structured blocks.

PDFs go through PyMuPDF page by page (fast, exact page numbers); pages without a usable text layer (none,
garbage, or one big scanned image) are rendered and OCRed with PP-OCR. Markdown is read directly with
markdown-it-py (tasks/parsing/markdown.py; CORPUSYNC_MARKDOWN_PARSER=unstructured for the old path); HTML, DOCX,
PPTX and XLSX go through `unstructured` (its element types give titles, lists and tables; tables become Markdown);
images are OCRed; plain text is decoded with charset detection. Running headers/footers and page numbers
are removed and recorded. Every failure becomes a ParseError with a short reason code the quarantine
table keeps, named by cause: 'oversized' (too big on disk, inflated, in pixels or in characters), 'corrupt'
(unreadable), 'ocr-error' and 'out-of-memory' (causes that can pass), ...

Layout: this module is the stage's entry point (options re-exported, parser_fingerprint, supported(), the
format dispatch, the sidecar merge and the script guess); the formats live in tasks/parsing/: common
(ParseOptions, PARSE_LOGIC_VERSION, cleaning), limits (hostile-input guards), text (text, CSV), markup
(Markdown, HTML), office (DOCX/PPTX/XLSX, legacy Office), pdf, ocr (page images, image files) and layout
(running lines, headings). Names other code imports from here are re-exported.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corpusync.core.errors import ParseError
from corpusync.core.unicode_text import HAN
from schemas.records import ParsedDocument, ParseOptions, SourceFile
from tasks.parsing.common import PARSE_LOGIC_VERSION, _version, clean_text, rows_to_markdown
from tasks.parsing.layout import MARGIN_BAND, PageBlock, heading_levels, looks_like_heading, strip_running_lines
from tasks.parsing.limits import (
    MAX_PIXELS,
    MIN_OCR_DPI,
    ZIP_MAX_BYTES,
    ZIP_MAX_RATIO,
    ZIP_RATIO_FROM,
    _read_bytes,
    check_container,
    check_text_size,
    too_long,
)
from tasks.parsing.markdown import parse_markdown
from tasks.parsing.markup import (
    MAX_COLSPAN,
    MAX_ROWSPAN,
    _parse_markup,
    expand_html_spans,
    html_table_to_markdown,
    span_grid,
)
from tasks.parsing.ocr import _parse_image
from tasks.parsing.office import _LEGACY, _OFFICE, _parse_legacy, _parse_office
from tasks.parsing.pdf import BLANK_MAX_ITEMS, _parse_pdf, ocr_reason
from tasks.parsing.text import _parse_csv, _parse_text, decode_text

__all__ = [
    "BLANK_MAX_ITEMS", "MARGIN_BAND", "MAX_COLSPAN", "MAX_PIXELS", "MAX_ROWSPAN", "MIN_OCR_DPI", "PARSERS",
    "PARSER_METADATA_KEYS", "PARSE_LOGIC_VERSION", "ZIP_MAX_BYTES", "ZIP_MAX_RATIO", "ZIP_RATIO_FROM", "PageBlock",
    "ParseOptions", "Parser", "check_container", "check_text_size", "clean_text", "decode_text", "detect_script",
    "expand_html_spans", "heading_levels", "html_table_to_markdown", "looks_like_heading", "merge_sidecar",
    "ocr_reason", "parse_document", "parser_fingerprint", "rows_to_markdown", "span_grid", "strip_running_lines",
    "supported", "too_long",
]

log = logging.getLogger(__name__)


def parser_fingerprint(options: ParseOptions | None = None) -> str:
    """Versions and options that decide parse output (part of the pipeline fingerprint)."""
    o = options or ParseOptions()
    return (f"parse={PARSE_LOGIC_VERSION};pymupdf={_version('PyMuPDF')};unstructured={_version('unstructured')};"
            f"rapidocr={_version('rapidocr')};ocr={o.ocr_engine}@{o.ocr_dpi};tables={o.pdf_tables};"
            f"markdown={o.markdown_parser}@{_version('markdown-it-py')};office_pictures={o.office_pictures}")


Parser = Callable[[SourceFile, bytes, ParseOptions], ParsedDocument]

PARSERS: dict[str, Parser] = {
    ".txt": lambda s, d, o: _parse_text(s, d, o.max_chars),
    ".text": lambda s, d, o: _parse_text(s, d, o.max_chars),
    ".md": parse_markdown,
    ".markdown": parse_markdown,
    ".html": lambda s, d, o: _parse_markup(s, d, "html"),
    ".htm": lambda s, d, o: _parse_markup(s, d, "html"),
    ".csv": lambda s, d, o: _parse_csv(s, d, o.max_chars),
    ".tsv": lambda s, d, o: _parse_csv(s, d, o.max_chars),
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
    check_text_size(doc, options.max_chars)
    if src.meta_json:
        merge_sidecar(doc, json.loads(src.meta_json))
    doc.metadata.setdefault("lang", detect_script(" ".join(b.text for b in doc.blocks[:200])))
    return doc


# Metadata the parser records, which validation and audits trust: a sidecar cannot set these, even where the
# parser recorded nothing (a sidecar's "ocr_pages" on a text PDF would be read as OCR results).
PARSER_METADATA_KEYS = frozenset({"pages_without_text", "blank_pages", "ocr_pages", "low_confidence_pages",
                                  "ocr_skipped_pages", "sidecar_conflicts", "pictures"})


def merge_sidecar(doc: ParsedDocument, user: dict[str, Any]) -> None:
    """Add the sidecar FILE.meta.json's keys to the parser's metadata. The parser's own keys win; the
    sidecar's values for them are kept under "sidecar_conflicts" (and logged). "lang" is the sidecar's when
    it gives one (the parser's is a guess from the script)."""
    owned = PARSER_METADATA_KEYS | (doc.metadata.keys() - {"lang"})
    conflicts = {k: user[k] for k in sorted(user) if k in owned}
    doc.metadata.update({k: v for k, v in user.items() if k not in owned})
    if conflicts:
        doc.metadata["sidecar_conflicts"] = conflicts
        log.warning("%s: the sidecar's %s ignored: the parser records these keys (kept under sidecar_conflicts)",
                    doc.source.path, ", ".join(conflicts))


_SCRIPTS = (("ja", "\u3040", "\u30ff"), ("ko", "\uac00", "\ud7af"), ("ar", "\u0600", "\u06ff"),
            ("ru", "\u0400", "\u04ff"))  # and "zh": Han, as corpusync.core.unicode_text defines it
_ASCII_LETTER = re.compile("[A-Za-z]")
_SCRIPT_RES = tuple((tag, re.compile(f"[{lo}-{hi}]")) for tag, lo, hi in _SCRIPTS)


def detect_script(text: str) -> str:
    """A coarse language tag from the writing system ('zh', 'ja', 'ko', 'ar', 'ru', else 'latin'), for
    filtering; kana beats Han (Japanese mixes both). Counted by regular expressions over the first 20,000
    characters (a loop over characters cost a text PDF a tenth of its parse); ASCII text has no letter of
    the scripts counted, so only whether it has a letter at all."""
    text = text[:20000]
    if text.isascii():
        return "latin" if _ASCII_LETTER.search(text) else "und"
    letters = "".join(filter(str.isalpha, text))
    if not letters:
        return "und"
    counts = {"zh": len(HAN.findall(letters))} | {tag: len(rx.findall(letters)) for tag, rx in _SCRIPT_RES}
    if counts["ja"] > 0.05 * len(letters):
        return "ja"
    tag, n = max(counts.items(), key=lambda kv: kv[1])
    return tag if n > 0.3 * len(letters) else "latin"
