"""A first build as a scheduled refresh runs it: `corpusync refresh CORPUS --json` in a fresh process and a fresh
home (new embedded PostgreSQL), timed as a whole, next to its own stage timings, for the working tree and
(--baseline) an earlier commit, alternating run by run so drift on a shared machine hits both alike.

Issue 13 asks that the process cost no more than its embedding stage plus 15%. On a CPU-only machine the model
takes every core, so work overlapped with it slows it down: the embedding stage then grows as the process
time stays. Both figures are printed, and the process time against the baseline's is the one that says
whether a build got faster.

    corpusync goldset export ../shared/data/goldsets/squad-v1.1-dev /tmp/squad-txt
    python bench/first_build.py --runs 3 --corpus /tmp/squad-txt --markdown --baseline HEAD~1

Each home's model server is told to stop at once (CORPUSYNC_MODEL_LINGER_S=0), so every run loads the model.
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

from cli import as_markdown  # bench/cli.py: the peer benchmark's Markdown files

REPO = Path(__file__).resolve().parent.parent
STAGES = ("parse", "chunk", "embed", "validate", "load")


def first_build(code: Path, corpus: Path, home: Path) -> tuple[float, dict[str, float]]:
    """Wall seconds of one first build in a fresh process and home, and its stage timings."""
    env = dict(os.environ, PYTHONPATH=str(code), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               CORPUSYNC_EMBEDDER=os.environ.get("CORPUSYNC_EMBEDDER", "minilm"), CORPUSYNC_MODEL_LINGER_S="0")
    env.pop("PREFECT_API_URL", None)
    entry = "from corpusync import cli; cli.run() if hasattr(cli, 'run') else cli.app()"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", entry, "--home", str(home), "refresh", str(corpus), "--json"],
                          cwd=code, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the first build failed ({proc.returncode}) in {code}:\n{proc.stderr[-3000:]}")
    subprocess.run([sys.executable, "-c", entry, "--home", str(home), "db", "stop"], cwd=code, env=env,
                   capture_output=True, timeout=120)
    timings = json.loads(proc.stdout).get("timings") or {}
    return wall, {k: float(v) for k, v in timings.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline", help="git ref to measure next to the working tree (e.g. HEAD~1)")
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--markdown", action="store_true", help="the corpus's .txt passages as Markdown files")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="corpusync-bench-first-") as tmp:
        work = Path(tmp)
        corpus = args.corpus.resolve()
        if args.markdown:
            as_markdown(corpus, work / "corpus")
            corpus = work / "corpus"
        trees = {"current": REPO}
        if args.baseline:
            trees["baseline"] = work / "baseline-tree"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(trees["baseline"]),
                            args.baseline], check=True, capture_output=True)
        runs: dict[str, list[tuple[float, dict[str, float]]]] = {name: [] for name in trees}
        try:
            for i in range(args.runs):
                for name, code in trees.items():
                    home = work / f"home-{name}-{i}"
                    runs[name].append(first_build(code, corpus, home))
                    shutil.rmtree(home, ignore_errors=True)
                    wall, t = runs[name][-1]
                    print(f"{name:>9} run {i + 1}: {wall:.1f} s, " + ", ".join(f"{s} {t.get(s, 0):.1f}"
                                                                            for s in STAGES), file=sys.stderr)
        finally:
            sys.path.insert(0, str(REPO))
            from corpusync.core.prefect_local import stop_shared

            stop_shared()  # the local API server the runs shared
            if args.baseline:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(trees["baseline"])],
                               check=False)
    print(f"first build, median of {args.runs} (process = the whole command); corpus {args.corpus}")
    print(f"{'code':<10}{'process s':>11}{'embed s':>10}{'process/embed':>15}" +
          "".join(f"{s + ' s':>11}" for s in STAGES if s != "embed"))
    med: dict[str, float] = {}
    for name, rs in runs.items():
        med[name] = statistics.median(w for w, _ in rs)
        embed = statistics.median(t.get("embed", 0.0) for _, t in rs)
        others = "".join(f"{statistics.median(t.get(s, 0.0) for _, t in rs):>11.1f}" for s in STAGES if s != "embed")
        print(f"{name:<10}{med[name]:>11.1f}{embed:>10.1f}{med[name] / embed if embed else 0:>14.2f}x{others}")
    if args.baseline:
        print(f"process time, current/baseline: {med['current'] / med['baseline']:.2f}x")


if __name__ == "__main__":
    main()
