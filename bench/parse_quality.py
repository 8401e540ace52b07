"""Parse quality and speed on the real documents in ../shared/data/corpus.

(a) Similarity to the hand-corrected ground truth of py-pdf-read-benchmark (GeoTopo, 117 pages): raw
    PyMuPDF `get_text()` vs corpusync's cleaned output (headers/footers removed, de-hyphenated). The ground
    truth file still carries the running headers ("4 1.1. TOPOLOGISCHE RÄUME", 92 lines; its SOURCE.md says
    otherwise), so both are also scored against its *body text*: the ground truth without those lines.
(b) OCR character accuracy: pages of Chinese/English *text* PDFs rendered to images and OCRed, compared with
    their own text layer; plus the mean OCR confidence on the scanned files (no text layer to score against).
(c) Speed: pages/s on text PDFs, corpusync vs raw `get_text()` in the same run (median of --repeat runs);
    seconds per OCR page.

Usage: python bench/parse_quality.py [--data ../shared/data/corpus] [--repeat 3] [--ocr-pages 6]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpusync.core.offline import apply_offline_defaults

apply_offline_defaults()
os.environ.setdefault("CORPUSYNC_EMBEDDER", "minilm")  # the benches measure the demo/test model unless told

import pymupdf  # noqa: E402
from rapidfuzz.distance import Levenshtein  # noqa: E402

from schemas.records import SourceFile  # noqa: E402
from tasks.parse import ParseOptions, parse_document  # noqa: E402

TEXT_PDFS = [
    "py-pdf-read-benchmark/pdfs/GeoTopo-komprimiert.pdf",
    "pdfjs-test-pdfs/tracemonkey.pdf",
    "pdfjs-test-pdfs/pdkids.pdf",
    "mineru-demo/pdfs/demo1.pdf",
    "pdfplumber-test-pdfs/zh/issue-67-example.pdf",
    "pdfplumber-test-pdfs/en_other/federal-register-2020-17221.pdf",
    "docling-test-data/pdf/sources/redp5110_sampled.pdf",
]
OCR_SCORED = [  # (file, pages): text PDFs whose pages are rendered, OCRed and scored against their text layer
    ("pdfplumber-test-pdfs/zh/issue-67-example.pdf", [1, 2, 3]),
    ("mineru-demo/pdfs/chemical_knowledge_introduction.pdf", [1]),
    ("pdfjs-test-pdfs/tracemonkey.pdf", [1, 2]),
]
SCANNED = ["pdfplumber-test-pdfs/zh/pr-136-example.pdf", "mineru-demo/pdfs/small_ocr.pdf",
           "docling-test-data/ocr/sources/sample_with_rotation_mismatch.pdf"]


_GT_RUNNING_HEADER = re.compile(
    r"^\d+ \d+(?:\.\d+)*\.? [A-ZÄÖÜ][A-ZÄÖÜß ,\-]+$|^\d+(?:\.\d+)*\.? [A-ZÄÖÜ][A-ZÄÖÜß ,\-]+ \d+$")


def ground_truth_body(gt: str) -> tuple[str, int]:
    """The GeoTopo ground truth without its running-header lines (page number + section title in capitals)."""
    lines = gt.splitlines()
    body = [ln for ln in lines if not _GT_RUNNING_HEADER.match(ln.strip())]
    return "\n".join(body), len(lines) - len(body)


def char_f1(got: str, truth: str) -> float:
    """Order-free character F1 (multiset overlap): reading order of columns does not count against OCR."""
    from collections import Counter

    g, t = Counter(got), Counter(truth)
    overlap = sum((g & t).values())
    if not overlap:
        return 0.0
    p, r = overlap / sum(g.values()), overlap / sum(t.values())
    return 2 * p * r / (p + r)


def norm_ws(text: str) -> str:
    return " ".join(text.split())


def no_ws(text: str) -> str:
    return "".join(text.split())


def src_of(root: Path, rel: str) -> SourceFile:
    p = root / rel
    data = p.read_bytes()
    return SourceFile(rel, p, len(data), datetime.now(UTC), hashlib.sha256(data).hexdigest())


def doc_text(root: Path, rel: str, options: ParseOptions) -> str:
    return "\n\n".join(b.text for b in parse_document(src_of(root, rel), options).blocks)


def raw_text(path: Path) -> str:
    with pymupdf.open(path) as doc:
        return "\n".join(p.get_text() for p in doc)


def similarity(a: str, b: str) -> float:
    return Levenshtein.normalized_similarity(norm_ws(a), norm_ws(b))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parent.parent.parent / "shared/data/corpus")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    root: Path = args.data
    opts = ParseOptions()

    # (a) GeoTopo vs hand-corrected ground truth
    gt = (root / "py-pdf-read-benchmark/ground_truth/GeoTopo-book.txt").read_text(encoding="utf-8")
    body, n_headers = ground_truth_body(gt)
    geo = "py-pdf-read-benchmark/pdfs/GeoTopo-komprimiert.pdf"
    parsed = parse_document(src_of(root, geo), opts)
    ours = "\n\n".join(b.text for b in parsed.blocks)
    raw = raw_text(root / geo)
    removed = parsed.cleaning.get("removed_running_lines", {})
    print("## (a) GeoTopo (117 pages) vs the hand-corrected ground truth: normalised character similarity")
    print(f"| extraction | vs ground-truth body (without its {n_headers} running-header lines) "
          "| vs ground-truth file as is | chars |")
    print("|---|---|---|---|")
    for label, text in (("raw PyMuPDF get_text()", raw), ("corpusync (cleaned)", ours)):
        print(f"| {label} | {similarity(text, body):.4f} | {similarity(text, gt):.4f} | {len(norm_ws(text)):,} |")
    print(f"running lines removed: {len(removed)} distinct, {sum(removed.values())} in all; "
          f"e.g. {list(removed)[:3]}")

    # (b) OCR accuracy on rendered text pages
    from corpusync.adapters.ocr import RapidOcrEngine, lines_to_paragraphs, recognise_page

    engine = RapidOcrEngine()
    print("\n## (b) OCR character accuracy (RapidOCR PP-OCR, 200 dpi renders of text pages vs their text layer)")
    print("| file | page | chars | char accuracy (1 - CER) | order-free char F1 | confidence | s/page |")
    print("|---|---|---|---|---|---|---|")
    ocr_times: list[float] = []
    for rel, pages in OCR_SCORED:
        with pymupdf.open(root / rel) as doc:
            for n in pages:
                page = doc[n - 1]
                truth = no_ws(page.get_text())
                pix = page.get_pixmap(dpi=200, colorspace="rgb", alpha=False)
                import numpy as np

                img = np.frombuffer(pix.samples, dtype=np.uint8).reshape(pix.height, pix.width, 3).copy()
                t0 = time.perf_counter()
                res = recognise_page(engine, img)
                ocr_times.append(time.perf_counter() - t0)
                got = no_ws("".join(lines_to_paragraphs(res.lines)))
                import unicodedata

                got, truth = unicodedata.normalize("NFKC", got), unicodedata.normalize("NFKC", truth)
                acc = Levenshtein.normalized_similarity(got, truth)
                print(f"| {rel.split('/')[-1]} | {n} | {len(truth):,} | {acc:.4f} | {char_f1(got, truth):.4f} "
                      f"| {res.confidence:.3f} | {ocr_times[-1]:.2f} |")
    print("\nScanned files (no trustworthy text layer; scored by confidence and by inspection):")
    print("| file | pages OCRed | why | mean confidence | low-confidence pages | s/page | first text |")
    print("|---|---|---|---|---|---|---|")
    for rel in SCANNED:
        t0 = time.perf_counter()
        d = parse_document(src_of(root, rel), opts)
        dt = time.perf_counter() - t0
        pages = d.metadata.get("ocr_pages", [])
        ocr_times += [dt / max(len(pages), 1)] * len(pages)
        conf = statistics.mean(p["confidence"] for p in pages) if pages else 0.0
        first = norm_ws(" ".join(b.text for b in d.blocks))[:40].replace("|", "\\|")
        why = ",".join(sorted({p["reason"] for p in pages}))
        print(f"| {rel.split('/')[-1]} | {len(pages)}/{d.page_count} | {why} | {conf:.3f} "
              f"| {d.metadata.get('low_confidence_pages', [])} | {dt / max(len(pages), 1):.2f} | {first} |")

    # (c) speed on text PDFs
    total_pages = 0
    for rel in TEXT_PDFS:
        with pymupdf.open(root / rel) as doc:
            total_pages += doc.page_count
    # the text-layer path only (a page without text would be OCRed: timed separately above)
    text_only = ParseOptions(ocr_engine="none")
    runs_raw, runs_ours = [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        for rel in TEXT_PDFS:
            raw_text(root / rel)
        runs_raw.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for rel in TEXT_PDFS:
            doc_text(root, rel, text_only)
        runs_ours.append(time.perf_counter() - t0)
    r, o = statistics.median(runs_raw), statistics.median(runs_ours)
    print(f"\n## (c) Speed on {len(TEXT_PDFS)} text PDFs ({total_pages} pages), median of {args.repeat} runs")
    print("| parser | pages/s | ratio vs raw |")
    print("|---|---|---|")
    print(f"| raw PyMuPDF get_text() | {total_pages / r:,.0f} | 1.00 |")
    print(f"| corpusync parse + clean (text layer, OCR off) | {total_pages / o:,.0f} | {r / o:.2f} |")
    print(f"OCR: median {statistics.median(ocr_times):.2f} s/page over {len(ocr_times)} pages (CPU, this machine)")


if __name__ == "__main__":
    main()
