"""OCR behind a small protocol. Default engine: RapidOCR running PaddleOCR's PP-OCR models (the ONNX files
its wheel ships: offline, CPU). `paddleocr` is optional, for GPU, with local model directories only.

Heavy imports (onnxruntime, paddle) happen on first use, so the CLI starts fast.
"""

from __future__ import annotations

import logging
import re
import statistics
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from corpusync.errors import ConfigError, OcrError
from corpusync.lexical import is_cjk


@dataclass(frozen=True)
class OcrLine:
    text: str
    score: float
    box: tuple[float, float, float, float]  # x0, y0, x1, y1 in image pixels


@dataclass
class OcrResult:
    lines: list[OcrLine]
    engine: str
    model: str
    rotation: int = 0  # degrees the image was turned before recognition
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def confidence(self) -> float:
        """Mean line confidence weighted by line length (0 when nothing was recognised)."""
        total = sum(len(ln.text) for ln in self.lines)
        return sum(ln.score * len(ln.text) for ln in self.lines) / total if total else 0.0

    @property
    def weight(self) -> float:
        return sum(ln.score * len(ln.text) for ln in self.lines)


class OcrEngine(Protocol):
    name: str
    model: str
    version: str

    def recognise(self, image: np.ndarray) -> OcrResult: ...


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


class RapidOcrEngine:
    """PP-OCRv6 detection + recognition (+ the text-line direction classifier) through RapidOCR."""

    name = "rapidocr"

    def __init__(self) -> None:
        self.version = _version("rapidocr")
        self._engine: Any = None
        self.model = "PP-OCR"

    def _load(self) -> Any:
        if self._engine is None:
            logging.getLogger("RapidOCR").setLevel(logging.WARNING)
            from rapidocr import RapidOCR

            self._engine = RapidOCR(params={"Global.log_level": "warning"})
            import rapidocr

            models = sorted(p.stem for p in (Path(str(rapidocr.__file__)).parent / "models").glob("*.onnx"))
            self.model = "+".join(models) or "PP-OCR"
        return self._engine

    def recognise(self, image: np.ndarray) -> OcrResult:
        out = self._load()(image, use_cls=True)
        lines = []
        for box, text, score in zip(out.boxes if out.boxes is not None else [], out.txts or (), out.scores or (),
                                    strict=False):
            b = np.asarray(box)
            lines.append(OcrLine(str(text), float(score), (float(b[:, 0].min()), float(b[:, 1].min()),
                                                            float(b[:, 0].max()), float(b[:, 1].max()))))
        return OcrResult(lines, self.name, self.model)


class PaddleOcrEngine:
    """PaddleOCR (GPU when paddle has CUDA) with PP-OCR models from local directories (it cannot start
    offline otherwise: it downloads models at start)."""

    name = "paddleocr"

    def __init__(self, model_dir: Path) -> None:
        det, rec = model_dir / "det", model_dir / "rec"
        if not det.is_dir() or not rec.is_dir():
            raise ConfigError(f"paddleocr needs local model folders {det} and {rec} (Paddle inference format)")
        try:
            from paddleocr import PaddleOCR
        except ImportError as exc:
            raise ConfigError("CORPUSYNC_OCR_ENGINE=paddleocr but paddleocr is not installed") from exc
        self.version = _version("paddleocr")
        self.model = f"{det.resolve().name}+{rec.resolve().name}"
        self._engine = PaddleOCR(text_detection_model_dir=str(det), text_recognition_model_dir=str(rec),
                                 use_doc_orientation_classify=False, use_doc_unwarping=False,
                                 use_textline_orientation=False)

    def recognise(self, image: np.ndarray) -> OcrResult:
        lines = []
        for page in self._engine.predict(image):
            for text, score, box in zip(page["rec_texts"], page["rec_scores"], page["rec_boxes"], strict=False):
                x0, y0, x1, y1 = (float(v) for v in box)
                lines.append(OcrLine(str(text), float(score), (x0, y0, x1, y1)))
        return OcrResult(lines, self.name, self.model)


