"""Pictures in DOCX and PPTX read by OCR where they sit: a Word file that is a scanned contract pasted in as page
images, a slide that is a screenshot. Without this their text was lost (a document of pictures alone was
quarantined as empty).

unstructured calls a registered picture partitioner for each paragraph (DOCX) and picture shape (PPTX) in
document order; the one here OCRs each embedded raster image and yields its paragraphs as `OcrText` elements
(ocr blocks) in place. The registration is module-wide, so what one parse needs (its options, what it read)
travels in a context variable that only `reading_pictures` sets: another caller of unstructured gets nothing
from it. A picture used again (a logo on every slide) is read once: its text is the document's once, as a
running header is. A picture of a format the image library cannot decode (EMF, WMF, a damaged one), past
MAX_PIXELS, or with too few pixels to hold a line of text is counted in the document's metadata, not read:
the rest of the document stands."""

from __future__ import annotations

import hashlib
import io
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corpusync.core.errors import ConfigError, OcrError, ParseError
from schemas.records import ParseOptions
from tasks.parsing.common import clean_text
from tasks.parsing.limits import MAX_PIXELS

MIN_SIDE = 16  # pixels: a picture narrower or lower than this holds no legible line of text (an icon, a rule)


@dataclass
class PictureReading:
    """What one document's pictures gave: OCR records (as a PDF's ocr_pages), and the pictures not read."""

    path: str
    options: ParseOptions
    record: list[dict] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # sha256 of the pictures met so far
    pictures: int = 0  # pictures met, repeats included
    repeated: int = 0
    undecodable: int = 0
    oversized: int = 0
    too_small: int = 0
    not_read: int = 0  # OCR off (or off for pictures), or past ocr_max_pages

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.record:
            out["ocr_pages"] = self.record
            low = [r["page"] for r in self.record if r["low_confidence"] and r["page"] is not None]
            if low:  # by slide (a DOCX has no page numbers: its records name the picture)
                out["low_confidence_pages"] = sorted(set(low))
        counts = {"pictures": self.pictures, "read": len(self.record), "repeated": self.repeated,
                  "undecodable": self.undecodable, "oversized": self.oversized, "too_small": self.too_small,
                  "not_read": self.not_read}
        if self.pictures:
            out["pictures"] = {k: v for k, v in counts.items() if v}
        return out


_current: ContextVar[PictureReading | None] = ContextVar("corpusync_picture_reading", default=None)


@contextmanager
def reading_pictures(path: str, options: ParseOptions) -> Iterator[PictureReading]:
    """OCR the pictures of the DOCX/PPTX partitioned inside this block, on behalf of the file at `path`."""
    _register()
    reading = PictureReading(path, options)
    token = _current.set(reading)
    try:
        yield reading
    finally:
        _current.reset(token)


def _ocr_text_class() -> type:
    from unstructured.documents.elements import Text

    class OcrText(Text):  # a paragraph OCR read in a picture (an "ocr" block)
        category = "OcrText"

    return OcrText


_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    from unstructured.documents.elements import ElementMetadata
    from unstructured.partition import docx, pptx

    ocr_text = _ocr_text_class()

    def elements(blobs: Iterable[bytes], page: int | None, metadata: Callable[[], Any]) -> Iterator[Any]:
        """OcrText elements of the pictures, inside a corpusync parse only (the blobs are not even looked for
        outside one)."""
        reading = _current.get()
        if reading is not None:
            for blob in blobs:
                for text in _read(reading, blob, page):
                    yield ocr_text(text, metadata=metadata())

    class DocxPictures:
        @classmethod
        def iter_elements(cls, paragraph: Any, opts: Any) -> Iterator[Any]:
            page = opts.metadata_page_number
            return elements(_docx_blobs(paragraph), page, lambda: ElementMetadata(page_number=page))

    class PptxPictures:
        @classmethod
        def iter_elements(cls, picture: Any, opts: Any) -> Iterator[Any]:
            return elements(_pptx_blobs(picture), opts.page_number, opts.text_metadata)

    docx.register_picture_partitioner(DocxPictures)
    pptx.register_picture_partitioner(PptxPictures)
    _registered = True


def count_pictures(path: Path) -> int:
    """The media files of a DOCX/PPTX container (an upper bound on the pictures OCR may read: a Word file can be
    a hundred scanned pages), read from its zip directory alone: what scales the document's parse deadline."""
    import zipfile

    with zipfile.ZipFile(path) as container:
        return sum(1 for name in container.namelist() if name.startswith(("word/media/", "ppt/media/")))


_R = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"


def _docx_blobs(paragraph: Any) -> Iterator[bytes]:
    """The embedded images a paragraph draws, in order: DrawingML pictures (a:blip r:embed), inline or
    floating, and VML ones of older files (v:imagedata r:id). Linked images have no part: skipped."""
    related = paragraph.part.related_parts
    for el in paragraph._p.iter():
        tag = el.tag if isinstance(el.tag, str) else ""
        if tag.endswith("}blip"):
            rid = el.get(_R + "embed")
        elif tag.endswith("}imagedata"):
            rid = el.get(_R + "id")
        else:
            continue
        part = related.get(rid) if rid else None
        blob = getattr(part, "blob", None)
        if blob:
            yield blob


def _pptx_blobs(picture: Any) -> Iterator[bytes]:
    """The image of a picture shape, unless it is linked rather than embedded."""
    try:
        blob = picture.image.blob
    except (ValueError, KeyError, AttributeError):
        return
    yield blob


def _read(reading: PictureReading, blob: bytes, page: int | None) -> list[str]:
    """The cleaned paragraphs OCR reads in one picture (none for a repeat, a picture too small or in a format
    that cannot be decoded, or when OCR is off or past its page cap)."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    from tasks.parsing.ocr import _ocr_paragraphs

    reading.pictures += 1
    sha = hashlib.sha256(blob).hexdigest()
    if sha in reading.seen:
        reading.repeated += 1
        return []
    reading.seen.add(sha)
    options = reading.options
    if options.ocr_engine == "none" or not options.office_pictures or len(reading.record) >= options.ocr_max_pages:
        reading.not_read += 1
        return []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # checked below
            img = Image.open(io.BytesIO(blob))
            w, h = img.size
            if w * h > MAX_PIXELS:  # a pixel bomb?
                reading.oversized += 1
                return []
            if min(w, h) < MIN_SIDE:
                reading.too_small += 1
                return []
            rgb = np.ascontiguousarray(np.asarray(img.convert("RGB")))
    except Image.DecompressionBombError:
        reading.oversized += 1
        return []
    except (UnidentifiedImageError, OSError, ValueError, EOFError):
        reading.undecodable += 1  # EMF/WMF, or a damaged image
        return []
    try:
        paragraphs = _ocr_paragraphs(rgb, page, options, "picture", reading.record)
    except (OcrError, ConfigError) as exc:
        raise ParseError(reading.path, "ocr-error", f"OCR of picture {reading.pictures} failed: {exc}") from exc
    reading.record[-1]["picture"] = reading.pictures
    return [t for t in (clean_text(p) for p, _ in paragraphs) if t]
