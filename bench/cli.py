"""CLI wall times as a user meets them: each command a fresh process, as a scheduled refresh or a shell runs it.

Indexes the sample corpus into a temporary home, then times (median of N runs) a no-op refresh, a lexical, a
dense and a hybrid query, and a small change (one file edited). With --baseline REF the same is measured, in
the same run, for the code at git REF (a temporary worktree, same virtualenv, its own home), and the ratios
current / baseline are printed.

    python bench/cli.py [--runs 5] [--baseline HEAD~1] [--corpus examples/sample-corpus]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUERIES = {"lexical": "合同编号 HT2023-0876 的付款方式", "dense": "Which team won Super Bowl 50?",
           "hybrid": "Which team won Super Bowl 50?"}


def _cli(code: Path, home: Path, *args: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(code), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               CORPUSYNC_EMBEDDER=os.environ.get("CORPUSYNC_EMBEDDER", "minilm"))
    env.pop("PREFECT_API_URL", None)
    t0 = time.perf_counter()
    # what the console script runs (`python -m corpusync.cli` did not exist in older versions)
    entry = "from corpusync import cli; cli.run() if hasattr(cli, 'run') else cli.app()"
    proc = subprocess.run([sys.executable, "-c", entry, "--home", str(home), *args], cwd=code, env=env,
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}) in {code}:\n{proc.stderr[-3000:]}")
    return wall


def measure(code: Path, corpus: Path, runs: int, work: Path) -> dict[str, float]:
    home = work / "home"
    src = work / "corpus"
    shutil.copytree(corpus, src)
    out: dict[str, float] = {"first build": _cli(code, home, "refresh", str(src), "-q")}
    times: dict[str, list[float]] = {"no-op refresh": [], "one file edited": []}
    times |= {f"{mode} query": [] for mode in QUERIES}
    edited = sorted(p for p in src.rglob("*.md") if p.name != "SOURCE.md")[0]  # SOURCE.md is not indexed
    for i in range(runs):
        times["no-op refresh"].append(_cli(code, home, "refresh", str(src), "-q"))
        for mode, text in QUERIES.items():
            times[f"{mode} query"].append(_cli(code, home, "query", text, "--mode", mode, "-k", "5", "--json"))
        edited.write_text(edited.read_text(encoding="utf-8") + f"\n\nEdit {i}.\n", encoding="utf-8")
        times["one file edited"].append(_cli(code, home, "refresh", str(src), "-q"))
    _cli(code, home, "db", "stop")
    return out | {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline", help="git ref to measure next to the working tree (e.g. HEAD~3)")
    ap.add_argument("--corpus", type=Path, default=REPO / "examples" / "sample-corpus")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="corpusync-bench-cli-") as tmp:
        tmpdir = Path(tmp)
        results = {"current": measure(REPO, args.corpus.resolve(), args.runs, tmpdir / "current")}
        if args.baseline:
            tree = tmpdir / "baseline-tree"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), args.baseline],
                           check=True, capture_output=True)
            try:
                results["baseline"] = measure(tree, args.corpus.resolve(), args.runs, tmpdir / "baseline")
            finally:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
    cols = list(results)
    print(f"CLI wall seconds, median of {args.runs} (first build: one run); corpus {args.corpus}")
    print(f"{'command':<18}" + "".join(f"{c:>11}" for c in cols) + ("   current/baseline" if args.baseline else ""))
    for key in results["current"]:
        row = f"{key:<18}" + "".join(f"{results[c][key]:>11.2f}" for c in cols)
        if args.baseline:
            row += f"   {results['current'][key] / results['baseline'][key]:>8.2f}x"
        print(row)


if __name__ == "__main__":
    main()
