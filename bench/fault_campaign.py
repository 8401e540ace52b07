"""The fault campaign's state (bench/faults.py): its configuration, the homes and processes it started, the
reference content of each corpus state, and convergence (a normal refresh and a prune after a fault must
give exactly an uninterrupted run's content)."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.fault_procs import REPO, Content, Outcome, Proc, content, home_url, invariants

# ------------------------------------------------------------------------------------------------------
# the campaign


# What each process of a refresh's tree may hold at its peak (MiB PSS; measured on the hostile corpus with
# MiniLM: refresh 595, parse worker idle 454, the same worker OCRing a 6,000 x 6,000 image 1,258,
# validation worker 212). OCR is the largest part: RapidOCR detects on images reduced to 2,000 px, and
# onnxruntime's working set for that is ~0.8 GB, whatever the image.
REFRESH_BUDGET_MIB = 768
PARSE_WORKER_BUDGET_MIB = 512 + 896  # parsers and an OCR engine loaded, plus one OCR detection running
VALIDATE_BUDGET_MIB = 256


def tree_budget_mib(parse_workers: int) -> int:
    """The bound on a refresh's process tree: the refresh, every parse worker OCRing at once (nothing keeps
    two workers from reading large scans together), the validation worker. It follows the worker count:
    a fixed figure is either loose on 2 cores or failed by normal work on 16."""
    return REFRESH_BUDGET_MIB + parse_workers * PARSE_WORKER_BUDGET_MIB + VALIDATE_BUDGET_MIB


@dataclass
class Config:
    full: bool = False
    kills: int | None = None
    plan: str = ""
    seed: int = 15
    gate: bool | None = None
    prefect: str = ""  # "shared" or "ephemeral"
    rss_bound_mib: int = 0  # 0: tree_budget_mib() for the machine's parse workers
    refresh_timeout_s: float = 0.0
    root: Path | None = None
    keep: bool = False
    # seconds between two memory samples of a refresh whose peak is only reported (the hostile refresh, whose
    # peak is held to the bound, is sampled every 0.1 s); 0: 0.1 with --full, else 1.0
    sample_s: float = 0.0
    # parse workers of the refreshes whose subject is not the pool (0: the machine's default, one per CPU). The
    # main-pid kill and the hostile refresh always run the default pool: what outlives a SIGKILLed main pid, and
    # the process tree's memory bound, are about the pool. A worker's warm-up is seconds of CPU per refresh.
    parse_workers: int = 0

    def __post_init__(self) -> None:
        self.gate = self.full if self.gate is None else self.gate
        self.prefect = self.prefect or ("ephemeral" if self.full else "shared")
        self.refresh_timeout_s = self.refresh_timeout_s or (1800.0 if self.full else 420.0)
        self.sample_s = self.sample_s or (0.1 if self.full else 1.0)


@dataclass
class Campaign:
    cfg: Config
    root: Path = field(init=False)
    results: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from bench import hostile

        self.t_start = time.monotonic()
        self.rng = random.Random(self.cfg.seed)
        self.root = Path(self.cfg.root or tempfile.mkdtemp(prefix="corpusync-faults-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.src = self.root / "src"
        self.main = self.root / "home-main"
        self.homes: list[Path] = []
        self.procs: list[Proc] = []
        self.n = 0
        self.states = hostile.campaign_states(self.cfg.seed)
        self.goldset = hostile.write_goldset(self.root / "goldset.jsonl")
        self.refs: dict[str, Content] = {}
        self.state = ""
        self.calibration: list[tuple[float, str, str, int]] = []
        self.peak_rss = 0
        self.prefect_server: subprocess.Popen[bytes] | None = None
        self.prefect_url = ""
        self.prefect_url = self._start_prefect() if self.cfg.prefect == "shared" else ""
        self.results.update(config={k: str(v) for k, v in vars(self.cfg).items()}, kills=[], refreshes=[])

    # --- infrastructure ------------------------------------------------------------------------------

    def env(self, extra: dict[str, str] | None = None, ephemeral: bool = False) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()  # the parse workers: cfg.parse_workers (a test session sets 1)
               if k not in {"CORPUSYNC_HOME", "DATABASE_URL", "CORPUSYNC_DATABASE_URL", "PREFECT_API_URL",
                            "CORPUSYNC_PARSE_WORKERS"}}
        env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PREFECT_HOME": str(self.root / "prefect"),
                "PREFECT_LOGGING_LEVEL": "WARNING", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "CORPUSYNC_CHUNK_MAX_TOKENS": "128", "PYTHONUNBUFFERED": "1",
                # several embedding batches per refresh (a kill can land between them); no generation kept
                # behind the live one, so every state change embeds again (A -> B -> A would reuse all)
                "CORPUSYNC_EMBED_BATCH_TOKENS": "1024", "CORPUSYNC_RETENTION_GENERATIONS": "0",
                # the refreshes of a home share one model process, as the CLI's do by default (a test session
                # sets 0: each command loads the model); those that must hold the model in their own tree set 0
                "CORPUSYNC_MODEL_LINGER_S": "600"}
        env.setdefault("CORPUSYNC_EMBEDDER", "minilm")  # the packaged model, unless one is configured
        if self.cfg.parse_workers:
            env["CORPUSYNC_PARSE_WORKERS"] = str(self.cfg.parse_workers)
        if self.cfg.gate:
            env["CORPUSYNC_GOLDSETS"] = json.dumps([str(self.goldset)])
        if self.prefect_url and not ephemeral:
            env["PREFECT_API_URL"] = self.prefect_url
        return env | (extra or {})

    def _start_prefect(self) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = self.env() | {"PREFECT_SERVER_UI_ENABLED": "false"}
        log = (self.root / "prefect-server.log").open("wb")
        self.prefect_server = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port),
             "--no-services"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}/api"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return url
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"the shared Prefect API did not start: see {self.root / 'prefect-server.log'}")

    def spawn(self, home: Path, cli_args: list[str], *, pause: str = "", env: dict[str, str] | None = None,
              ephemeral: bool = False, tag: str = "", sample_s: float = 0.0) -> Proc:
        if home not in self.homes:
            self.homes.append(home)
        self.n += 1
        proc = Proc(["--home", str(home), *cli_args], self.env(env, ephemeral),
                    self.root / "runs" / f"{self.n:03d}-{tag or cli_args[0]}", pause, sample_s or self.cfg.sample_s)
        self.procs.append(proc)
        return proc

    def refresh(self, home: Path, src: Path | None = None, **kw: Any) -> Proc:
        return self.spawn(home, ["refresh", str(src or self.src), "--json"], **kw)

    def finish(self, proc: Proc, what: str, timeout: float | None = None) -> Outcome:
        out = proc.wait(timeout or self.cfg.refresh_timeout_s)
        self.peak_rss = max(self.peak_rss, out.peak_rss)
        self.results["refreshes"].append({"what": what, **out.brief()})
        return out

    def run(self, home: Path, what: str, src: Path | None = None, **kw: Any) -> Outcome:
        return self.finish(self.refresh(home, src, **kw), what)

    def cli(self, home: Path, *args: str) -> Outcome:
        return self.spawn(home, list(args)).wait(300)

    def snapshot(self, home: Path, generation: int | None = None) -> Content:
        return content(home_url(home), generation)

    def write_state(self, name: str) -> None:
        from bench import hostile

        hostile.write_state(self.src, self.states[name])
        self.state = name

    def close(self) -> None:
        for p in self.procs:
            if p.popen.poll() is None:
                p.kill_tree()
        if self.prefect_server is not None:
            try:
                os.killpg(self.prefect_server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.prefect_server.wait()
        from corpusync.adapters import model_server
        from corpusync.store import embedded
        from schemas.settings import Settings

        for home in self.homes:
            model_server.stop_servers(home)
            try:
                embedded.stop_embedded(Settings(home=home))
            except Exception as exc:  # cleanup must reach every home
                print(f"could not stop the database of {home}: {exc}", file=sys.stderr)
        if not self.cfg.keep:
            import shutil

            shutil.rmtree(self.root, ignore_errors=True)

    # --- baseline ----------------------------------------------------------------------------------

    def baseline(self) -> None:
        """Index A in the main home (an uninterrupted run in a fresh home: the reference for A), then B
        incrementally; index B in a fresh home for B's reference; the incremental B must equal it."""
        self.write_state("A")
        first = self.run(self.main, "baseline A")
        assert first.rc == 0 and first.status == "published", f"baseline refresh failed: {first.brief()}"
        self.refs["A"] = self.snapshot(self.main)
        fresh = self.root / "home-ref-B"
        self.write_state("B")
        proc = self.refresh(self.main, tag="A-to-B")
        out = self.finish(proc, "baseline A->B")
        assert out.rc == 0 and out.status == "published", f"A->B refresh failed: {out.brief()}"
        self.calibration = proc.marks()
        incremental = self.snapshot(self.main)
        ref = self.run(fresh, "reference B (fresh home)")
        assert ref.rc == 0, f"reference refresh failed: {ref.brief()}"
        self.refs["B"] = self.snapshot(fresh)
        self.results["baseline"] = {"incremental_equals_fresh": incremental.docs == self.refs["B"].docs,
                                    "documents": {k: len(v.docs) for k, v in self.refs.items()}}

    def other(self) -> str:
        return "A" if self.state == "B" else "B"


