"""Work survives, on a real corpus: a first build SIGKILLed at ~90% of its embedding, then the next run; a
refresh the gate refuses, then the cause fixed and the refresh run again. Each command a fresh CLI process.

    corpusync goldset export ../shared/data/goldsets/squad-v1.1-dev /tmp/squad-md
    python bench/resume.py --corpus /tmp/squad-md --goldset ../shared/data/goldsets/squad-v1.1-dev

1. An uninterrupted first build in one home: the chunks it embeds (N) and its live content.
2. In a second home, the same build in its own process group, SIGKILLed once 90% of N vectors are in the
   vector cache (polled in the database); the next refresh's embedded count as a share of N, its wall time,
   and whether its live content equals the uninterrupted build's.
3. With the gold set configured: a refresh with a 1% change (new text) plus a fault (20% of the files'
   contents rotated among them: the gate sees retrieval break) is refused; the files are put back and the
   refresh runs again: what it embeds, against what the refused run embedded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parent.parent
LIVE = "SELECT source_path, md5(text) FROM corpusync.live_chunks ORDER BY source_path, ordinal"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               CORPUSYNC_EMBEDDER=os.environ.get("CORPUSYNC_EMBEDDER", "minilm"), **extra)
    env.pop("PREFECT_API_URL", None)
    return env


def _cmd(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "corpusync.cli", "--home", str(home), *args]


def refresh(home: Path, src: Path, **env: str) -> tuple[dict[str, Any], float, int]:
    """One `corpusync refresh --json`: its summary, wall seconds and exit code (1: refused)."""
    t0 = time.perf_counter()
    proc = subprocess.run(_cmd(home, "refresh", str(src), "--json", "-q"), cwd=REPO, env=_env(**env),
                          capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"refresh failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout), wall, proc.returncode


def _url(home: Path) -> str:
    proc = subprocess.run(_cmd(home, "db", "url"), cwd=REPO, env=_env(), capture_output=True, text=True,
                          check=True)
    return proc.stdout.strip()


def live(home: Path) -> list[tuple[str, str]]:
    with psycopg.connect(_url(home)) as conn:
        return [(str(a), str(b)) for a, b in conn.execute(LIVE).fetchall()]


def kill_at(home: Path, src: Path, cached: int) -> tuple[int, float]:
    """Start a first build; SIGKILL its process group once `cached` vectors are in the vector cache.
    Returns the count seen at the kill and the seconds the build had run."""
    url = _url(home)  # starts the embedded server, so the database can be polled from the start
    t0 = time.perf_counter()
    proc = subprocess.Popen(_cmd(home, "refresh", str(src), "-q"), cwd=REPO, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    seen = 0
    try:
        while proc.poll() is None:
            try:
                with psycopg.connect(url, connect_timeout=5) as conn:
                    row = conn.execute("SELECT count(*) FROM corpusync.vector_cache").fetchone()
                    seen = int(row[0]) if row else 0
            except psycopg.errors.UndefinedTable:
                seen = 0  # not migrated yet
            if seen >= cached:
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if seen < cached:
        raise SystemExit(f"the build ended before {cached} vectors were cached ({seen})")
    return seen, time.perf_counter() - t0


def _files(src: Path) -> list[Path]:
    """The corpus's files, whatever their format (an export writes .txt; the peers' corpus is the same as .md)."""
    files = sorted(p for p in src.rglob("*") if p.is_file())
    if len(files) < 100:
        raise SystemExit(f"{src}: {len(files)} files; the bench changes 1% of them, so it needs at least 100")
    return files


def change_one_percent(src: Path, tag: str) -> None:
    """1% of the files get a new sentence (new text for the model)."""
    files = _files(src)
    for i, p in enumerate(files[:: 100]):
        p.write_text(p.read_text(encoding="utf-8") + f"\n\n{tag} note {i}: this passage was revised.\n",
                     encoding="utf-8")


def rotate(src: Path, share: float) -> dict[Path, str]:
    """The fault: `share` of the files get another file's content (every text already known to the model).
    Returns the originals, to put back."""
    files = _files(src)[1::int(1 / share)]
    originals = {p: p.read_text(encoding="utf-8") for p in files}
    texts = list(originals.values())
    for p, text in zip(files, texts[1:] + texts[:1], strict=True):
        p.write_text(text, encoding="utf-8")
    return originals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="a `corpusync goldset export` folder")
    ap.add_argument("--goldset", type=Path, required=True, help="the gold set the corpus was exported from")
    ap.add_argument("--kill-at", type=float, default=0.9, help="share of the build's chunks cached at the kill")
    ap.add_argument("--questions", type=int, default=200, help="gold-set questions the gate evaluates")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="corpusync-bench-resume-") as tmp:
        root = Path(tmp)
        src = root / "corpus"
        shutil.copytree(args.corpus, src)

        whole, whole_s, _ = refresh(root / "whole", src)
        n = whole["chunks"]["embedded"]
        expected = live(root / "whole")
        print(f"uninterrupted first build: {n} chunks embedded, {whole_s:.1f} s")

        home = root / "killed"
        seen, ran_s = kill_at(home, src, int(args.kill_at * n))
        after, after_s, _ = refresh(home, src)
        same = live(home) == expected
        print(f"SIGKILL after {ran_s:.1f} s with {seen}/{n} vectors cached ({seen / n:.0%}); the next run embedded "
              f"{after['chunks']['embedded']} ({after['chunks']['embedded'] / n:.1%} of {n}), reused "
              f"{after['chunks']['reused']}, {after_s:.1f} s; live content equal to the uninterrupted build: {same}")
        print(f"  its message: {after.get('message')!r}")

        gate = {"CORPUSYNC_GOLDSETS": json.dumps([str(args.goldset.resolve())]),
                "CORPUSYNC_EVAL_MAX_QUESTIONS": str(args.questions)}
        change_one_percent(src, "bench")
        originals = rotate(src, 0.2)
        refused, refused_s, code = refresh(home, src, **gate)
        print(f"1% change + 20% of the files rotated: exit {code}, status {refused['status']}, embedded "
              f"{refused['chunks']['embedded']}, {refused_s:.1f} s")
        for p, text in originals.items():
            p.write_text(text, encoding="utf-8")
        fixed, fixed_s, code = refresh(home, src, **gate)
        print(f"files put back: exit {code}, status {fixed['status']}, embedded {fixed['chunks']['embedded']} "
              f"(reused {fixed['chunks']['reused']}), {fixed_s:.1f} s")
        for h in ("whole", "killed"):
            subprocess.run(_cmd(root / h, "db", "stop"), cwd=REPO, env=_env(), capture_output=True, check=False)


if __name__ == "__main__":
    main()
