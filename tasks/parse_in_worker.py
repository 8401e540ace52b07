"""The side of the parse pool that runs inside a worker process (tasks/parse_worker.py holds the pool in the
parent). It is its own module because pebble's spawned workers import it by module path to run the
initializer and each task: it keeps the imports a worker pays at start-up to what parsing needs (the parsers
themselves are imported by the warm-up, or by the first parse).

init_worker, pebble's initializer, ties the worker to the refresh's life, applies the memory limit (an
address-space rlimit, Linux/macOS) and warms up: it imports the parsers by parsing tiny samples of the
formats the batch holds (tasks/parse_warmup.py), so the parse clock, which pebble starts when a worker takes a
document, never counts start-up. A worker that cannot set its memory limit says so with every result.

parse_one is one task: the page count of a PDF (PyMuPDF) or multi-frame TIFF (Pillow) where asked (opening a
hostile PDF is exactly what can crash a process, so it happens here, not in the parent), then the parse. A
document whose text passes ParseOptions.max_chars never leaves the worker: it is 'oversized'. Between
documents the worker hands freed memory back once it has grown (_release_freed_memory).
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from corpusync.core.errors import ParseError
from corpusync.core.lifetime import watch_parent
from schemas.records import ParsedDocument, SourceFile
from tasks.parse import ParseOptions
from tasks.parse_warmup import warm_up

ParseFn = Callable[[SourceFile, ParseOptions], ParsedDocument]

log = logging.getLogger(__name__)

_WORKER: dict[str, Any] = {}


def _apply_memory_limit(memory_mb: int) -> str | None:
    """Set the worker's address-space limit; None when it is set (or none is asked for), else why not."""
    if memory_mb <= 0:
        return None
    try:
        import resource
    except ImportError:
        return f"the memory limit of {memory_mb} MiB cannot be applied: no resource module on this platform"
    limit = memory_mb * 1024 * 1024
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ValueError, OSError) as exc:
        return (f"the memory limit of {memory_mb} MiB could not be applied: setrlimit(RLIMIT_AS) failed: "
                f"{type(exc).__name__}: {exc}")
    return None


def init_worker(options: ParseOptions, memory_mb: int, parse: ParseFn, warm: tuple[str, ...],
                parent: int, warm_dir: str) -> None:
    """pebble's initializer: tied to the refresh's life (a worker busy warming up or parsing when the refresh
    is SIGKILLed exits within a fraction of a second), memory limit (it bounds the warm-up too), then the
    warm-up. It never raises: a failing initializer would make pebble declare the whole pool broken."""
    watch_parent(parent)
    _WORKER.update(options=options, memory_mb=memory_mb, parse=parse, problem=_apply_memory_limit(memory_mb))
    try:
        from corpusync.core.offline import apply_offline_defaults

        apply_offline_defaults()
        warm_up(warm, Path(warm_dir) / str(os.getpid()), options)
    except BaseException as exc:  # a warm-up that fails (memory limit) only costs the first parse
        log.debug("parse worker warm-up failed: %s: %s", type(exc).__name__, exc)


def _count_pages(src: SourceFile) -> tuple[str | None, int | None]:
    """The page count that scales the document's deadline (None: unknown), with the memory-limit report."""
    pages: int | None = None
    suffix = Path(src.path).suffix.lower()
    try:
        if src.size > _WORKER["options"].max_bytes:  # the parse refuses it: nothing to scale
            pass
        elif suffix == ".pdf":
            from pymupdf import mupdf

            # MuPDF's own document, not pymupdf.Document: that reads the metadata and the outline on open
            # (0.9 ms a file against 0.3 ms)
            pages = mupdf.fz_count_pages(mupdf.FzDocument(str(src.abs_path)))
        elif suffix in (".tif", ".tiff"):
            from PIL import Image

            with Image.open(src.abs_path) as image:
                pages = int(getattr(image, "n_frames", 1))
        elif suffix in (".docx", ".pptx"):
            from tasks.parsing.office_pictures import count_pictures

            pages = count_pictures(src.abs_path)
    except Exception:  # a file that does not open is the parse's to report
        pages = None
    return _WORKER["problem"], pages


TRIM_ABOVE_MIB = 256  # resident memory above which a worker hands its freed heap back after a document...
TRIM_GROWTH_MIB = 64  # ...once it has grown this much since it last did (each trim makes the next document
# fault its heap pages in again: ~6% of a text PDF's parse when done after every document)
# Resident memory above which a worker also drops its OCR engine after a document. onnxruntime's arenas keep
# their high-water mark: ~0.5 GB after an A4 page at 200 dpi (a worker then sits at 0.7-0.9 GB, and keeps
# the engine: reloading costs ~0.4 s), ~0.9 GB after a 6,000 x 6,000 image, which a worker held, idle,
# while the refresh chunked (bench/hostile.py). The next OCR reloads the models.
KEEP_ENGINES_BELOW_MIB = 1024


def _resident_mib() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
    except (OSError, ValueError, IndexError):
        return 0


def _release_freed_memory() -> None:
    """Between documents: glibc keeps a large document's freed heap, onnxruntime its arenas. Hand them back
    once the worker has grown: above TRIM_ABOVE_MIB and by TRIM_GROWTH_MIB since the last time (a heap that
    small documents keep reusing is left alone), and always once it holds KEEP_ENGINES_BELOW_MIB."""
    resident = _resident_mib()
    if resident >= KEEP_ENGINES_BELOW_MIB:
        import gc

        from corpusync.adapters.ocr import build_ocr_engine

        build_ocr_engine.cache_clear()
        gc.collect()
    elif resident < TRIM_ABOVE_MIB or resident - _WORKER.get("trimmed_at_mib", 0) < TRIM_GROWTH_MIB:
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    _WORKER["trimmed_at_mib"] = _resident_mib()


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, looked up once per worker (None: not glibc)."""
    try:
        import ctypes

        fn: Callable[[int], int] = ctypes.CDLL("libc.so.6").malloc_trim
        return fn
    except (OSError, AttributeError):
        return None


def parse_one(src: SourceFile, pages_at_most: int | None = None) -> tuple[str | None, tuple[Any, ...]]:
    """One document: ("ok", the pickled doc) or ("err", reason, detail), with the memory-limit report. Plain
    tuples: exceptions with custom constructors do not cross a process boundary reliably. The document is
    pickled here so that what parsing it took can be freed, and handed back, before the worker waits for
    the next one. `pages_at_most`: count the pages first; a document with more comes back unparsed as
    ("pages", count), for a deadline of its own."""
    if pages_at_most is not None:
        problem, pages = _count_pages(src)
        if pages is not None and pages > pages_at_most:
            return problem, ("pages", pages)
    outcome = _parse_pickled(src)
    _release_freed_memory()
    return _WORKER["problem"], outcome


def _parse_pickled(src: SourceFile) -> tuple[Any, ...]:
    options: ParseOptions = _WORKER["options"]
    try:
        doc = _WORKER["parse"](src, options)
        chars = sum(len(b.text) for b in doc.blocks)  # whatever the parse function: the chunker never sees more
        if chars > options.max_chars:
            raise ParseError(src.path, "oversized", f"its text is {chars:,} characters, over the limit of "
                             f"{options.max_chars:,} (CORPUSYNC_PARSE_MAX_CHARS; split the document or raise "
                             "the setting)")
        return ("ok", pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL))
    except ParseError as exc:
        return ("err", exc.reason, exc.detail)
    except MemoryError:
        return ("err", "out-of-memory", "parsing exceeded the worker's memory limit of "
                f"{_WORKER['memory_mb']} MiB")
