"""Hostile-input guards: bytes on disk, characters of text, inflated Office parts, pixels of a page to OCR.
Each refuses with an 'oversized' (or 'empty' / 'unreadable') ParseError naming the file and the bound; a file
that changed since discover hashed it is refused as 'changed-during-run'."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from corpusync.core.errors import ParseError
from schemas.records import ParsedDocument, SourceFile
from tasks.discover import document_sha256

# Hostile-input bounds. Pixels: PIL's own decompression-bomb threshold (~0.25 GiB as RGB), for images and for
# PDF pages rendered for OCR (A0 at 200 dpi is 62 M pixels). Office containers: a part may inflate at most
# 100x once over 10 MiB (Apache POI's zip-bomb rule for OOXML), and all parts together to at most 1 GiB.
MAX_PIXELS = 89_478_485
MIN_OCR_DPI = 72  # a page that only fits MAX_PIXELS below this is too large to read
ZIP_MAX_RATIO = 100
ZIP_RATIO_FROM = 10 * 1024 * 1024
ZIP_MAX_BYTES = 1024 * 1024 * 1024


def _read_bytes(src: SourceFile, max_bytes: int) -> bytes:
    """The file's bytes, checked against the hash discover took: a file written while the refresh runs (a
    save, a sync, a copy still in progress) is not parsed from other bytes than its version records, nor
    quarantined for a state it was only passing through ('changed-during-run': tried again by the next
    refresh, the live version meanwhile kept)."""
    if src.size == 0:
        raise ParseError(src.path, "empty", "the file is 0 bytes")
    if src.size > max_bytes:
        raise ParseError(src.path, "oversized", f"{src.size} bytes exceeds the limit of {max_bytes}")
    try:
        with src.abs_path.open("rb") as fh:
            data = fh.read(max_bytes + 1)  # a file that grew past the limit is not read whole
    except OSError as exc:
        raise ParseError(src.path, "unreadable", str(exc)) from exc
    if len(data) != src.size or document_sha256(hashlib.sha256(data).hexdigest(), src.meta_json) != src.sha256:
        how = (f"{src.size:,} bytes then, {len(data):,}{'+' if len(data) > max_bytes else ''} now"
               if len(data) != src.size else "other bytes of the same size")
        raise ParseError(src.path, "changed-during-run",
                         f"the file changed after this refresh hashed it ({how}; is it being written?): not "
                         "indexed from other bytes than its version records; the next refresh reads it again")
    return data


def too_long(path: str, chars: int, max_chars: int, where: str = "") -> ParseError:
    """'oversized' for a document whose text passes the character bound (the chunker's memory grows with it)."""
    return ParseError(path, "oversized", f"{where}its text is {chars:,} characters, over the limit of {max_chars:,} "
                      "(CORPUSYNC_PARSE_MAX_CHARS; split the document or raise the setting)")


def check_text_size(doc: ParsedDocument, max_chars: int) -> None:
    """Raise 'oversized' when a parsed document holds more than max_chars characters of text."""
    chars = sum(len(b.text) for b in doc.blocks)
    if chars > max_chars:
        raise too_long(doc.source.path, chars, max_chars)


def check_container(path: str, parts: Iterable[Any]) -> None:
    """Refuse a zip container (DOCX/PPTX/XLSX) that would inflate past sense, from the sizes its directory
    declares, before anything is inflated (Python's zipfile never inflates a part past its declared size):
    a part over ZIP_RATIO_FROM that inflates more than ZIP_MAX_RATIO times, or ZIP_MAX_BYTES in all."""
    total = 0
    for info in parts:
        total += info.file_size
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size > ZIP_RATIO_FROM and ratio > ZIP_MAX_RATIO:
            raise ParseError(path, "oversized", f"its part {info.filename} would inflate {ratio:,.0f}x, from "
                             f"{info.compress_size:,} to {info.file_size:,} bytes (a zip bomb?); Office parts over "
                             f"{ZIP_RATIO_FROM >> 20} MiB may inflate at most {ZIP_MAX_RATIO}x")
    if total > ZIP_MAX_BYTES:
        raise ParseError(path, "oversized", f"its parts would inflate to {total:,} bytes, over the limit of "
                         f"{ZIP_MAX_BYTES:,}")


def _render_dpi(page: Any, path: str, dpi: int) -> int:
    """The resolution a page is rendered at for OCR: `dpi`, or lower for a page that would pass MAX_PIXELS
    (an oversized page is 'oversized' when even MIN_OCR_DPI passes it: a rendering would exhaust memory)."""
    inches = (page.rect.width / 72) * (page.rect.height / 72)
    if inches * dpi * dpi <= MAX_PIXELS:
        return dpi
    fit = int((MAX_PIXELS / inches) ** 0.5) if inches > 0 else 0
    if fit < MIN_OCR_DPI:
        raise ParseError(path, "oversized", f"page {page.number + 1} is {page.rect.width:,.0f} x "
                         f"{page.rect.height:,.0f} pt: {inches * dpi * dpi / 1e6:,.0f} M pixels to OCR at {dpi} dpi, "
                         f"over the limit of {MAX_PIXELS / 1e6:.0f} M pixels even at {MIN_OCR_DPI} dpi")
    return fit