@cache
def build_ocr_engine(name: str, model_dir: str | None = None) -> OcrEngine | None:
    """One engine per process (model sessions are expensive). 'none' disables OCR."""
    if name == "none":
        return None
    if name == "rapidocr":
        return RapidOcrEngine()
    if name == "paddleocr":
        if not model_dir:
            raise ConfigError("CORPUSYNC_OCR_ENGINE=paddleocr needs CORPUSYNC_OCR_MODEL_DIR (det/ and rec/ inside)")
        return PaddleOcrEngine(Path(model_dir))
    raise ConfigError(f"unknown OCR engine {name!r}: use rapidocr, paddleocr or none")


def _mostly_vertical(result: OcrResult) -> bool:
    boxes = [ln.box for ln in result.lines if len(ln.text) >= 2]
    if len(boxes) < 3:
        return False
    tall = sum(1 for x0, y0, x1, y1 in boxes if (y1 - y0) > 1.5 * (x1 - x0))
    return tall > 0.6 * len(boxes)


_OUT_OF_MEMORY = re.compile(r"(?i)out of memory|bad_alloc|failed to allocate|cannot allocate")


def _recognise(engine: OcrEngine, image: np.ndarray) -> OcrResult:
    """engine.recognise with its failures typed: MemoryError when it ran out of memory (onnxruntime and paddle
    raise RuntimeErrors for that), OcrError for anything else, so the parser can tell them from a bad file."""
    try:
        return engine.recognise(image)
    except MemoryError:
        raise
    except Exception as exc:
        if _OUT_OF_MEMORY.search(str(exc)):
            raise MemoryError(f"{engine.name} ran out of memory: {exc}") from exc
        raise OcrError(f"{engine.name} failed: {type(exc).__name__}: {exc}") from exc


def recognise_page(engine: OcrEngine, image: np.ndarray) -> OcrResult:
    """OCR an image; when the recognised lines run mostly vertically (a page scanned sideways), also try it
    turned 90 degrees both ways and keep the reading with the most confident text. Raises OcrError when the
    engine fails, MemoryError when it runs out of memory."""
    best = _recognise(engine, image)
    if _mostly_vertical(best) or (best.confidence < 0.6 and image.shape[0] < image.shape[1]):
        for k, degrees in ((1, 90), (3, 270)):
            turned = _recognise(engine, np.ascontiguousarray(np.rot90(image, k)))
            turned.rotation = degrees
            if turned.weight > best.weight * 1.2:
                best = turned
    return best


def lines_to_paragraphs(lines: list[OcrLine]) -> list[str]:
    """Reading order (top to bottom, then left to right on the same line); a vertical gap larger than the
    usual line height starts a paragraph. Chinese lines join without a space, others with one."""
    return [text for text, _, _ in paragraphs_with_extent(lines)]


def paragraphs_with_extent(lines: list[OcrLine]) -> list[tuple[str, float, float]]:
    """Like lines_to_paragraphs, with each paragraph's top and bottom (pixels), to find running headers."""
    if not lines:
        return []
    heights = [ln.box[3] - ln.box[1] for ln in lines if ln.text.strip()]
    h = statistics.median(heights) if heights else 10.0
    ordered = sorted(lines, key=lambda ln: (round(((ln.box[1] + ln.box[3]) / 2) / max(h * 0.7, 1.0)), ln.box[0]))
    paragraphs: list[list[str]] = []
    extents: list[list[float]] = []
    prev_bottom: float | None = None
    for ln in ordered:
        text = ln.text.strip()
        if not text:
            continue
        if prev_bottom is None or ln.box[1] - prev_bottom > 0.9 * h:
            paragraphs.append([])
            extents.append([ln.box[1], ln.box[3]])
            prev_bottom = ln.box[3]
        paragraphs[-1].append(text)
        prev_bottom = max(prev_bottom, ln.box[3])
        extents[-1] = [min(extents[-1][0], ln.box[1]), max(extents[-1][1], ln.box[3])]
    out = []
    for para, (top, bottom) in zip(paragraphs, extents, strict=True):
        s = para[0]
        for nxt in para[1:]:
            joiner = "" if (s[-1:] and is_cjk(s[-1])) or is_cjk(nxt[0]) else " "
            s = s[:-1] + nxt if s.endswith("-") and nxt[:1].islower() else s + joiner + nxt
        out.append((s, top, bottom))
    return out
