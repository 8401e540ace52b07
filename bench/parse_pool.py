"""Parse throughput of the isolated worker pool (tasks/parse_worker.py) on text PDFs, for 1 and 2 workers
(issue 13: 2 workers >= 1.8x one), next to raw PyMuPDF `get_text()` and in-process parse_document.

The files: every PDF of the corpus (../shared/data/corpus, else tests/data/corpus) whose pages all carry a
text layer and that parses without OCR, repeated --copies times. Each configuration: the pool is started and
warmed by one untimed pass, then --runs timed passes (the median is reported); the pool runs with the
refresh's deadlines (page counting included). Raw get_text() and in-process parsing use one core.

Usage: python bench/parse_pool.py [--data DIR] [--copies 2] [--runs 3] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpusync.core.offline import apply_offline_defaults

apply_offline_defaults()

import pymupdf  # noqa: E402

from corpusync.core.errors import ParseError  # noqa: E402
from schemas.records import SourceFile  # noqa: E402
from tasks.parse import ParseOptions, parse_document  # noqa: E402
from tasks.parse_worker import ParsePool, default_workers  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def text_pdfs(root: Path) -> list[tuple[Path, int]]:
    """PDFs whose every page has at least 20 characters of text layer, with their page counts."""
    found = []
    for path in sorted(root.rglob("*.pdf")):
        try:
            with pymupdf.open(path) as doc:
                if doc.needs_pass or not doc.page_count:
                    continue
                if all(len(page.get_text().strip()) >= 20 for page in doc):
                    found.append((path, doc.page_count))
        except Exception:  # a damaged file is not a text PDF
            continue
    return found


def source(root: Path, path: Path, copy: int) -> SourceFile:
    data = path.read_bytes()
    return SourceFile(f"copy{copy}/{path.relative_to(root).as_posix()}", path, len(data), datetime.now(UTC),
                      hashlib.sha256(data).hexdigest())


def timed(runs: int, fn: Callable[[], object]) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def raw_get_text(files: list[SourceFile]) -> None:
    for src in files:
        with pymupdf.open(src.abs_path) as doc:
            for page in doc:
                page.get_text()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", default="1,2")
    args = ap.parse_args()
    root = args.data or next(p for p in (REPO.parent / "shared/data/corpus", REPO / "tests/data/corpus") if p.is_dir())
    options = ParseOptions()
    timeout_s, per_page_s = 600.0, 5.0  # the refresh's defaults (schemas/settings.py)

    candidates = text_pdfs(root)
    pages_of = {p: n for p, n in candidates}
    once = [source(root, p, 0) for p, _ in candidates]
    with ParsePool(options, workers=1, timeout_s=timeout_s, memory_mb=8192, warm_for=[".pdf"]) as pool:
        kept = {src.abs_path for src, result in pool.parse_many(once)  # parsed in isolation: safe in-process
                if not isinstance(result, ParseError) and not result.metadata.get("ocr_pages")}
    chosen = [(p, n) for p, n in candidates if p in kept]
    files = [source(root, p, c) for c in range(args.copies) for p, _ in chosen]
    pages = sum(pages_of[src.abs_path] for src in files)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"text PDFs from {root}: {len(chosen)} files ({len(candidates) - len(chosen)} left out: OCR or failed), "
          f"{sum(n for _, n in chosen)} pages; x{args.copies} copies = {len(files)} documents, {pages} pages")
    print(f"CPUs this process may use: {default_workers()} (os.cpu_count() {os.cpu_count()}); "
          f"1-min load average before: {load:.2f}; median of {args.runs} runs")

    rows: list[tuple[str, list[float], int]] = []
    raw = timed(args.runs, lambda: raw_get_text(files))
    rows.append(("raw PyMuPDF get_text(), in-process", raw, 1))
    inproc = timed(args.runs, lambda: [parse_document(src, options) for src in files])
    rows.append(("parse_document in-process (no isolation)", inproc, 1))
    for n in (int(w) for w in args.workers.split(",")):
        with ParsePool(options, workers=n, timeout_s=timeout_s, timeout_per_page_s=per_page_s, memory_mb=8192,
                       warm_for=[".pdf"]) as pool:
            results = list(pool.parse_many(files, ordered=False))  # starts and warms every worker, untimed
            failed = [s.path for s, r in results if isinstance(r, ParseError)]
            if failed:
                print(f"  {n} worker(s): {len(failed)} failed in the warm-up pass: {failed[:3]}")
            def one_pass(p: ParsePool = pool) -> None:
                for _ in p.parse_many(files, ordered=False):
                    pass

            rows.append((f"pool, {n} worker{'s' if n > 1 else ''}", timed(args.runs, one_pass), n))

    raw_pps = pages / statistics.median(raw)
    one = next((statistics.median(t) for label, t, n in rows if label.startswith("pool") and n == 1), None)
    print("\n| run | workers | docs/s | pages/s | runs (s) | vs 1 worker | pages/s per worker / raw get_text |")
    print("|---|---|---|---|---|---|---|")
    for label, times, n in rows:
        med = statistics.median(times)
        speedup = f"{one / med:.2f}x" if one and label.startswith("pool") else ""
        spread = ", ".join(f"{t:.1f}" for t in times)
        print(f"| {label} | {n} | {len(files) / med:.1f} | {pages / med:.0f} | {spread} | {speedup} | "
              f"{pages / med / n / raw_pps:.3f} |")
    pools = {n: statistics.median(t) for label, t, n in rows if label.startswith("pool")}
    if 1 in pools and 2 in pools:
        print(f"\nthroughput ratio 2 workers / 1 worker: {pools[1] / pools[2]:.2f} (issue 13 target: >= 1.8)")
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"1-min load average after: {load_after:.2f} (other processes on this machine compete for the CPUs)")


if __name__ == "__main__":
    main()
