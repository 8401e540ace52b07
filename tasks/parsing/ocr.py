"""OCR of page images (a rendered PDF page, an image file frame by frame) into paragraphs and blocks; the
PDF parser calls _ocr_paragraphs through this module, so one seam sees every page the engine reads."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from corpusync.core.errors import ConfigError, OcrError, ParseError
from schemas.records import Block, ParsedDocument, ParseOptions, SourceFile
from tasks.parsing.common import OCR_READ_VERSION, clean_text
from tasks.parsing.layout import MARGIN_BAND, PageBlock
from tasks.parsing.limits import MAX_PIXELS

if TYPE_CHECKING:
    import numpy as np

    from corpusync.adapters.ocr import OcrEngine, OcrResult


def _render(page: object, dpi: int) -> object:
    import numpy as np

    pix = page.get_pixmap(dpi=dpi, colorspace="rgb", alpha=False)  # type: ignore[attr-defined]
    return np.frombuffer(pix.samples, dtype=np.uint8).reshape(pix.height, pix.width, 3).copy()


def _ocr_engine(options: ParseOptions) -> OcrEngine | None:
    from corpusync.adapters.ocr import build_ocr_engine

    return build_ocr_engine(options.ocr_engine, options.ocr_model_dir)


def _read_page(engine: OcrEngine, image: np.ndarray, options: ParseOptions) -> OcrResult:
    """recognise_page, through the OCR cache when there is one (options.ocr_cache_dir): a page image read
    before by the same engine, models and logic is not read again."""
    from corpusync.adapters.ocr import recognise_page

    if not options.ocr_cache_dir:
        return recognise_page(engine, image)
    from corpusync.adapters.ocr_cache import OcrPageCache, page_key

    cache = OcrPageCache(Path(options.ocr_cache_dir))
    key = page_key(engine, image, OCR_READ_VERSION)
    result = cache.get(key)
    if result is None:
        result = recognise_page(engine, image)
        cache.put(key, result)
    return result


def _ocr_paragraphs(image: object, page_no: int | None, options: ParseOptions, reason: str,
                    record: list[dict]) -> list[PageBlock]:
    """OCR one page image: its paragraphs, margin-band ones with their position (see PageBlock)."""
    from corpusync.adapters.ocr import fit_to_engine, paragraphs_with_extent

    engine = _ocr_engine(options)
    assert engine is not None
    image = fit_to_engine(engine, image)  # type: ignore[arg-type]
    result = _read_page(engine, image, options)
    conf = result.confidence
    record.append({"page": page_no, "reason": reason, "engine": f"{engine.name} {engine.version}",
                   "model": result.model, "confidence": round(conf, 4), "lines": len(result.lines),
                   "rotation": result.rotation, "low_confidence": conf < options.ocr_min_confidence})
    height = float(image.shape[1] if result.rotation in (90, 270) else image.shape[0])
    band = MARGIN_BAND * height
    # lines in the top / bottom bands are paragraphed on their own, so a running header never merges
    # into the body text below it
    top = [ln for ln in result.lines if ln.box[3] <= band]
    bottom = [ln for ln in result.lines if ln.box[1] >= height - band and ln.box[3] > band]
    body = [ln for ln in result.lines if ln not in top and ln not in bottom]
    out: list[PageBlock] = [(t, (a + b) / 2 / height) for t, a, b in paragraphs_with_extent(top) if t.strip()]
    out += [(t, None) for t, _, _ in paragraphs_with_extent(body) if t.strip()]
    out += [(t, (a + b) / 2 / height) for t, a, b in paragraphs_with_extent(bottom) if t.strip()]
    return out


def recorded_engine(record: list[dict]) -> tuple[str | None, str | None]:
    """The OCR engine's name and version that read a document's pages, from their records (None: none read)."""
    if not record:
        return None, None
    name, version = record[0]["engine"].split(" ", 1)
    return name, version


def _ocr_blocks(image: object, page_no: int | None, options: ParseOptions, reason: str,
                record: list[dict]) -> list[Block]:
    return [Block("ocr", t, page_no) for t in (clean_text(p) for p, _ in
                                                _ocr_paragraphs(image, page_no, options, reason, record)) if t]


def _parse_image(src: SourceFile, data: bytes, options: ParseOptions) -> ParsedDocument:
    """OCR an image, frame by frame (a multi-page TIFF), each checked against MAX_PIXELS before it is decoded."""
    import io
    import itertools
    import warnings

    import numpy as np
    from PIL import Image, ImageSequence, UnidentifiedImageError

    if options.ocr_engine == "none":
        raise ParseError(src.path, "no-text", "an image needs OCR, and OCR is off (CORPUSYNC_OCR_ENGINE=none)")
    record: list[dict] = []
    blocks: list[Block] = []
    frames = 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # checked below, by frame
            img = Image.open(io.BytesIO(data))
        for frames, frame in enumerate(itertools.islice(ImageSequence.Iterator(img), options.ocr_max_pages), 1):
            w, h = frame.size
            if w * h > MAX_PIXELS:
                raise ParseError(src.path, "oversized", f"frame {frames} is {w:,} x {h:,} = {w * h / 1e6:,.0f} M "
                                 f"pixels, over the limit of {MAX_PIXELS / 1e6:.0f} M pixels (a pixel bomb?)")
            rgb = np.ascontiguousarray(np.asarray(frame.convert("RGB")))
            blocks += _ocr_blocks(rgb, frames, options, "image", record)
    except Image.DecompressionBombError as exc:
        raise ParseError(src.path, "oversized", f"too many pixels to decode: {exc}") from exc
    except (OcrError, ConfigError) as exc:
        raise ParseError(src.path, "ocr-error", f"OCR of frame {frames} failed: {exc}") from exc
    except (UnidentifiedImageError, OSError, ValueError, EOFError) as exc:
        raise ParseError(src.path, "corrupt", f"not a readable image: {exc}") from exc
    if not blocks:
        raise ParseError(src.path, "no-text", "OCR found no text in the image")
    engine, version = recorded_engine(record)
    assert version is not None  # blocks were read, so pages were recorded
    total = max(getattr(img, "n_frames", frames), frames)  # frames past ocr_max_pages: counted and recorded
    metadata: dict = {"ocr_pages": record, "low_confidence_pages": [r["page"] for r in record if r["low_confidence"]]}
    if total > frames:
        metadata["ocr_skipped_pages"] = list(range(frames + 1, total + 1))
    return ParsedDocument(
        src, blocks, parser="ocr", parser_version=version, media_type=Image.MIME.get(img.format or "", "image"),
        page_count=total, ocr_engine=engine, ocr_engine_version=version, metadata=metadata,
    )