def default_pool() -> dict[str, str]:
    """The setting for the machine's default parse pool (one worker per CPU), whatever cfg.parse_workers is."""
    from tasks.parse_worker import default_workers

    return {"CORPUSYNC_PARSE_WORKERS": str(default_workers())}


def previous_generation(url: str) -> int | None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT max(generation) FROM corpusync.generations WHERE status = 'superseded' "
                           "AND generation < corpusync.published_generation()").fetchone()
    return row[0] if row else None


def converge(c: Campaign, what: str, target: str, rec: dict[str, Any], retention: int = 0) -> bool:
    """A normal refresh, then `corpusync prune`: the live content must equal an uninterrupted run's, with no
    duplicate, orphan or unpublished row left."""
    keep = {"CORPUSYNC_RETENTION_GENERATIONS": str(retention)}
    proc = c.refresh(c.main, tag="converge", env=keep)
    out = c.finish(proc, what)
    pruned = c.spawn(c.main, ["prune"], env=keep).wait(300)
    url = home_url(c.main)
    got = content(url)
    bad = {k: v for k, v in invariants(url, retention).items() if v}
    rec.update(converge=out.brief(), prune_rc=pruned.rc, twice=got.twice, invariants=bad,
               equal_to_uninterrupted=got.docs == c.refs[target].docs)
    if out.status == "published":
        c.calibration = proc.marks()
    rec["converged"] = bool(out.rc == 0 and pruned.rc == 0 and rec["equal_to_uninterrupted"] and not got.twice
                            and not bad)
    return rec["converged"]
