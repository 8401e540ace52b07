"""Refresh timings on the bundled sample corpus: full refresh into an empty index vs a no-change refresh.

Prints the median of N runs of each, per stage and end to end (inside the flow), plus the ratio
no-change / full measured in the same run. Uses the embedded PostgreSQL in a temporary home and
Prefect's ephemeral API (its start-up is paid once, before the timed runs).

    python bench/refresh.py [--runs 3] [--corpus examples/sample-corpus]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpusync.core.offline import apply_offline_defaults

apply_offline_defaults()
os.environ.setdefault("CORPUSYNC_EMBEDDER", "minilm")  # the benches measure the demo/test model unless told


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parent.parent / "examples/sample-corpus")
    args = ap.parse_args()

    from corpusync.store import db, embedded
    from flows.refresh import refresh
    from schemas.settings import Settings

    with tempfile.TemporaryDirectory(prefix="corpusync-bench-") as tmp:
        base = Settings(home=Path(tmp))
        admin_url = embedded.resolve_database(base).url
        results: dict[str, list[dict[str, float]]] = {"full": [], "no-change": []}
        for i in range(args.runs):
            name = f"bench_{i}"
            with db.connection(admin_url, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # fixed names, not input
                c.execute(f'CREATE DATABASE "{name}"')
            head, _, query = admin_url.partition("?")
            settings = base.model_copy(update={"database_url": f"{head.rsplit('/', 1)[0]}/{name}?{query}"})
            for kind in ("full", "no-change"):
                t0 = time.perf_counter()
                summary = refresh(str(args.corpus), settings=settings)
                wall = time.perf_counter() - t0
                results[kind].append(summary["timings"] | {"flow_wall": wall})
                if kind == "full":
                    docs, chunks = summary["documents"]["new"], summary["chunks"]["inserted"]
        stages = sorted({k for r in results["full"] for k in r} - {"flow_wall"}, key=list(results["full"][0]).index)
        print(f"corpus: {args.corpus} ({docs} documents, {chunks} chunks), median of {args.runs} runs, seconds")
        print(f"{'stage':<12}{'full':>10}{'no-change':>12}")
        for stage in [*stages, "flow_wall"]:
            f = statistics.median(r.get(stage, 0.0) for r in results["full"])
            n = statistics.median(r.get(stage, 0.0) for r in results["no-change"])
            print(f"{stage:<12}{f:>10.3f}{n:>12.3f}")
        full = statistics.median(r["flow_wall"] for r in results["full"])
        none = statistics.median(r["flow_wall"] for r in results["no-change"])
        print(f"no-change / full = {none / full:.3f}  ({full / none:.1f}x faster)")
        embedded.stop_embedded(base)


if __name__ == "__main__":
    main()
