"""What the OCR cache saves when scans move: a folder of scanned PDFs is indexed once, then moved back and
forth between two names, each move a refresh (five renames, no embedding), alternately with the OCR cache
(CORPUSYNC_OCR_CACHE, the default) and without it, so both see the machine in the same minutes.

The scans: mineru-demo's small_ocr.pdf, pdfjs's TAMReview.pdf, the auditor letter pr-136-example.pdf,
docling's nemotron_multipage.pdf and pdfplumber's issue-203-decimalize.pdf (42 pages OCRed), from
../shared/data/corpus (else the bundled excerpts under tests/data/corpus that exist).

    python bench/ocr_cache.py [--runs 3] [--data ../shared/data/corpus]

Prints, per configuration, the median over --runs moves of the refresh process's wall time and of its parse
stage, and the ratio of the cached to the uncached move. Each refresh is a fresh CLI process (the model and
Prefect API servers stay up between them, as for a user's commands).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCANS = ("mineru-demo/pdfs/small_ocr.pdf", "pdfjs-test-pdfs/TAMReview.pdf",
         "pdfplumber-test-pdfs/zh/pr-136-example.pdf", "docling-test-data/ocr/sources/nemotron_multipage.pdf",
         "pdfplumber-test-pdfs/en_other/issue-203-decimalize.pdf")


def scans(data: Path) -> list[Path]:
    found = []
    for rel in SCANS:
        path = data / rel
        excerpt = path.with_name(f"{path.stem}-p1-2.pdf")
        found += [p for p in (path, excerpt) if p.is_file()][:1]
    if not found:
        raise SystemExit(f"none of the scans under {data}")
    return found


def refresh(cli: list[str], corpus: Path, env: dict[str, str]) -> tuple[float, dict]:
    t0 = time.perf_counter()
    proc = subprocess.run([*cli, "refresh", str(corpus), "--json", "-q", "--skip-gate"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"refresh failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "corpus")
    args = ap.parse_args()
    data = args.data if args.data.is_dir() else REPO / "tests" / "data" / "corpus"
    files = scans(data)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               CORPUSYNC_EMBEDDER=os.environ.get("CORPUSYNC_EMBEDDER", "minilm"))
    with tempfile.TemporaryDirectory(prefix="corpusync-bench-ocr-cache-") as tmp:
        root = Path(tmp)
        corpus, names = root / "corpus", ("scans", "moved-scans")
        (corpus / names[0]).mkdir(parents=True)
        for f in files:
            shutil.copy(f, corpus / names[0] / f.name)
        cli = [sys.executable, "-m", "corpusync.cli", "--home", str(root / "home")]
        wall, summary = refresh(cli, corpus, env)
        print(f"{len(files)} scans from {data}: first build {wall:.1f} s wall, "
              f"parse {summary['timings']['parse']:.1f} s, {summary['chunks']['inserted']} chunks")
        results: dict[str, list[tuple[float, float]]] = {"cache": [], "no cache": []}
        try:
            for run in range(args.runs):
                for config in (("cache", "no cache") if run % 2 == 0 else ("no cache", "cache")):
                    here = next(n for n in names if (corpus / n).exists())
                    (corpus / here).rename(corpus / names[1 - names.index(here)])
                    wall, summary = refresh(cli, corpus, env | {"CORPUSYNC_OCR_CACHE": str(config == "cache")})
                    d = summary["documents"]
                    moved = (d["renamed"], d["new"], d["deleted"], summary["chunks"]["embedded"])
                    assert moved == (len(files), 0, 0, 0), summary
                    results[config].append((wall, summary["timings"]["parse"]))
                    print(f"run {run + 1}, {config}: {wall:.1f} s wall, parse {summary['timings']['parse']:.1f} s",
                          flush=True)
        finally:
            for what in ("model", "api", "db"):
                subprocess.run([*cli, what, "stop"], cwd=REPO, env=env, capture_output=True, check=False)
    med = {k: (statistics.median(w for w, _ in v), statistics.median(p for _, p in v)) for k, v in results.items()}
    for k, (wall, parse) in med.items():
        print(f"{k:>8}: median of {args.runs} moves: {wall:.1f} s wall, parse stage {parse:.1f} s")
    print(f"cache / no cache: wall {med['cache'][0] / med['no cache'][0]:.3f}x, "
          f"parse {med['cache'][1] / med['no cache'][1]:.3f}x")


if __name__ == "__main__":
    main()
