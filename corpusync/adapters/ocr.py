"""OCR behind a small protocol. Default engine: RapidOCR running PaddleOCR's PP-OCR models (the ONNX files
its wheel ships: offline, CPU). `paddleocr` is optional, for GPU, with local model directories only.

Heavy imports (onnxruntime, paddle) happen on first use, so the CLI starts fast.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from corpusync.core.cpus import usable_cpus
from corpusync.core.errors import ConfigError, OcrError
from corpusync.core.unicode_text import is_cjk


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

    def recognise(self, image: np.ndarray, *, classify_lines: bool = True) -> OcrResult:
        """classify_lines=False: skip the text-line direction classifier (where the engine has one), so a line
        that is upside down reads as garbage instead of being turned: recognise_page tells a page's two
        sideways orientations apart by that."""
        ...


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


# RapidOCR's settings that differ from its defaults; none changes what is recognised but rec_batch_num (see
# bench/ocr_speed.py: same text on the measured pages, confidence within 0.002 on the scans)
RAPIDOCR_PARAMS: dict[str, Any] = {
    "Global.log_level": "warning",
    # onnxruntime's memory arena keeps the activation buffers from page to page. Without it (RapidOCR's
    # default) every run maps fresh ones: ~700,000 page faults a page, a third of the CPU time in the kernel.
    "EngineConfig.onnxruntime.enable_cpu_mem_arena": True,
    # one text line per recognition run: no padding to the widest line of a batch, and with the arena a
    # smaller high-water mark (+300 MB for a worker against +770 MB at RapidOCR's 6)
    "Rec.rec_batch_num": 1,
    # RapidOCR's default, stated: detection runs on the image reduced to this longest side (fit_to_engine)
    "Global.max_side_len": 2000,
}


def fit_to_engine(engine: OcrEngine, image: np.ndarray) -> np.ndarray:
    """The image the engine would read: RapidOCR reduces anything over its max side before detection, and
    crops the lines from the reduced image. Done first, the same way (RapidOCR's own function), the page's
    orientation passes and RapidOCR's conversions copy 4 Mpx instead of a 36 Mpx scan: a worker OCRing a
    6,000 x 6,000 image held 1.25 GB (bench/hostile.py). What is recognised is the same; the boxes come in
    the reduced image's coordinates (paragraphs follow the median line height, not pixels)."""
    side = getattr(engine, "max_side", None)
    if not side or max(image.shape[:2]) <= side:
        return image
    try:
        from rapidocr.utils.process_img import reduce_max_side
    except ImportError:  # another layout: the engine reduces it itself
        return image
    reduced: np.ndarray = reduce_max_side(image, side)[0]
    return reduced


@contextmanager
def _sessions_without_spinning() -> Iterator[None]:
    """While RapidOCR creates its onnxruntime sessions, have their worker threads sleep between operators
    instead of spinning (onnxruntime's default). RapidOCR has no setting for it. Spinning threads fight over
    the CPUs with the other parse worker and the embedder: with one of 2 cores free a page took twice as long
    (and sleeping costs ~5% on idle cores)."""
    try:
        from rapidocr.inference_engine.onnxruntime.main import OrtInferSession
    except ImportError:  # another layout: the sessions spin, only slower
        yield
        return
    original = OrtInferSession.__dict__.get("_init_sess_opts")
    if not isinstance(original, staticmethod):
        yield
        return

    def options(cfg: Any) -> Any:
        opts = original.__func__(cfg)
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return opts

    OrtInferSession._init_sess_opts = staticmethod(options)  # type: ignore[method-assign]
    try:
        yield
    finally:
        OrtInferSession._init_sess_opts = original  # type: ignore[method-assign]


def _normalise_in_float32(engine: Any) -> None:
    """RapidOCR normalises the detector's input with float64 mean/std lists, so a 2,000-px page becomes
    float64 temporaries (70 MB each) that are cast back to float32 for the model: ~1 s a page of page faults
    and copies. The same mean and std as float32 keep the arithmetic in float32 (the model's input differs
    by rounding only)."""
    det = getattr(engine, "text_det", None)
    for name in ("mean", "std"):
        value = getattr(det, name, None)
        if value is not None:
            setattr(det, name, np.asarray(value, dtype=np.float32))


LARGE_BUFFER_MIB = 256
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


@cache
def keep_large_buffers() -> bool:
    """Have glibc serve allocations up to 256 MiB from the heap, and keep freed heap up to that, instead of
    mapping fresh zeroed pages for every array past its 32 MiB ceiling. OCR allocates and frees page-sized
    arrays (tens of MB) many times a page: a 6-page scan took 433,000 page faults and 17 s of kernel time
    in 23 s of wall time; with this, 259,000 and 6 s (16 s wall). Process-wide, so it is done where OCR runs
    (a parse worker); the worker hands freed memory back between documents (malloc_trim). False where
    the C library is not glibc."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    size = LARGE_BUFFER_MIB << 20
    return bool(libc.mallopt(M_MMAP_THRESHOLD, size)) and bool(libc.mallopt(M_TRIM_THRESHOLD, size))


EMPTY_PAGE_WARNING = "The text detection result is empty"


def not_an_empty_page(record: logging.LogRecord) -> bool:
    """A filter for RapidOCR's logger: it warns (in colour, on stderr) of every image it finds no text in, an
    outcome the parse reports in its own words (blank pages, a quarantine that names the file)."""
    return record.getMessage() != EMPTY_PAGE_WARNING


def _rapidocr_models() -> str:
    """The ONNX models RapidOCR's wheel ships (it loads them from its package), found without importing it."""
    spec = importlib.util.find_spec("rapidocr")
    folder = Path(spec.origin).parent / "models" if spec and spec.origin else None
    models = sorted(p.stem for p in folder.glob("*.onnx")) if folder else []
    return "+".join(models) or "PP-OCR"


class RapidOcrEngine:
    """PP-OCRv6 detection + recognition (+ the text-line direction classifier) through RapidOCR, on
    `threads` onnxruntime threads (default: every CPU this process may use)."""

    name = "rapidocr"

    def __init__(self, threads: int | None = None) -> None:
        self.version = _version("rapidocr")
        self.threads = threads or usable_cpus()
        self.max_side: int = RAPIDOCR_PARAMS["Global.max_side_len"]
        self.params = RAPIDOCR_PARAMS  # what decides its readings besides the models (threads do not)
        self._engine: Any = None
        self.model = _rapidocr_models()

    def _load(self) -> Any:
        if self._engine is None:
            log = logging.getLogger("RapidOCR")
            log.setLevel(logging.WARNING)
            log.addFilter(not_an_empty_page)
            from rapidocr import RapidOCR

            engine = RapidOCR(params=RAPIDOCR_PARAMS | {
                "EngineConfig.onnxruntime.intra_op_num_threads": self.threads})
            with _sessions_without_spinning():  # RapidOCR loads its models on first use: all three now
                for load in ("_load_det_model", "_load_cls_model", "_load_rec_model"):
                    getattr(engine, load, lambda: None)()
            _normalise_in_float32(engine)
            keep_large_buffers()
            self._engine = engine
        return self._engine

    def recognise(self, image: np.ndarray, *, classify_lines: bool = True) -> OcrResult:
        out = self._load()(image, use_cls=classify_lines)
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

    def recognise(self, image: np.ndarray, *, classify_lines: bool = True) -> OcrResult:
        """classify_lines is moot: the pipeline runs without the text-line orientation model."""
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


def _recognise(engine: OcrEngine, image: np.ndarray, **kwargs: Any) -> OcrResult:
    """engine.recognise with its failures typed: MemoryError when it ran out of memory (onnxruntime and paddle
    raise RuntimeErrors for that), OcrError for anything else, so the parser can tell them from a bad file."""
    try:
        return engine.recognise(image, **kwargs)
    except MemoryError:
        raise
    except Exception as exc:
        if _OUT_OF_MEMORY.search(str(exc)):
            raise MemoryError(f"{engine.name} ran out of memory: {exc}") from exc
        raise OcrError(f"{engine.name} failed: {type(exc).__name__}: {exc}") from exc


def recognise_page(engine: OcrEngine, image: np.ndarray) -> OcrResult:
    """OCR an image: one engine pass for an upright page. When the recognised lines run mostly vertically (a
    page scanned sideways) or a landscape page reads badly, also read it turned 90 degrees, each way if
    needed. Those passes skip the line classifier: turned the wrong way a page is upside down and reads as
    garbage, so the two orientations tell apart (with the classifier both read well, one in reverse line
    order). A sideways page turned upright reads about as well as its first reading, now in horizontal
    lines: that one is kept; otherwise a turned reading must have 1.2x the confident text. Raises OcrError
    when the engine fails, MemoryError when it runs out of memory."""
    first = _recognise(engine, image)
    sideways = _mostly_vertical(first)
    if not sideways and not (first.confidence < 0.6 and image.shape[0] < image.shape[1]):
        return first
    best = first
    for k, degrees in ((1, 90), (3, 270)):
        turned = _recognise(engine, np.ascontiguousarray(np.rot90(image, k)), classify_lines=False)
        turned.rotation = degrees
        if sideways and not _mostly_vertical(turned) and turned.weight >= 0.9 * first.weight:
            return turned
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
