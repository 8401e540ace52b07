"""A long scanned PDF through a real refresh: indexed, not quarantined as 'timeout', and its OCR time per page.

The document is assembled from the shared scans (pages without a text layer, so every page is OCRed): the
scanned Chinese book pages of mineru-demo's small_ocr.pdf and the scanned auditor letter pr-136-example.pdf
(pdfplumber-test-pdfs; its noisy embedded OCR layer is re-OCRed), repeated up to --pages pages.

    python bench/long_scan.py [--pages 300] [--data ../shared/data/corpus]

Prints the refresh's status, the document's pages, chunks and OCRed pages, the parse deadline the pool gave
it (CORPUSYNC_PARSE_TIMEOUT_S + CORPUSYNC_PARSE_TIMEOUT_PER_PAGE_S per page), the parse stage's seconds and
seconds per page, and the last page a live chunk comes from.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent
SCANS = ("mineru-demo/pdfs/small_ocr.pdf", "pdfplumber-test-pdfs/zh/pr-136-example.pdf")


def assemble(data: Path, pages: int, dest: Path) -> int:
    import pymupdf

    sources = [pymupdf.open(data / s) for s in SCANS]
    out = pymupdf.open()
    while out.page_count < pages:
        for src in sources:
            take = min(src.page_count, pages - out.page_count)
            if take > 0:
                out.insert_pdf(src, to_page=take - 1)
    out.save(dest, garbage=3, deflate=True)
    return int(out.page_count)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=300)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "corpus")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from schemas.settings import Settings
    from tasks.parse_worker import parse_deadline_s

    with tempfile.TemporaryDirectory(prefix="corpusync-bench-scan-") as tmp:
        root = Path(tmp)
        (root / "corpus").mkdir()
        pdf = root / "corpus" / f"scan-{args.pages}-pages.pdf"
        pages = assemble(args.data, args.pages, pdf)
        size_mb = pdf.stat().st_size / 1e6
        # the OCR cache off: the assembled pages repeat, and a repeat would be a cache hit, not an OCR
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CORPUSYNC_OCR_CACHE="false",
                   CORPUSYNC_EMBEDDER=os.environ.get("CORPUSYNC_EMBEDDER", "minilm"))
        cli = [sys.executable, "-m", "corpusync.cli", "--home", str(root / "home")]
        t0 = time.perf_counter()
        proc = subprocess.run([*cli, "refresh", str(root / "corpus"), "--json", "-q"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=6 * 3600)
        wall = time.perf_counter() - t0
        if proc.returncode not in (0, 1):
            raise SystemExit(f"refresh failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        summary = json.loads(proc.stdout)
        url = subprocess.run([*cli, "db", "url"], cwd=REPO, env=env, capture_output=True, text=True,
                             check=True).stdout.strip()
        with psycopg.connect(url) as conn:
            chunks, last_page = conn.execute(
                "SELECT count(*), max(page_end) FROM corpusync.live_chunks").fetchone() or (0, None)
            meta = conn.execute("SELECT metadata FROM corpusync.document_versions ORDER BY id DESC LIMIT 1"
                                ).fetchone()
            quarantined = conn.execute("SELECT reason, error FROM corpusync.quarantine").fetchall()
        subprocess.run([*cli, "db", "stop"], cwd=REPO, env=env, capture_output=True, check=False)
    s = Settings()
    ocr_pages = len((meta[0] or {}).get("ocr_pages", [])) if meta else 0
    parse_s = summary["timings"].get("parse", 0.0)
    print(f"{pdf.name}: {pages} pages, {size_mb:.1f} MB")
    print(f"refresh: status {summary['status']}, {summary['documents']['quarantined']} quarantined "
          f"{quarantined}, {wall:.0f} s wall")
    print(f"indexed: {chunks} chunks, last page with a chunk {last_page}, {ocr_pages} pages OCRed")
    print(f"parse deadline {parse_deadline_s(pages, s.parse_timeout_s, s.parse_timeout_per_page_s):.0f} s; "
          f"parse stage {parse_s:.0f} s = {parse_s / pages:.2f} s per page (the parse worker's start included)")


if __name__ == "__main__":
    main()
