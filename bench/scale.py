"""A first build at scale: wall time, per-stage time and the peak RSS of the whole process tree.

The corpus: the SQuAD v1.1 dev, CMRC 2018 and DuReader passages (`corpusync goldset export`, one file each:
3,368), 5% of N as copies of the shared text PDFs, and the rest as copies of the passages under new names until
it holds N documents. A copy is parsed, chunked, validated and loaded like any document; its vectors are
copied from the first, not re-embedded (as in any corpus with duplicates). Each build is
`corpusync refresh FOLDER --json` in a fresh process and a fresh home (its own embedded PostgreSQL), with
CORPUSYNC_PARSE_WORKERS set; the process tree (refresh, parse workers, the validation worker, Prefect's API
server, the model server; not PostgreSQL) is sampled every 0.2 s for its summed RSS and each role's own RSS.

    python bench/scale.py --sizes 1000,10000 --workers 1,2

Prints one row per (size, workers): wall s, the run's stage timings, peak tree RSS, each role's peak RSS, and
the ratios that matter: RSS at the largest size over the smallest (streaming: ~1; overall and by role), parse
throughput with 2 workers over 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil  # installed with corpusync's dependencies (a bench-only import)

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"  # --data: the same layout elsewhere (goldsets/, corpus/)
GOLDSETS = ("squad-v1.1-dev", "cmrc2018", "dureader2-demo")


def _text_pdfs(data: Path) -> list[Path]:
    """The shared PDFs under 2 MB with a text layer on every page (a scan would turn the bench into an OCR
    bench: bench/parse_pool.py and the 300-page scan measure that)."""
    import pymupdf

    found = []
    for p in sorted((data / "corpus").rglob("*.pdf")):
        if p.stat().st_size > 2_000_000:
            continue
        try:
            with pymupdf.open(p) as doc:
                if doc.needs_pass or not len(doc) or not all(page.get_text().strip() for page in doc):
                    continue
        except Exception:  # a damaged sample is simply not used
            continue
        found.append(p)
    return found


def make_corpus(dest: Path, size: int, work: Path, pdf_share: float, data: Path = SHARED) -> dict[str, int]:
    """`size` documents in `dest`: the gold sets' passages, `pdf_share` of `size` as copies of the shared text
    PDFs, and the rest as copies of the passages under new names."""
    dest.mkdir(parents=True)
    passages: list[Path] = []
    for name in GOLDSETS:
        out = work / f"export-{name}"
        if not out.exists():
            subprocess.run([*CLI, "goldset", "export", str(data / "goldsets" / name), str(out)], check=True,
                           capture_output=True, cwd=REPO)
        passages += sorted(out.glob("*.txt"))
    pdfs = _text_pdfs(data) if pdf_share > 0 else []
    counts = {"passages": 0, "pdfs": 0, "copies": 0}
    n_pdfs = int(size * pdf_share) if pdfs else 0  # the same mix at every size
    for p in passages[:size - n_pdfs]:
        shutil.copy(p, dest / p.name)
        counts["passages"] += 1
    for i in range(n_pdfs):
        src = pdfs[i % len(pdfs)]
        shutil.copy(src, dest / f"copy{i // len(pdfs):03d}-{src.name}")
        counts["pdfs"] += 1
    i = 0
    while sum(counts.values()) < size:
        src = passages[i % len(passages)]
        shutil.copy(src, dest / f"copy{i // len(passages):03d}-{src.name}")
        counts["copies"] += 1
        i += 1
    return counts


CLI = [sys.executable, "-c", "from corpusync import cli; cli.run()"]  # the CLI as its entry point runs it


ROLES = ("refresh", "model server", "Prefect server", "validation worker", "parse workers", "other")


def _role(p: psutil.Process, root: psutil.Process, seen: dict[int, str]) -> str:
    """What a process of the tree is: by its command line, and for the pools' spawned workers by the native
    libraries they loaded (PyMuPDF: a parse worker; great_expectations' SQLAlchemy: the validation worker)."""
    if p.pid == root.pid:
        return "refresh"
    if p.pid in seen:
        return seen[p.pid]
    cmd = " ".join(p.cmdline())
    role = ("model server" if "model_serving" in cmd else "Prefect server" if "uvicorn" in cmd or "prefect_local" in cmd
            else "other")
    if "spawn_main" in cmd:
        try:
            maps = Path(f"/proc/{p.pid}/maps").read_text()
        except OSError:
            maps = ""
        if "mupdf" not in maps and "sqlalchemy" not in maps:
            return "parse workers"  # a young worker, not settled yet: asked again next time
        role = "parse workers" if "mupdf" in maps else "validation worker"  # the latter imported GE's sqlalchemy
    seen[p.pid] = role
    return role


def _tree_rss(root: psutil.Process, seen: dict[int, str]) -> dict[str, int]:
    """RSS by role over the tree, PostgreSQL left out (its shared buffers are not the pipeline's)."""
    by = dict.fromkeys(ROLES, 0)
    for p in [root, *root.children(recursive=True)]:
        try:
            if "postgres" not in p.name():
                by[_role(p, root, seen)] += p.memory_info().rss
        except psutil.Error:
            continue
    return by


@dataclass
class Build:
    wall: float
    peak_mb: float  # the process tree (refresh, parse workers, validation worker, Prefect's server)
    peak_roles_mb: dict[str, float]  # each role's own peak (they need not peak together)
    timings: dict[str, float]
    chunks: dict[str, int]


def build(corpus: Path, home: Path, workers: int) -> Build:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CORPUSYNC_PARSE_WORKERS=str(workers),
               CORPUSYNC_EMBEDDER=os.environ.get("CORPUSYNC_EMBEDDER", "minilm"))
    env.pop("PREFECT_API_URL", None)
    env["PREFECT_HOME"] = str(home / "prefect")  # its own API server and database, in the tree measured
    t0 = time.perf_counter()
    proc = subprocess.Popen([*CLI, "--home", str(home), "refresh", str(corpus), "--json"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    roles = dict.fromkeys(ROLES, 0)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        root = psutil.Process(proc.pid)
        seen: dict[int, str] = {}
        while not done.is_set():
            try:
                by = _tree_rss(root, seen)
                peak = max(peak, sum(by.values()))
                for k, v in by.items():
                    roles[k] = max(roles[k], v)
            except psutil.Error:
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    for server in ("api", "model", "db"):  # nothing of this build lingers into the next (or the clean-up)
        subprocess.run([*CLI, "--home", str(home), server, "stop"], cwd=REPO, env=env, capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"refresh failed ({proc.returncode}):\n{err[-3000:]}")
    summary = json.loads(out)
    return Build(wall, peak / 2**20, {k: v / 2**20 for k, v in roles.items()}, summary["timings"],
                 summary["chunks"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--pdf-share", type=float, default=0.05, help="share of the documents that are PDF copies")
    ap.add_argument("--data", type=Path, default=SHARED,
                    help="folder with goldsets/ and corpus/ (default: ../shared/data)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    workers = [int(x) for x in args.workers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="corpusync-bench-scale-") as tmp:
        work = Path(tmp)
        for size in sizes:
            corpus = work / f"corpus-{size}"
            counts = make_corpus(corpus, size, work, args.pdf_share, args.data)
            for w in workers:
                r = build(corpus, work / f"home-{size}-{w}", w)
                rows.append((size, w, counts, r))
                t = r.timings
                print(f"{size:>6} docs ({counts['passages']} passages, {counts['pdfs']} PDF copies, {counts['copies']} "
                      f"passage copies), {w} parse worker(s): "
                      f"wall {r.wall:.1f} s, peak RSS {r.peak_mb:.0f} MB (tree), stages "
                      + ", ".join(f"{k} {v:.1f}" for k, v in t.items() if v >= 0.05)
                      + f"; chunks {r.chunks}; peak RSS by role (MB): "
                      + ", ".join(f"{k} {v:.0f}" for k, v in r.peak_roles_mb.items()), flush=True)
    by = {(s, w): r for s, w, _, r in rows}
    if len(sizes) > 1:
        for w in workers:
            small, large = by[(min(sizes), w)], by[(max(sizes), w)]
            print(f"{w} worker(s): peak RSS at {max(sizes)} / at {min(sizes)} documents = "
                  f"{large.peak_mb / small.peak_mb:.2f}x (tree); by role: "
                  + ", ".join(f"{k} {large.peak_roles_mb[k] / small.peak_roles_mb[k]:.2f}x"
                              for k in ROLES if small.peak_roles_mb[k] > 0))
    if 1 in workers:
        for s in sizes:
            one = by[(s, 1)]
            for w in (w for w in workers if w > 1):
                many = by[(s, w)]
                print(f"{s} documents: wall with {w} parse workers / 1 = {many.wall / one.wall:.2f}x; parse stage "
                      f"{one.timings.get('parse', 0):.1f} s -> {many.timings.get('parse', 0):.1f} s")


if __name__ == "__main__":
    main()
