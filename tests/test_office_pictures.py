"""Pictures in DOCX and PPTX are read by OCR where they sit (tasks/parsing/office_pictures.py): a scanned page
pasted into a Word file between two paragraphs, a slide that is a scan. Real unstructured, python-docx,
python-pptx and RapidOCR; the page image is the test corpus's scanned Chinese letter, rendered by PyMuPDF."""

from __future__ import annotations

import hashlib
import io
from datetime import UTC, datetime
from pathlib import Path

import pytest

from corpusync.core.errors import ParseError
from schemas.records import ParseOptions, SourceFile
from tasks.parse import parse_document
from tasks.parsing.office_pictures import PictureReading, _read, count_pictures
from tests.conftest import TEST_DATA

SCAN = next((TEST_DATA / "corpus" / "pdfplumber-test-pdfs" / "zh").glob("pr-136-example*.pdf"))
PHRASE = "菲达环保"  # in the letter's first page, read by OCR (the page has no text layer)


@pytest.fixture(scope="module")
def page_png() -> bytes:
    """The letter's first page as a PNG at 100 dpi (850 x 1170 pixels): a scan pasted into an Office file."""
    import pymupdf

    with pymupdf.open(SCAN) as doc:
        return doc[0].get_pixmap(dpi=100).tobytes("png")


def _logo() -> bytes:
    """A small picture with no text, used twice (a logo)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (120, 40), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def _source(path: Path) -> SourceFile:
    data = path.read_bytes()
    return SourceFile(path.name, path, len(data), datetime.now(UTC), hashlib.sha256(data).hexdigest())


def _docx(path: Path, *parts: str | bytes) -> Path:
    import docx
    from docx.shared import Inches

    document = docx.Document()
    for part in parts:
        if isinstance(part, bytes):
            document.add_picture(io.BytesIO(part), width=Inches(5 if len(part) > 10_000 else 1))
        else:
            document.add_paragraph(part)
    document.save(str(path))
    return path


def test_a_scan_in_a_word_file_is_read_in_place(tmp_path: Path, page_png: bytes) -> None:
    logo = _logo()
    path = _docx(tmp_path / "contract.docx", logo, "Appendix A. The auditor's letter follows.", page_png,
                 "Appendix B. Signatures.", logo)
    doc = parse_document(_source(path), ParseOptions())
    kinds = [b.kind for b in doc.blocks]
    texts = [b.text for b in doc.blocks]
    assert kinds[0] == "text" and texts[0].startswith("Appendix A") and texts[-1].startswith("Appendix B")
    assert set(kinds[1:-1]) == {"ocr"}  # the scan's paragraphs, between the two paragraphs around it
    assert PHRASE in "".join(texts[1:-1])
    assert doc.ocr_engine == "rapidocr" and doc.ocr_engine_version
    assert doc.metadata["pictures"] == {"pictures": 3, "read": 2, "repeated": 1}  # the logo once, read once
    assert [r["picture"] for r in doc.metadata["ocr_pages"]] == [1, 2] and doc.metadata["ocr_pages"][1]["lines"] > 10
    assert count_pictures(path) == 2  # what scales its parse deadline: the logo is one part, used twice


def test_a_scanned_slide_is_read_on_its_slide(tmp_path: Path, page_png: bytes) -> None:
    from pptx import Presentation
    from pptx.util import Inches

    deck = Presentation()
    first = deck.slides.add_slide(deck.slide_layouts[1])
    first.shapes.title.text = "Audit letter"
    second = deck.slides.add_slide(deck.slide_layouts[6])  # blank: the scan alone
    second.shapes.add_picture(io.BytesIO(page_png), Inches(1), Inches(0.2), height=Inches(7))
    path = tmp_path / "deck.pptx"
    deck.save(str(path))
    doc = parse_document(_source(path), ParseOptions())
    assert (doc.blocks[0].kind, doc.blocks[0].page) == ("title", 1)
    scan = [b for b in doc.blocks if b.kind == "ocr"]
    assert scan and {b.page for b in scan} == {2} and PHRASE in "".join(b.text for b in scan)
    assert doc.page_count == 2 and doc.metadata["ocr_pages"][0]["page"] == 2


def test_a_file_of_pictures_alone_says_why_it_has_no_text(tmp_path: Path, page_png: bytes) -> None:
    path = _docx(tmp_path / "scan.docx", page_png)
    with pytest.raises(ParseError) as off:
        parse_document(_source(path), ParseOptions(ocr_engine="none"))
    assert off.value.reason == "no-text" and "scan.docx" in str(off.value)
    assert "no text besides 1 picture(s); none was read (1 not read: OCR is off (CORPUSYNC_OCR_ENGINE=none))" \
        in str(off.value)
    with pytest.raises(ParseError, match=r"1 not read: OCR of pictures is off \(CORPUSYNC_OCR_OFFICE_PICTURES=false\)"):
        parse_document(_source(path), ParseOptions(office_pictures=False))
    blank = _docx(tmp_path / "logo.docx", _logo())
    with pytest.raises(ParseError, match=r"OCR found no text in the 1 read"):
        parse_document(_source(blank), ParseOptions())


def test_pictures_not_read_are_counted() -> None:
    from PIL import Image

    reading = PictureReading("x.docx", ParseOptions())
    assert _read(reading, b"\x01\x00\x00\x00 an EMF record, not a raster image", None) == []
    thin = io.BytesIO()
    Image.new("RGB", (400, 8)).save(thin, "PNG")  # a rule: no line of text fits in 8 pixels
    assert _read(reading, thin.getvalue(), None) == []
    capped = PictureReading("x.docx", ParseOptions(ocr_max_pages=0))
    assert _read(capped, _logo(), None) == []
    assert (reading.undecodable, reading.too_small, capped.not_read, reading.record) == (1, 1, 1, [])


def test_unstructured_called_elsewhere_reads_no_pictures(tmp_path: Path, page_png: bytes) -> None:
    """The picture partitioner is registered module-wide; outside a corpusync parse it yields nothing."""
    from unstructured.partition.docx import partition_docx

    parse_document(_source(_docx(tmp_path / "a.docx", "x", _logo())), ParseOptions())  # registers it
    elements = partition_docx(filename=str(_docx(tmp_path / "b.docx", "Only text.", page_png)))
    assert [str(e) for e in elements] == ["Only text."]  # the paragraph, and nothing read in the picture
