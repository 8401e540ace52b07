"""CLI wall times as a user meets them: each command a fresh process, as a scheduled refresh or a shell runs it.

Indexes the sample corpus into a temporary home, then times (median of N runs) a no-op refresh, a lexical, a
dense and a hybrid query, a small change (one file edited) and, on a corpus of 100 files or more, a 1% change as
the peer benchmark makes it (1% of the files get a sentence appended, 1% are deleted, 1% are added with new text),
both with the local Prefect API server the commands share (started by the first build) and, as "own API", with
CORPUSYNC_LOCAL_API_LINGER_S=0 (each command starts and stops its own, as before the shared server); and, as
"own model", with CORPUSYNC_MODEL_LINGER_S=0 (each command loads the model, as a nightly refresh that finds no
shared model server does; code without the shared server ignores the variable).
With --baseline REF the same is measured, in
the same run, for the code at git REF (a temporary worktree, same virtualenv, its own home), and the ratios
current / baseline are printed.

    python bench/cli.py [--runs 5] [--baseline HEAD~1] [--corpus examples/sample-corpus]

The 1% change on the peer corpus (2,067 SQuAD paragraphs, one Markdown file each):

    corpusync goldset export ../shared/data/goldsets/squad-v1.1-dev /tmp/squad-md
    python bench/cli.py --runs 3 --corpus /tmp/squad-md --markdown --only refresh

(--markdown writes each exported passage as the peer benchmark writes it: `# Title`, a blank line, the text, in
a .md file.)
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


def _cli(code: Path, home: Path, *args: str, **extra_env: str) -> float:
    """Wall seconds of one CLI command in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(code), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               CORPUSYNC_EMBEDDER=os.environ.get("CORPUSYNC_EMBEDDER", "minilm"), **extra_env)
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


def change_one_percent(src: Path, run: int) -> None:
    """The peer benchmark's change: 1% of the files modified (a sentence appended), 1% deleted, 1% added (new
    text: a deleted file's sentences in reverse order under a new name), spread evenly over the corpus."""
    files = sorted(p for p in src.rglob("*.md") if p.name != "SOURCE.md")
    n = max(1, round(len(files) / 100))
    step = len(files) // (2 * n)
    modified, deleted = files[0::step][:n], files[step // 2::step][:n]
    deleted = [p for p in deleted if p not in modified]
    for i, p in enumerate(modified):
        p.write_text(p.read_text(encoding="utf-8") + f"\n\nbench-marker-mod-{run}-{i} was appended.\n",
                     encoding="utf-8")
    for i, p in enumerate(deleted):
        text = p.read_text(encoding="utf-8")
        p.unlink()
        sentences = [s for s in text.replace("\n", " ").split(". ") if s.strip()]
        (p.parent / f"added-{run}-{i}.md").write_text(
            f"# Added {run}-{i}\n\nbench-marker-new-{run}-{i}. " + ". ".join(reversed(sentences)) + "\n",
            encoding="utf-8")


def as_markdown(corpus: Path, dest: Path) -> None:
    """The exported passages (title line, blank line, text) as the peer benchmark's Markdown files."""
    dest.mkdir(parents=True)
    for p in sorted(corpus.glob("*.txt")):
        title, _, text = p.read_text(encoding="utf-8").partition("\n\n")
        (dest / f"{p.stem}.md").write_text(f"# {title.strip()}\n\n{text.strip()}\n", encoding="utf-8")


def measure(code: Path, corpus: Path, runs: int, work: Path, only: str, markdown: bool) -> dict[str, float]:
    home = work / "home"
    src = work / "corpus"
    if markdown:
        as_markdown(corpus, src)
    else:
        shutil.copytree(corpus, src)
    out: dict[str, float] = {"first build": _cli(code, home, "refresh", str(src), "-q")}
    times: dict[str, list[float]] = {"no-op refresh": [], "one file edited": []}
    if only != "refresh":
        times |= {f"{mode} query": [] for mode in QUERIES} | {"dense query, own model": []}
    times["one file edited, own model"] = []
    big = sum(1 for p in src.rglob("*.md") if p.name != "SOURCE.md") >= 100
    if big:
        times["1% change"] = []
        times["1% change, own API"] = []  # no shared local API server: each command starts its own
        times["1% change, own model"] = []  # no shared model server: each command loads the model
    edited = sorted(p for p in src.rglob("*.md") if p.name != "SOURCE.md")[0]  # SOURCE.md is not indexed
    for i in range(runs):
        times["no-op refresh"].append(_cli(code, home, "refresh", str(src), "-q"))
        if only != "refresh":
            for mode, text in QUERIES.items():
                times[f"{mode} query"].append(_cli(code, home, "query", text, "--mode", mode, "-k", "5", "--json"))
            times["dense query, own model"].append(_cli(code, home, "query", QUERIES["dense"], "--mode", "dense",
                                                        "-k", "5", "--json", CORPUSYNC_MODEL_LINGER_S="0"))
        edited.write_text(edited.read_text(encoding="utf-8") + f"\n\nEdit {i}.\n", encoding="utf-8")
        times["one file edited"].append(_cli(code, home, "refresh", str(src), "-q"))
        edited.write_text(edited.read_text(encoding="utf-8") + f"\n\nEdit {i} again.\n", encoding="utf-8")
        times["one file edited, own model"].append(_cli(code, home, "refresh", str(src), "-q",
                                                        CORPUSYNC_MODEL_LINGER_S="0"))
        if big:
            change_one_percent(src, i)
            times["1% change"].append(_cli(code, home, "refresh", str(src), "-q"))
            change_one_percent(src, runs + i)
            times["1% change, own API"].append(_cli(code, home, "refresh", str(src), "-q",
                                                    CORPUSYNC_LOCAL_API_LINGER_S="0"))
            change_one_percent(src, 2 * runs + i)
            times["1% change, own model"].append(_cli(code, home, "refresh", str(src), "-q",
                                                      CORPUSYNC_MODEL_LINGER_S="0"))
    if (code / "corpusync" / "adapters" / "model_server.py").exists():
        _cli(code, home, "model", "stop")
    _cli(code, home, "db", "stop")
    for k, v in times.items():
        print(f"{code.name:>14} {k}: " + " ".join(f"{t:.2f}" for t in v), file=sys.stderr)
    return out | {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline", help="git ref to measure next to the working tree (e.g. HEAD~3)")
    ap.add_argument("--corpus", type=Path, default=REPO / "examples" / "sample-corpus")
    ap.add_argument("--markdown", action="store_true", help="the corpus's .txt passages as Markdown files")
    ap.add_argument("--only", choices=["all", "refresh"], default="all", help="refresh: leave out the queries")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="corpusync-bench-cli-") as tmp:
        tmpdir = Path(tmp)
        results = {"current": measure(REPO, args.corpus.resolve(), args.runs, tmpdir / "current", args.only,
                                      args.markdown)}
        if args.baseline:
            tree = tmpdir / "baseline-tree"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), args.baseline],
                           check=True, capture_output=True)
            try:
                results["baseline"] = measure(tree, args.corpus.resolve(), args.runs, tmpdir / "baseline", args.only,
                                              args.markdown)
            finally:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
        sys.path.insert(0, str(REPO))
        from corpusync.core.prefect_local import stop_shared

        stop_shared()  # the server the current code's commands shared
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
