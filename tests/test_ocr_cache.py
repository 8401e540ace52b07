"""The OCR cache (corpusync/adapters/ocr_cache.py): a reading round-trips exactly, a damaged file is a miss,
pruning goes by last use, the key follows the pixels and the engine; a scan parsed once is not OCRed again
under another name (the engine made to fail proves it), in process and through the isolated parse pool."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from corpusync.adapters.ocr import OcrLine, OcrResult, RapidOcrEngine
from corpusync.adapters.ocr_cache import OcrPageCache, page_key, prune_ocr_cache
from corpusync.core.errors import ParseError
from schemas.records import ParseOptions, SourceFile
from schemas.settings import Settings
from tasks.parse import parse_document
from tasks.parse_worker import ParsePool
from tests.conftest import TEST_DATA

LETTER = TEST_DATA / "corpus" / "pdfplumber-test-pdfs" / "zh" / "pr-136-example"
SCAN = next(p for p in (Path(f"{LETTER}.pdf"), Path(f"{LETTER}-p1-2.pdf")) if p.is_file())  # or its excerpt


class Engine:
    name, model, version = "scripted", "m", "1"


def test_a_reading_round_trips_and_a_damaged_one_is_a_miss(tmp_path: Path) -> None:
    cache = OcrPageCache(tmp_path)
    lines = [OcrLine("第一条 甲方", 0.9871234567, (1.5, 2.25, 300.125, 40.0)), OcrLine("b", 0.5, (0, 0, 1, 1))]
    reading = OcrResult(lines, "rapidocr", "PP-OCRv6", rotation=90)
    assert cache.get("ab" * 32) is None
    cache.put("ab" * 32, reading)
    assert cache.get("ab" * 32) == reading
    (tmp_path / "ab" / f"{'ab' * 32}.json").write_text('{"lines": [["cut', encoding="utf-8")
    assert cache.get("ab" * 32) is None
    assert not (tmp_path / "ab" / f"{'ab' * 32}.json").exists()  # removed: the next reading is kept anew


def test_a_cache_that_cannot_be_written_warns_once_and_parsing_goes_on(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "file").write_text("not a folder")
    cache = OcrPageCache(tmp_path / "file")
    reading = OcrResult([OcrLine("x", 1.0, (0, 0, 1, 1))], "e", "m")
    with caplog.at_level(logging.WARNING, logger="corpusync.adapters.ocr_cache"):
        cache.put("aa" + "0" * 62, reading)
        cache.put("bb" + "0" * 62, reading)
    warned = [r.getMessage().split(" (")[0] for r in caplog.records]
    assert warned == [f"cannot keep OCR readings in {tmp_path / 'file'}"]
    assert cache.get("aa" + "0" * 62) is None


def test_readings_not_used_for_the_ttl_are_pruned(tmp_path: Path) -> None:
    cache = OcrPageCache(tmp_path)
    reading = OcrResult([OcrLine("x", 1.0, (0, 0, 1, 1))], "e", "m")
    cache.put("aa" + "0" * 62, reading)
    cache.put("bb" + "0" * 62, reading)
    old = time.time() - 10 * 3600
    for key in ("aa", "bb"):
        os.utime(tmp_path / key / f"{key}{'0' * 62}.json", (old, old))
    assert cache.get("aa" + "0" * 62) == reading  # a hit is a use
    assert prune_ocr_cache(tmp_path, ttl_h=5) == 1
    assert [p.name[:2] for p in tmp_path.glob("*/*.json")] == ["aa"]
    # a refresh's pruning walks the cache at most every_s seconds
    later = time.time() + 6 * 3600
    assert prune_ocr_cache(tmp_path, ttl_h=5, now=later, every_s=7 * 3600) == 0
    assert prune_ocr_cache(tmp_path, ttl_h=5, now=later + 7 * 3600, every_s=7 * 3600) == 1
    assert prune_ocr_cache(tmp_path / "absent", ttl_h=5) == 0


def test_the_key_follows_the_pixels_the_engine_and_the_logic() -> None:
    page = np.zeros((20, 10, 3), dtype=np.uint8)
    key = page_key(Engine(), page, "10")
    assert page_key(Engine(), page.copy(), "10") == key
    assert page_key(Engine(), page[:, ::-1], "10") == key  # a view that is not contiguous: the same pixels
    other = page.copy()
    other[3, 4, 1] = 1
    newer = Engine()
    newer.version = "2"
    assert len({key, page_key(Engine(), other, "10"), page_key(newer, page, "10"), page_key(Engine(), page, "11"),
                page_key(Engine(), page.reshape(10, 20, 3), "10")}) == 5


def test_settings_put_the_cache_under_the_home(tmp_path: Path) -> None:
    assert Settings(home=tmp_path).parse_options().ocr_cache_dir == str(tmp_path / "ocr-cache")
    assert Settings(home=tmp_path, ocr_cache=False).parse_options().ocr_cache_dir is None


def _source(path: Path, name: str) -> SourceFile:
    data = path.read_bytes()
    return SourceFile(name, path, len(data), datetime.now(UTC), hashlib.sha256(data).hexdigest())


def _failing(self: RapidOcrEngine, image: np.ndarray, *, classify_lines: bool = True) -> OcrResult:
    raise RuntimeError("the engine was asked to read a page")


@pytest.mark.slow
def test_a_scan_parsed_once_is_not_read_again_under_another_name(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    options = ParseOptions(ocr_cache_dir=str(tmp_path / "cache"), ocr_max_pages=1)
    first = parse_document(_source(SCAN, "scans/letter.pdf"), options)
    assert first.metadata["ocr_pages"][0]["page"] == 1 and len(list((tmp_path / "cache").glob("*/*.json"))) == 1
    moved = tmp_path / "archive-letter.pdf"
    shutil.copy(SCAN, moved)
    monkeypatch.setattr(RapidOcrEngine, "recognise", _failing)
    again = parse_document(_source(moved, "archive/letter.pdf"), options)
    assert again.blocks == first.blocks and again.metadata == first.metadata
    with pytest.raises(ParseError, match="the engine was asked to read a page") as info:
        parse_document(_source(moved, "archive/letter.pdf"), ParseOptions(ocr_max_pages=1))  # no cache: it reads
    assert info.value.reason == "ocr-error"


@pytest.mark.slow
def test_the_parse_pool_workers_share_the_cache(tmp_path: Path) -> None:
    options = ParseOptions(ocr_cache_dir=str(tmp_path / "cache"), ocr_max_pages=1)
    with ParsePool(options, workers=1, timeout_s=300, memory_mb=4096, warm_for=[".pdf"]) as pool:
        pooled = pool.parse(_source(SCAN, "letter.pdf"))
    assert len(list((tmp_path / "cache").glob("*/*.json"))) == 1
    assert parse_document(_source(SCAN, "letter.pdf"), options).blocks == pooled.blocks
