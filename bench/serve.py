"""Query-service latency and throughput (`corpusync serve`) against the CLI's per-query cost.

Starts `corpusync serve` on 127.0.0.1 (a free port) in a subprocess over an existing index, waits for
/health, then per mode runs C concurrent clients (threads, one keep-alive HTTP client each) of Q queries each
over gold-set questions (CMRC 2018 + SQuAD dev by default), under a total time cap per run. Prints p50/p95
latency and throughput per mode (median over --runs runs), next to the wall time of one `corpusync query`
process (process start, model load, connect, search: what an application pays per query without the
service).

Usage: python bench/serve.py [--home .corpusync-bench] [--clients 4] [--queries 50] [--runs 3]
                             [--modes hybrid,dense,lexical] [--cap-s 60] [--cli-runs 3]
The index's settings (CORPUSYNC_EMBEDDER, CORPUSYNC_MODEL_PATH, ...) come from the environment, as for the CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from corpusync.core.lifetime import stop_process  # noqa: E402
from corpusync.core.offline import apply_offline_defaults  # noqa: E402

apply_offline_defaults()

from evaluation.goldsets import load_goldset, sample_questions  # noqa: E402

GOLDSETS = [REPO.parent / "shared" / "data" / "goldsets" / n for n in ("cmrc2018", "squad-v1.1-dev")]
CLI = [sys.executable, "-c", "import sys; from corpusync.cli import main; sys.exit(main(sys.argv[1:]))"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, body: dict[str, Any] | None = None, timeout: float = 30.0) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


class Client:
    """One keep-alive connection (httpx when installed, else urllib: a connection per request)."""

    def __init__(self, base: str) -> None:
        self.base = base
        try:
            import httpx

            self.http: Any = httpx.Client(base_url=base, timeout=60.0)
        except ImportError:
            self.http = None

    def search(self, body: dict[str, Any]) -> int:
        if self.http is not None:
            return int(self.http.post("/search", json=body).status_code)
        return get_json(self.base + "/search", body, timeout=60.0)[0]

    def close(self) -> None:
        if self.http is not None:
            self.http.close()


def questions(limit: int) -> list[str]:
    per = max(1, limit // len(GOLDSETS) + 1)
    sets = [[q.question for q in sample_questions(load_goldset(p), per).questions] for p in GOLDSETS if p.exists()]
    if not sets:
        raise SystemExit(f"no gold set found under {GOLDSETS[0].parent}")
    mixed = [q for group in zip(*sets, strict=False) for q in group]  # interleave the languages
    return (mixed or sets[0])[:limit]


def run_load(base: str, mode: str, qs: list[str], clients: int, per_client: int, k: int,
             cap_s: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + cap_s

    def worker(c: int) -> None:
        client = Client(base)
        try:
            for j in range(per_client):
                if time.monotonic() >= deadline:
                    return
                q = qs[(c * per_client + j) % len(qs)]
                t0 = time.perf_counter()
                status = client.search({"query": q, "k": k, "mode": mode})
                dt = time.perf_counter() - t0
                with lock:
                    if status == 200:
                        latencies.append(dt)
                    else:
                        errors[0] += 1
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(cap_s + 60)
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    return {"n": len(lat), "errors": errors[0], "p50_ms": percentile_ms(lat, 0.50),
            "p95_ms": percentile_ms(lat, 0.95), "qps": len(lat) / wall if wall else 0.0}


def percentile_ms(sorted_s: list[float], p: float) -> float:
    if not sorted_s:
        return float("nan")
    return sorted_s[min(len(sorted_s) - 1, round(p * (len(sorted_s) - 1)))] * 1000


def cli_cost(home: str, q: str, mode: str, runs: int, k: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([*CLI, "--home", home, "query", q, "-k", str(k), "--mode", mode, "--json"], cwd=REPO,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=300)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", default=".corpusync-bench")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--queries", type=int, default=50, help="queries per client per run")
    ap.add_argument("--runs", type=int, default=3, help="runs per mode (the median is reported)")
    ap.add_argument("--modes", default="hybrid,dense,lexical")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--cap-s", type=float, default=60.0, help="longest time one run may take")
    ap.add_argument("--cli-runs", type=int, default=3, help="`corpusync query` processes timed (0: skip)")
    ap.add_argument("--startup-timeout-s", type=float, default=300.0)
    args = ap.parse_args()
    clients, per_client = max(1, min(args.clients, 64)), max(1, min(args.queries, 10_000))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    qs = questions(clients * per_client)
    args.home = str(Path(args.home).resolve())

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile("w+", prefix="corpusync-serve-", suffix=".log", delete=False)  # noqa: SIM115
    t0 = time.perf_counter()
    proc = subprocess.Popen([*CLI, "--home", args.home, "serve", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise SystemExit(f"the service exited ({proc.returncode}):\n{log.read()[-3000:]}")
            try:
                status, health = get_json(base + "/health", timeout=2.0)
                if status == 200:
                    break
            except (OSError, ValueError):
                pass
            if time.perf_counter() - t0 > args.startup_timeout_s:
                raise SystemExit(f"the service did not answer /health within {args.startup_timeout_s:g}s")
            time.sleep(0.5)
        startup = time.perf_counter() - t0
        print(f"service on {base}: ready in {startup:.1f}s; generation {health['published_generation']}, "
              f"model {health['model']}; {clients} clients x {per_client} queries, {len(qs)} questions, "
              f"k={args.k}, median of {args.runs} run(s)\n")
        rows = []
        for mode in modes:
            run_load(base, mode, qs[:8], min(clients, 2), 2, args.k, 30.0)  # warm-up
            results = [run_load(base, mode, qs, clients, per_client, args.k, args.cap_s)
                       for _ in range(max(1, args.runs))]
            med = {key: statistics.median(r[key] for r in results) for key in ("p50_ms", "p95_ms", "qps")}
            cli = cli_cost(args.home, qs[0], mode, args.cli_runs, args.k) if args.cli_runs > 0 else float("nan")
            rows.append((mode, sum(r["n"] for r in results), sum(r["errors"] for r in results), med, cli))
    finally:
        stop_process(proc, 30)
        log.close()
        os.unlink(log.name)

    print("| mode | queries | errors | p50 ms | p95 ms | queries/s | `corpusync query` process s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode, n, errors, med, cli in rows:
        print(f"| {mode} | {n} | {errors} | {med['p50_ms']:.1f} | {med['p95_ms']:.1f} | {med['qps']:.1f} | "
              f"{cli:.2f} |")


if __name__ == "__main__":
    main()
