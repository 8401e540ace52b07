"""Parse throughput of the isolated worker pool (tasks/parse_worker.py) on text PDFs, for 1 and 2 workers
(issue 13: 2 workers >= 1.8x one), next to raw PyMuPDF `get_text()` and in-process parse_document.

The files: every PDF of the corpus (../shared/data/corpus, else tests/data/corpus) whose pages all carry a
text layer and that parses without OCR, repeated --copies times. Each pool is started and warmed by one
untimed pass. Then each of --runs passes goes through the files in --slices parts of about equal page
counts, and every configuration parses each part in turn (who goes first rotating from part to part): on a
shared VM whose speed drifts from second to second (the same pass varied by 30% here), configurations
compared over the same few seconds see the same machine. Reported per configuration: the median pass, the
median of the passes' ratios to raw get_text(), and the CPU seconds of this process and of the workers
(steal time, 9% on average here, is not CPU time: the per-worker CPU rate is the workers' pages per CPU
second, this process's where it parses). The pools run with the refresh's deadlines (page counting
included). Raw get_text() and in-process parsing use one core.

Usage: python bench/parse_pool.py [--data DIR] [--copies 2] [--runs 3] [--slices 4] [--workers 1,2]
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
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpusync.core.offline import apply_offline_defaults

apply_offline_defaults()

import pymupdf  # noqa: E402

from corpusync.core.errors import ParseError  # noqa: E402
from schemas.records import SourceFile  # noqa: E402
from schemas.settings import Settings  # noqa: E402
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


def cpu_s() -> tuple[float, float]:
    """CPU seconds (user + system) of this process and of its live children (the pool's workers). Unlike
    wall time, they leave out what a shared VM's neighbours take (steal time: 9% on average here)."""
    import psutil

    me = psutil.Process()
    mine, theirs = sum(me.cpu_times()[:2]), 0.0
    for proc in me.children(recursive=True):
        try:
            theirs += sum(proc.cpu_times()[:2])
        except psutil.Error:  # exited meanwhile
            pass
    return mine, theirs


def timed(fn: Callable[[], object]) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of this process, CPU seconds of the workers) of one call."""
    (m0, w0), t0 = cpu_s(), time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    m1, w1 = cpu_s()
    return wall, m1 - m0, w1 - w0


def page_slices(files: list[SourceFile], pages_of: dict[Path, int], k: int) -> list[list[SourceFile]]:
    """The files in order, cut into at most k parts of about equal page counts; in each part the longest
    documents first, so that a pool's workers finish a part together (not one parsing a long document
    while the other waits for the next part)."""
    total, done = sum(pages_of[f.abs_path] for f in files), 0
    parts: list[list[SourceFile]] = []
    part: list[SourceFile] = []
    for f in files:
        part.append(f)
        done += pages_of[f.abs_path]
        if done >= total * (len(parts) + 1) / k:
            parts.append(part)
            part = []
    return [sorted(p, key=lambda f: -pages_of[f.abs_path]) for p in (*parts, part) if p]


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
    ap.add_argument("--slices", type=int, default=4)
    ap.add_argument("--workers", default="1,2")
    args = ap.parse_args()
    root = args.data or next(p for p in (REPO.parent / "shared/data/corpus", REPO / "tests/data/corpus") if p.is_dir())
    options = ParseOptions()
    fields = Settings.model_fields  # the refresh's deadlines
    timeout_s, per_page_s = fields["parse_timeout_s"].default, fields["parse_timeout_per_page_s"].default

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
          f"1-min load average before: {load:.2f}; median of {args.runs} passes, each in {args.slices} parts")

    # Every configuration parses each part in turn, raw get_text() included: a machine whose speed drifts
    # (a shared VM) then slows them all alike.
    pools: dict[int, ParsePool] = {}
    try:
        for n in (int(w) for w in args.workers.split(",")):
            pools[n] = ParsePool(options, workers=n, timeout_s=timeout_s, timeout_per_page_s=per_page_s,
                                 memory_mb=8192, warm_for=[".pdf"])
            results = list(pools[n].parse_many(files, ordered=False))  # starts and warms every worker, untimed
            failed = [s.path for s, r in results if isinstance(r, ParseError)]
            if failed:
                print(f"  {n} worker(s): {len(failed)} failed in the warm-up pass: {failed[:3]}")

        def one_pass(p: ParsePool, part: list[SourceFile]) -> None:
            for _ in p.parse_many(part, ordered=False):
                pass

        configs: list[tuple[str, int, Callable[[list[SourceFile]], object]]] = [
            ("raw PyMuPDF get_text(), in-process", 1, raw_get_text),
            ("parse_document in-process (no isolation)", 1, lambda part: [parse_document(s, options) for s in part]),
            *((f"pool, {n} worker{'s' if n > 1 else ''}", n, partial(one_pass, p)) for n, p in pools.items())]
        parts = page_slices(files, pages_of, args.slices)
        times: list[list[float]] = [[] for _ in configs]
        cpu: list[list[tuple[float, float]]] = [[] for _ in configs]
        for _ in range(args.runs):
            sums = [[0.0, 0.0, 0.0] for _ in configs]
            for j, part in enumerate(parts):
                for i in ((j + k) % len(configs) for k in range(len(configs))):
                    for m, value in enumerate(timed(partial(configs[i][2], part))):
                        sums[i][m] += value
            for i, (wall, mine, workers) in enumerate(sums):
                times[i].append(wall)
                cpu[i].append((mine, workers))
        # Throughput of the pools over whole passes, as a refresh streams every document through its pool: a
        # part ends with its last documents on fewer workers than the pool has.
        whole: dict[int, list[float]] = {n: [] for n in pools}
        for _ in range(args.runs):
            for n, p in pools.items():
                whole[n].append(timed(partial(one_pass, p, files))[0])
    finally:
        for p in pools.values():
            p.close()
    rows = [(label, t, n, c) for (label, n, _), t, c in zip(configs, times, cpu, strict=True)]
    raw, raw_cpu = times[0], statistics.median(m for m, _ in cpu[0])

    raw_pps = pages / statistics.median(raw)
    one = next((statistics.median(t) for label, t, n, _ in rows if label.startswith("pool") and n == 1), None)
    print("\n| run | workers | docs/s | pages/s | runs (s) | vs 1 worker | pages/s per worker / raw get_text "
          "| same, median of the passes' ratios | CPU s: this process, workers | pages per worker CPU s / raw "
          "get_text's per CPU s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, runs, n, used in rows:
        med = statistics.median(runs)
        speedup = f"{one / med:.2f}x" if one and label.startswith("pool") else ""
        spread = ", ".join(f"{t:.1f}" for t in runs)
        paired = statistics.median(r / t / n for r, t in zip(raw, runs, strict=True))
        print(f"| {label} | {n} | {len(files) / med:.1f} | {pages / med:.0f} | {spread} | {speedup} | "
              f"{pages / med / n / raw_pps:.3f} | {paired:.3f} | {statistics.median(m for m, _ in used):.2f}, "
              f"{statistics.median(w for _, w in used):.2f} | "
              f"{raw_cpu / statistics.median(w if label.startswith('pool') else m for m, w in used):.3f} |")
    medians = {n: statistics.median(t) for label, t, n, _ in rows if label.startswith("pool")}
    if 1 in medians and 2 in medians:
        streamed = {n: statistics.median(t) for n, t in whole.items()}
        print(f"\nthroughput ratio 2 workers / 1 worker over whole passes: {streamed[1] / streamed[2]:.2f} "
              f"(issue 13 target: >= 1.8; {pages / streamed[1]:.0f} and {pages / streamed[2]:.0f} pages/s, "
              f"median of {args.runs}); in the parts above: {medians[1] / medians[2]:.2f}")
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"1-min load average after: {load_after:.2f} (other processes on this machine compete for the CPUs)")


if __name__ == "__main__":
    main()
