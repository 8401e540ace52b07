"""OCR seconds per page: corpusync's RapidOCR configuration against RapidOCR's defaults (the configuration
before bench/ocr_speed.py existed), on real scanned pages and rendered text pages from ../shared/data/corpus.

Both engines read the same 200 dpi renders (corpusync's reduced to RapidOCR's detection size first, as
its parse path does), interleaved run by run (so load from other processes hits both
alike); per page it prints the median wall and CPU seconds of --repeat runs, after/before ratios, the engine
passes recognise_page made, the mean confidence, and for text pages the character accuracy (1 - CER) and
order-free character F1 against the page's own text layer (as bench/parse_quality.py scores them), plus how
alike the two engines' texts are. Models load (and one warm-up page runs) before the clock starts.

Usage: python bench/ocr_speed.py [--data ../shared/data/corpus] [--repeat 3] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpusync.core.offline import apply_offline_defaults

apply_offline_defaults()

import numpy as np  # noqa: E402
import pymupdf  # noqa: E402
from rapidfuzz.distance import Levenshtein  # noqa: E402

from bench.parse_quality import char_f1, no_ws  # noqa: E402
from corpusync.adapters.ocr import OcrResult, RapidOcrEngine, fit_to_engine, lines_to_paragraphs, recognise_page  # noqa: E402

PAGES = [  # (file, page, scored against its text layer)
    ("pdfplumber-test-pdfs/zh/pr-136-example.pdf", 1, False),  # scanned letter, 2550x3509 page images
    ("pdfplumber-test-pdfs/zh/pr-136-example.pdf", 2, False),
    ("mineru-demo/pdfs/small_ocr.pdf", 1, False),  # scanned book page (thin image strips)
    ("docling-test-data/ocr/sources/sample_with_rotation_mismatch.pdf", 1, False),  # image-only, /Rotate 90
    ("pdfplumber-test-pdfs/zh/issue-67-example.pdf", 3, True),  # Chinese report page with a table
    ("pdfjs-test-pdfs/tracemonkey.pdf", 1, True),  # English two-column paper: the densest page here
]


class BeforeEngine(RapidOcrEngine):
    """RapidOCR as corpusync ran it before: its defaults (no memory arena, spinning onnxruntime threads,
    6 text lines per recognition run)."""

    def _load(self) -> Any:
        if self._engine is None:
            from rapidocr import RapidOCR

            self._engine = RapidOCR(params={"Global.log_level": "warning"})
        return self._engine


class Counting:
    """An engine wrapper that counts recognise calls (recognise_page makes 1 for an upright page, up to 3)."""

    def __init__(self, engine: RapidOcrEngine) -> None:
        self.engine, self.name, self.model, self.version, self.calls = engine, engine.name, "", "", 0

    def recognise(self, image: np.ndarray, *, classify_lines: bool = True) -> OcrResult:
        self.calls += 1
        return self.engine.recognise(image, classify_lines=classify_lines)


def render(path: Path, number: int, dpi: int = 200) -> tuple[np.ndarray, float, str]:
    with pymupdf.open(path) as doc:
        page = doc[number - 1]
        t0 = time.perf_counter()
        pix = page.get_pixmap(dpi=dpi, colorspace="rgb", alpha=False)
        img = np.frombuffer(pix.samples, dtype=np.uint8).reshape(pix.height, pix.width, 3).copy()
        return img, time.perf_counter() - t0, no_ws(page.get_text())


def text_of(result: OcrResult) -> str:
    return unicodedata.normalize("NFKC", no_ws("".join(lines_to_paragraphs(result.lines))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parent.parent.parent / "shared/data/corpus")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="onnxruntime threads (default: every usable CPU)")
    args = ap.parse_args()
    engines = {"before": Counting(BeforeEngine()), "after": Counting(RapidOcrEngine(threads=args.threads))}
    pages = [(rel, n, scored, *render(args.data / rel, n)) for rel, n, scored in PAGES]
    for e in engines.values():
        recognise_page(e, pages[0][3])  # models loaded, first run done
    print(f"load average at start {os.getloadavg()[0]:.2f}, {len(os.sched_getaffinity(0))} CPUs, "
          f"after: {engines['after'].engine.threads} onnxruntime threads; median of {args.repeat} runs")
    print("| page | render s | before s (CPU s) | after s (CPU s) | after/before | passes | confidence before "
          "/ after | char accuracy before / after | char F1 before / after | texts alike |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios, befores, afters = [], [], []
    for rel, n, scored, img, render_s, truth in pages:
        wall: dict[str, list[float]] = {k: [] for k in engines}
        cpu: dict[str, list[float]] = {k: [] for k in engines}
        res: dict[str, OcrResult] = {}
        passes: dict[str, int] = {}
        for r in range(args.repeat):
            for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
                e = engines[name]
                e.calls = 0
                t0, c0 = time.perf_counter(), time.process_time()
                # as the parse path does: corpusync's configuration reduces the render to RapidOCR's
                # detection size first (fit_to_engine), inside the clock
                res[name] = recognise_page(e, fit_to_engine(e.engine, img) if name == "after" else img)
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
                passes[name] = e.calls
        b, a = statistics.median(wall["before"]), statistics.median(wall["after"])
        befores.append(b)
        afters.append(a)
        ratios.append(a / b)
        got = {k: text_of(v) for k, v in res.items()}
        if scored:
            t = unicodedata.normalize("NFKC", truth)
            acc = " / ".join(f"{Levenshtein.normalized_similarity(got[k], t):.4f}" for k in engines)
            f1 = " / ".join(f"{char_f1(got[k], t):.4f}" for k in engines)
        else:
            acc = f1 = "(scan)"
        print(f"| {rel.split('/')[-1]} p{n} | {render_s:.2f} | {b:.2f} ({statistics.median(cpu['before']):.2f}) "
              f"| {a:.2f} ({statistics.median(cpu['after']):.2f}) | {a / b:.2f} "
              f"| {passes['before']} / {passes['after']} "
              f"| {res['before'].confidence:.4f} / {res['after'].confidence:.4f} | {acc} | {f1} "
              f"| {Levenshtein.normalized_similarity(got['before'], got['after']):.4f} |", flush=True)
    print(f"\nmedian s/page: before {statistics.median(befores):.2f}, after {statistics.median(afters):.2f}; "
          f"after/before per page: median {statistics.median(ratios):.2f} (range {min(ratios):.2f}-"
          f"{max(ratios):.2f}); load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
