"""Hostile input at parse (issue 15): documents that expand past any sensible size, blank-page PDFs, oversized
pages and pixel bombs, OCR and memory failures labelled by cause, table spans, sidecars that try to overwrite
pipeline metadata, huge data: URIs, and a memory limit the worker could not apply. Files are generated."""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import struct
import zipfile
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pymupdf
import pytest

from corpusync.adapters import ocr
from corpusync.core.errors import ParseError
from schemas.records import SourceFile
from tasks.discover import document_sha256
from tasks.parse import ParseOptions, html_table_to_markdown, parse_document
from tasks.parse_worker import ParseWorker
from tasks.parsing import ocr as parse_ocr
from tests.faults import SetrlimitRefused


def source(path: Path, meta_json: str = "") -> SourceFile:
    data = path.read_bytes()
    return SourceFile(path.name, path, len(data), datetime.now(UTC),
                      document_sha256(hashlib.sha256(data).hexdigest(), meta_json), meta_json)


def reason_of(src: SourceFile, options: ParseOptions | None = None) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse_document(src, options or ParseOptions())
    return info.value


def png(width: int, height: int, pixels: bytes | None = None) -> bytes:
    """A PNG (RGB, 8 bit); without pixels only the header is real (enough for a reader that checks sizes first)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = pixels if pixels is not None else b"\x00" * 64
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def text_png() -> bytes:
    """A small real image with a word on it (rendered by PyMuPDF), for pages that must be OCRed."""
    doc = pymupdf.open()
    page = doc.new_page(width=300, height=80)
    page.insert_text((20, 50), "Invoice 2024", fontsize=28)
    return page.get_pixmap(dpi=150).tobytes("png")


@pytest.fixture
def ocr_calls(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """Pages handed to the OCR engine (a spy around the real call)."""
    calls: list[int | None] = []
    real = parse_ocr._ocr_paragraphs

    def spy(image: object, page_no: int | None, *args: Any) -> Any:
        calls.append(page_no)
        return real(image, page_no, *args)

    monkeypatch.setattr(parse_ocr, "_ocr_paragraphs", spy)
    return calls


# --- 1. text bounded by characters, Office containers by their inflated size --------------------------------

def test_text_over_the_char_bound_is_oversized_in_the_worker(tmp_path: Path) -> None:
    long = tmp_path / "long.txt"
    long.write_text("\n\n".join(f"Paragraph {i} of a document that keeps going." for i in range(200)))
    short = tmp_path / "short.txt"
    short.write_text("A short note.")
    with ParseWorker(ParseOptions(max_chars=1000), timeout_s=120, memory_mb=2048) as w:
        with pytest.raises(ParseError) as info:
            w.parse(source(long))
        assert w.parse(source(short)).blocks[0].text == "A short note."
    assert info.value.reason == "oversized" and "long.txt" in str(info.value)
    assert "CORPUSYNC_PARSE_MAX_CHARS" in info.value.detail and "1,000" in info.value.detail


def _docx_bomb(path: Path, inflated_mb: int) -> None:
    """A real DOCX (python-docx) whose word/document.xml is replaced by one that inflates ~1000x."""
    import docx

    buf = io.BytesIO()
    docx.Document().save(buf)
    with zipfile.ZipFile(buf) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            if info.filename != "word/document.xml":
                out.writestr(info, src.read(info))
        ns = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
        with out.open("word/document.xml", "w") as body:
            body.write(f"<?xml version='1.0' encoding='UTF-8'?><w:document {ns}><w:body>".encode())
            para = b"<w:p><w:r><w:t>All work and no play makes a dull document.</w:t></w:r></w:p>" * 12000
            for _ in range(inflated_mb):
                body.write(para)
            body.write(b"</w:body></w:document>")


def test_docx_zip_bomb_is_quarantined_before_it_expands(tmp_path: Path) -> None:
    bomb = tmp_path / "report.docx"
    _docx_bomb(bomb, inflated_mb=64)
    assert bomb.stat().st_size < 1024 * 1024
    with ParseWorker(ParseOptions(), timeout_s=60, memory_mb=4096) as w, pytest.raises(ParseError) as info:
        w.parse(source(bomb))
    assert info.value.reason == "oversized", info.value
    assert "word/document.xml" in info.value.detail and "inflate" in info.value.detail


# --- 2. blank PDF pages are not OCRed -----------------------------------------------------------------------

def test_blank_pages_are_not_ocred(tmp_path: Path, ocr_calls: list[int | None]) -> None:
    doc = pymupdf.open()
    for _ in range(500):
        doc.new_page()
    doc.save(tmp_path / "blank.pdf")
    doc.new_page().insert_text((72, 72), "The only page with something to read.")
    doc[0].draw_rect(pymupdf.Rect(20, 20, 575, 822))  # a frame around a page is still a blank page
    doc.save(tmp_path / "mostly-blank.pdf")

    err = reason_of(source(tmp_path / "blank.pdf"))
    assert err.reason == "no-text" and "500 blank" in err.detail
    parsed = parse_document(source(tmp_path / "mostly-blank.pdf"), ParseOptions())
    assert ocr_calls == []
    assert "ocr_pages" not in parsed.metadata and len(parsed.metadata["blank_pages"]) == 500
    assert [b.text for b in parsed.blocks] == ["The only page with something to read."]

    scan = pymupdf.open()
    scan.new_page().insert_image(pymupdf.Rect(72, 72, 372, 152), stream=text_png())
    scan.new_page()
    scan.save(tmp_path / "scan.pdf")
    parsed = parse_document(source(tmp_path / "scan.pdf"), ParseOptions())
    assert ocr_calls == [1]  # a page with an image is OCRed, the blank one is not
    assert "Invoice" in parsed.blocks[0].text and parsed.metadata["blank_pages"] == [2]


# --- 3. PDF and image failures labelled by cause -------------------------------------------------------------

def _image_pdf(path: Path, size: float = 595) -> None:
    doc = pymupdf.open()
    doc.new_page(width=size, height=size).insert_image(pymupdf.Rect(72, 72, 372, 152), stream=text_png())
    doc.save(path)


def test_oversized_page_and_pixel_bombs_are_oversized_not_corrupt(tmp_path: Path) -> None:
    _image_pdf(tmp_path / "poster.pdf", size=20000)
    err = reason_of(source(tmp_path / "poster.pdf"))
    assert err.reason == "oversized" and "page 1" in err.detail and "pixels" in err.detail
    (tmp_path / "bomb.png").write_bytes(png(12000, 12000))  # 144 M pixels: over PIL's bomb threshold
    (tmp_path / "huge.png").write_bytes(png(100_000, 100_000))  # 10 G pixels
    for name in ("bomb.png", "huge.png"):
        err = reason_of(source(tmp_path / name))
        assert err.reason == "oversized" and "pixels" in err.detail, err
    data = (tmp_path / "poster.pdf").read_bytes()
    (tmp_path / "cut.pdf").write_bytes(data[: len(data) // 3])
    (tmp_path / "cut.png").write_bytes(png(50, 50)[:40])
    for name in ("cut.pdf", "cut.png"):
        assert reason_of(source(tmp_path / name)).reason == "corrupt"  # a damaged file still is


@pytest.mark.parametrize(("fault", "reason"), [(RuntimeError("onnxruntime: model failed to run"), "ocr-error"),
                                               (MemoryError(), "out-of-memory")])
def test_ocr_engine_failures_are_not_corrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             fault: BaseException, reason: str) -> None:
    def broken(self: object, image: object) -> ocr.OcrResult:
        raise fault

    monkeypatch.setattr(ocr.RapidOcrEngine, "recognise", broken)  # fault injection into the real engine
    _image_pdf(tmp_path / "scan.pdf")
    (tmp_path / "scan.png").write_bytes(text_png())
    for name in ("scan.pdf", "scan.png"):
        err = reason_of(source(tmp_path / name))
        assert err.reason == reason, err
        assert reason == "out-of-memory" or "onnxruntime" in err.detail


# --- 4. a memory limit that cannot be applied is reported -----------------------------------------------------

def test_memory_limit_that_cannot_be_set_is_reported_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = tmp_path / "good.txt"
    good.write_text("Plain text that parses.")
    (tmp_path / "crash.txt").write_text("whatever")
    caplog.set_level(logging.WARNING, logger="tasks.parse_worker")
    with ParseWorker(ParseOptions(), timeout_s=60, memory_mb=1024, parse=SetrlimitRefused()) as w:
        assert w.parse(source(good)).blocks
        with pytest.raises(ParseError):
            w.parse(source(tmp_path / "crash.txt"))
        assert w.parse(source(good)).blocks  # a fresh worker, same failure: not warned again
        problem = w.memory_limit_problem
    assert problem and "1024 MiB" in problem and "not allowed to raise maximum limit" in problem
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "1024 MiB" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    with ParseWorker(ParseOptions(), timeout_s=60, memory_mb=1024) as w:
        assert w.parse(source(good)).blocks and w.memory_limit_problem is None


# --- 5. table spans ----------------------------------------------------------------------------------------

SPANNED = """<html><body><h1>Sales</h1><table>
<tr><th rowspan="2">Region</th><th colspan="2">2023</th><th>2024</th></tr>
<tr><th>H1</th><th>H2</th><th>H1</th></tr>
<tr><td rowspan="2">East</td><td>10</td><td>11</td><td>12</td></tr>
<tr><td>20</td><td>21</td><td>22</td></tr>
<tr><td>West</td><td colspan="2">n/a</td><td>32</td></tr>
</table></body></html>"""


def test_html_and_docx_table_spans_keep_cells_under_their_header(tmp_path: Path) -> None:
    (tmp_path / "sales.html").write_text(SPANNED)
    table = next(b.text for b in parse_document(source(tmp_path / "sales.html"), ParseOptions()).blocks
                 if b.kind == "table")
    assert table.split("\n") == ["| Region | 2023 | 2023 | 2024 |", "|---|---|---|---|", "| Region | H1 | H2 | H1 |",
                                 "| East | 10 | 11 | 12 |", "| East | 20 | 21 | 22 |", "| West | n/a | n/a | 32 |"]
    import docx

    d = docx.Document()
    t = d.add_table(rows=3, cols=3)
    for (r, c), text in {(0, 0): "Region", (1, 1): "10", (1, 2): "11", (2, 1): "20", (2, 2): "21"}.items():
        t.cell(r, c).text = text
    t.cell(1, 0).merge(t.cell(2, 0)).text = "East"
    t.cell(0, 1).merge(t.cell(0, 2)).text = "Years"
    d.save(str(tmp_path / "merged.docx"))
    table = next(b.text for b in parse_document(source(tmp_path / "merged.docx"), ParseOptions()).blocks
                 if b.kind == "table")
    assert table.split("\n") == ["| Region | Years | Years |", "|---|---|---|", "| East | 10 | 11 |",
                                 "| East | 20 | 21 |"]
    # hostile spans are clamped: no grid of a billion cells
    md = html_table_to_markdown('<table><tr><td colspan="999999999" rowspan="999999999">x</td></tr>'
                                '<tr><td>y</td></tr></table>')
    assert md.count("\n") == 2 and md.count("x") <= 1000


# --- 6. sidecar metadata cannot overwrite what the pipeline records -----------------------------------------

def test_sidecar_keys_do_not_overwrite_pipeline_metadata(tmp_path: Path) -> None:
    doc = pymupdf.open()
    doc.new_page()
    doc.new_page().insert_text((72, 72), "Second page text.")
    doc.save(tmp_path / "two.pdf")
    sidecar = '{"ocr_pages": 5, "low_confidence_pages": [], "pages_without_text": [], "region": "East", "lang": "zh"}'
    parsed = parse_document(source(tmp_path / "two.pdf", sidecar), ParseOptions())
    meta = parsed.metadata
    assert meta["pages_without_text"] == [1] and "ocr_pages" not in meta and "low_confidence_pages" not in meta
    assert meta["region"] == "East" and meta["lang"] == "zh"  # the user's own keys (and language) stay
    assert meta["sidecar_conflicts"] == {"ocr_pages": 5, "low_confidence_pages": [], "pages_without_text": []}


# --- 7. data: URIs are not text ------------------------------------------------------------------------------

def test_huge_data_uri_in_html_is_not_text(tmp_path: Path) -> None:
    blob = base64.b64encode(os.urandom(3_000_000)).decode()
    html = (f'<html><body><p>Before the image.</p><img alt="chart" src="data:image/png;base64,{blob}">'
            f'<p>After <a href="data:text/plain;base64,{blob[:100_000]}">the link</a>.</p>'
            f'<p>data:image/png;base64,{blob[:50_000]}</p>'
            f'<div style="background:url(data:image/png;base64,{blob[:10_000]})">Styled text.</div></body></html>')
    (tmp_path / "page.html").write_text(html)
    parsed = parse_document(source(tmp_path / "page.html"), ParseOptions())
    text = "\n".join(b.text for b in parsed.blocks)
    assert "Before the image." in text and "Styled text." in text and "the link" in text
    assert len(text) < 200, text[:300]
    assert "base64" not in text
