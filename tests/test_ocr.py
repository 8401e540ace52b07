"""recognise_page's orientation passes (a scripted engine: which passes run, which reading is kept) and the
real RapidOCR engine on a scanned letter upright, sideways both ways and upside down; the engine's
onnxruntime settings (memory arena on, threads that sleep instead of spinning)."""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pymupdf
import pytest
from PIL import Image

from corpusync.adapters.ocr import (
    EMPTY_PAGE_WARNING,
    OcrLine,
    OcrResult,
    RapidOcrEngine,
    build_ocr_engine,
    lines_to_paragraphs,
    not_an_empty_page,
    recognise_page,
)
from schemas.records import ParseOptions, SourceFile
from tasks.parse import parse_document
from tests.conftest import TEST_DATA

LETTER = "pdfplumber-test-pdfs/zh/pr-136-example"


def _lines(n: int, score: float, *, vertical: bool) -> list[OcrLine]:
    if vertical:
        return [OcrLine("天健会计师事务所", score, (10.0 + 40 * i, 10.0, 40.0 + 40 * i, 300.0)) for i in range(n)]
    return [OcrLine("天健会计师事务所", score, (10.0, 10.0 + 40 * i, 300.0, 40.0 + 40 * i)) for i in range(n)]


class Scripted:
    """Returns the scripted reading for each pass: the first (k=0), then turned 90 (k=1), then 270 (k=3)."""

    name, model, version = "scripted", "m", "1"

    def __init__(self, readings: dict[int, list[OcrLine]]) -> None:
        self.readings = readings
        self.calls: list[tuple[int, bool]] = []

    def recognise(self, image: np.ndarray, *, classify_lines: bool = True) -> OcrResult:
        k = (0, 1, 3)[len(self.calls)]
        self.calls.append((k, classify_lines))
        return OcrResult(list(self.readings[k]), self.name, self.model)


PORTRAIT = np.zeros((400, 300, 3), dtype=np.uint8)


def test_an_upright_page_is_read_once_with_the_line_classifier() -> None:
    engine = Scripted({0: _lines(5, 0.99, vertical=False)})
    result = recognise_page(engine, PORTRAIT)
    assert engine.calls == [(0, True)] and result.rotation == 0


def test_a_sideways_page_is_turned_upright_with_the_turned_passes_unclassified() -> None:
    # turned 90 it is upside down (garbage without the classifier); turned 270 it reads as well as the first
    # reading, in horizontal lines: that one is kept, though it is not 1.2x better
    engine = Scripted({0: _lines(5, 0.99, vertical=True), 1: _lines(3, 0.5, vertical=False),
                                 3: _lines(5, 0.98, vertical=False)})
    result = recognise_page(engine, PORTRAIT)
    assert engine.calls == [(0, True), (1, False), (3, False)] and result.rotation == 270


def test_a_sideways_page_upright_at_the_first_turn_needs_no_third_pass() -> None:
    engine = Scripted({0: _lines(5, 0.99, vertical=True), 1: _lines(5, 0.99, vertical=False)})
    result = recognise_page(engine, PORTRAIT)
    assert engine.calls == [(0, True), (1, False)] and result.rotation == 90


def test_vertical_writing_that_reads_worse_turned_stays_as_it_is() -> None:
    engine = Scripted({0: _lines(5, 0.99, vertical=True), 1: _lines(5, 0.6, vertical=False),
                                 3: _lines(5, 0.6, vertical=False)})
    assert recognise_page(engine, PORTRAIT).rotation == 0 and len(engine.calls) == 3


def test_a_badly_read_landscape_page_needs_a_clearly_better_turned_reading() -> None:
    landscape = np.zeros((300, 400, 3), dtype=np.uint8)
    engine = Scripted({0: _lines(2, 0.5, vertical=False), 1: _lines(2, 0.55, vertical=False),
                                  3: _lines(2, 0.9, vertical=False)})
    assert recognise_page(engine, landscape).rotation == 270 and len(engine.calls) == 3


# --- the real engine --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def letter_page() -> np.ndarray:
    """Page 1 of the scanned auditor letter at 100 dpi (the full file, else its bundled excerpt)."""
    corpus = TEST_DATA / "corpus"
    path = next(p for p in (corpus / f"{LETTER}.pdf", corpus / f"{LETTER}-p1-2.pdf") if p.is_file())
    with pymupdf.open(path) as doc:
        pix = doc[0].get_pixmap(dpi=100, colorspace="rgb", alpha=False)
    return np.frombuffer(pix.samples, dtype=np.uint8).reshape(pix.height, pix.width, 3).copy()


@pytest.mark.slow
@pytest.mark.parametrize(("k", "rotation", "passes"), [(0, 0, 1), (1, 270, 3), (3, 90, 2), (2, 0, 1)])
def test_real_scan_in_every_orientation(letter_page: np.ndarray, k: int, rotation: int, passes: int) -> None:
    """Sideways both ways: turned upright, the letterhead first; upside down: the line classifier turns
    each line (one pass; the line order stays the page's)."""
    engine = build_ocr_engine("rapidocr")
    assert isinstance(engine, RapidOcrEngine)
    calls = []
    real = engine.recognise

    def counting(image: np.ndarray, *, classify_lines: bool = True) -> OcrResult:
        calls.append(classify_lines)
        return real(image, classify_lines=classify_lines)

    engine.recognise = counting  # type: ignore[method-assign]
    try:
        result = recognise_page(engine, np.ascontiguousarray(np.rot90(letter_page, k)))
    finally:
        del engine.recognise
    paragraphs = lines_to_paragraphs(result.lines)
    assert result.rotation == rotation and len(calls) == passes and result.confidence > 0.95
    assert "天健会计师事务所" in "".join(paragraphs)
    if k != 2:
        assert "天健会计师事务所" in paragraphs[0]


def test_rapidocr_sessions_use_the_arena_and_do_not_spin() -> None:
    engine = build_ocr_engine("rapidocr")
    assert isinstance(engine, RapidOcrEngine)
    ocr = engine._load()
    for model in (ocr.text_det, ocr.text_cls, ocr.text_rec):
        opts = model.session.session.get_session_options()
        assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert opts.enable_cpu_mem_arena and opts.intra_op_num_threads == engine.threads


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_an_image_without_text_draws_no_warning_from_the_engine() -> None:
    """RapidOCR warns, in colour on stderr, of every image it finds no text in (a refresh of the shared
    corpus printed four); the parse reports that outcome in its own words."""
    engine = build_ocr_engine("rapidocr")
    assert isinstance(engine, RapidOcrEngine)
    engine._load()
    log, kept = logging.getLogger("RapidOCR"), _Kept()
    blank = np.full((200, 300, 3), 255, dtype=np.uint8)
    log.addHandler(kept)
    try:
        assert engine.recognise(blank).lines == [] and kept.messages == []
        log.removeFilter(not_an_empty_page)  # the control: RapidOCR still warns, in the words filtered out
        engine.recognise(blank)
        assert kept.messages == [EMPTY_PAGE_WARNING]
    finally:
        log.addFilter(not_an_empty_page)
        log.removeHandler(kept)


@pytest.mark.slow
def test_a_multi_frame_image_past_the_page_cap_records_the_frames_it_skipped(letter_page: np.ndarray,
                                                                             tmp_path: Path) -> None:
    """A scanned fax (TIFF, a frame per page) with more frames than CORPUSYNC_OCR_MAX_PAGES: the first frames
    are OCRed, the others counted and recorded, not silently dropped."""
    frames = [Image.fromarray(letter_page), Image.fromarray(letter_page[::2, ::2].copy()), Image.new("RGB", (80, 60))]
    path = tmp_path / "fax.tiff"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    data = path.read_bytes()
    src = SourceFile("fax.tiff", path, len(data), datetime.now(UTC), hashlib.sha256(data).hexdigest())
    doc = parse_document(src, ParseOptions(ocr_max_pages=1))
    assert doc.page_count == 3 and [p["page"] for p in doc.metadata["ocr_pages"]] == [1]
    assert doc.metadata["ocr_skipped_pages"] == [2, 3]
    assert "天健会计师事务所" in "".join(b.text for b in doc.blocks)
