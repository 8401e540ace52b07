"""Parse documents in a pool of isolated worker processes, so a parser that crashes (PyMuPDF can segfault on
malformed files), hangs or eats memory costs one document, not the run, and a refresh parses on every CPU.
This module is the pool, in the parent; what runs inside a worker is tasks/parse_in_worker.py.

The pool is pebble's ProcessPool (spawned workers, one document at a time each, a worker stopped on timeout
and replaced after a crash, recycled after MAX_TASKS_PER_WORKER tasks to bound leaks). Each worker applies
the memory limit and warms up in its initializer (parse_in_worker.init_worker), so the parse clock, which
pebble starts when a worker takes a document, never counts start-up. A worker that cannot set its memory
limit says so with every result; the parent warns once and keeps the reason (memory_limit_problem).

A document's deadline grows with its work: parse_timeout_s plus parse_timeout_per_page_s per page
(parse_deadline_s). The pages of PDFs and multi-frame TIFFs are counted in the worker, not in the parent:
opening a hostile PDF is exactly what can crash a process. The count and the parse are one task, under the
deadline of PARSE_AT_ONCE_PAGES pages: a document within that many pages (most) is parsed at once; a longer
one comes back with its count and is parsed under its own deadline (a separate count before every parse cost
a text-PDF pass 8%, bench/parse_pool.py). Other files count 0 pages (their parse time does not follow a page
count that can be read cheaply).

pebble's word on which document killed a worker is not final, and it can lose the one that did: it stays
'running' on the dead worker until its deadline (tasks/parse_deaths.py). So the document pebble blames is
parsed alone, in a process of its own whose verdict is certain, and so is an orphan (a document pebble has
running on a worker it no longer has, for ORPHAN_CHECK_S). The other workers go on. A pool
that broke or stalled is replaced, and what was in flight is parsed again; a document in flight when that
happened POOL_BREAKS_PER_FILE times is parsed alone.
"""

from __future__ import annotations

import itertools
import logging
import math
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from pebble import ProcessExpired

from corpusync.core.cpus import usable_cpus
from corpusync.core.errors import ParseError
from schemas.records import ParsedDocument, SourceFile
from tasks.parse import ParseOptions, parse_document
from tasks.parse_deaths import AloneRuns, WatchedPool
from tasks.parse_in_worker import ParseFn, init_worker, parse_one
from tasks.parse_warmup import new_warm_dir

Result = ParsedDocument | ParseError

log = logging.getLogger(__name__)

# Tasks (a long document's page count included) after which pebble replaces a worker: a backstop against leaks
# that the per-document clean-up (parse_in_worker._release_freed_memory) and the memory limit do not catch. A
# replacement costs ~1.3 s (spawn, imports, warm-up); at 500 that was 13% of a text-PDF pass (bench/parse_pool.py)
# and a restart every ~2.5 s of Markdown passages; at 10,000 it is under 2% even for 5 ms documents.
MAX_TASKS_PER_WORKER = 10_000
MAX_SCALED_PAGES = 5000  # a hostile million-page PDF does not buy a deadline of days
# A paged document of up to this many pages is counted and parsed in one task, under this many pages'
# deadline (at most that much more than its own: parse_timeout_per_page_s x this).
PARSE_AT_ONCE_PAGES = 16
STALL_GRACE_S = 300.0  # past every deadline in flight plus this, with nothing finished: the pool lost a task
POOL_BREAKS_PER_FILE = 3  # a file in flight when the pool broke this often is parsed alone
ORPHAN_CHECK_S = 2.0  # how often the pool looks for documents left running on a dead worker
PAGED = (".pdf", ".tif", ".tiff", ".docx", ".pptx")  # pages, or pictures OCR may read (office_pictures)
UNSTRUCTURED = (".md", ".markdown", ".html", ".htm", ".docx", ".pptx", ".xlsx", ".doc", ".ppt", ".xls")


def default_workers() -> int:
    """One worker per CPU this process may run on."""
    return usable_cpus()


def parse_deadline_s(pages: int | None, base_s: float, per_page_s: float) -> float:
    """Seconds a document may take: the base plus per_page_s for each page (None: not counted, 0 pages),
    at most MAX_SCALED_PAGES pages counted."""
    return base_s + per_page_s * min(max(pages or 0, 0), MAX_SCALED_PAGES)


@dataclass
class _Job:
    index: int
    src: SourceFile
    counted: bool = False  # pages were asked for (or need not be)
    pages: int | None = None
    deadline: float = 0.0
    probing: bool = False  # in flight as count-and-parse: may come back with its page count
    arrival: float = math.inf  # when its result came back, in order (not yet: last)
    breaks: int = 0
    alone: bool = False  # in flight in a process of its own (tasks/parse_deaths.py), not in the pool


def _arrived(job: _Job, order: Iterator[int], _: Future[Any]) -> None:
    """A future's done-callback: the job's place in the order results came back in."""
    job.arrival = next(order)


class ParsePool:
    """`parse_many(sources)` yields (source, ParsedDocument | ParseError) for every source: ParseError
    'crashed' (with the signal), 'timeout', 'out-of-memory' or the parser's own. `parse(src)` does one.
    `memory_limit_problem`: why the memory limit could not be applied (None: it was, or none was asked).
    `restarts`: workers replaced after a crash or a timeout, pools after a break."""

    def __init__(self, options: ParseOptions, *, workers: int | None = None, timeout_s: float = 600.0,
                 timeout_per_page_s: float = 0.0, memory_mb: int = 8192, parse: ParseFn = parse_document,
                 warm_for: Iterable[str] | None = None, max_tasks: int = MAX_TASKS_PER_WORKER) -> None:
        """`parse` must be picklable (a module-level function): it travels to every worker; tests pass one
        that injects crashes and hangs. `warm_for`: the paths (or suffixes) the pool will see, to warm only
        the parsers they need (None: all). `workers`: 0 or None is one per CPU."""
        self.options = options
        self.parse_fn = parse
        self.workers = workers or default_workers()
        self.timeout_s = timeout_s
        self.timeout_per_page_s = timeout_per_page_s
        self.memory_mb = memory_mb
        self.max_tasks = max_tasks
        suffixes = None if warm_for is None else {Path(p).suffix.lower() or p for p in warm_for}
        self._warm = tuple(kind for kind, exts in (("pdf", PAGED[:1]), ("md", UNSTRUCTURED))
                           if suffixes is None or suffixes & set(exts))
        self._pool: WatchedPool | None = None
        self._warm_dir: str | None = None
        self._alone: tuple[AloneRuns, str] | None = None  # documents parsed alone, their warm-up folder
        self.restarts = 0
        self._dead_workers: set[int] = set()
        self.memory_limit_problem: str | None = None

    # -- the pool --
    def _running_pool(self) -> WatchedPool:
        if self._pool is None:
            self._warm_dir = new_warm_dir()
            self._pool = WatchedPool(max_workers=self.workers, max_tasks=self.max_tasks, initializer=init_worker,
                                     initargs=self._initargs(self._warm_dir),
                                     context=mp.get_context("spawn"))  # never fork a process with threads
        return self._pool

    def _initargs(self, warm_dir: str) -> tuple[Any, ...]:
        """init_worker's arguments, for a pool worker or a process parsing one document alone."""
        return self.options, self.memory_mb, self.parse_fn, self._warm, os.getpid(), warm_dir

    def _schedule_alone(self, job: _Job) -> Future[Any]:
        """Parse the document in a process of its own, under the deadline it had in the pool; a thread waits
        on the process, so the pool goes on meanwhile."""
        if self._alone is None:
            self._alone = (AloneRuns(), new_warm_dir())
        runs, warm_dir = self._alone
        job.alone = True
        at_most = PARSE_AT_ONCE_PAGES if job.probing else None
        return runs.submit(job.src, at_most, job.deadline, self._initargs(warm_dir))

    def _discard_pool(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool.join()
            self._pool = None
        if self._warm_dir is not None:  # what a worker stopped while warming up left
            shutil.rmtree(self._warm_dir, ignore_errors=True)
            self._warm_dir = None

    def _schedule(self, job: _Job) -> Future[Any]:
        """Parse the document; where its deadline depends on its pages and they are not counted yet, count
        them in the same task and parse at once within PARSE_AT_ONCE_PAGES pages."""
        job.alone = False
        job.probing = (not job.counted and self.timeout_per_page_s > 0
                       and Path(job.src.path).suffix.lower() in PAGED)
        job.counted = True
        pages, at_most = (PARSE_AT_ONCE_PAGES, PARSE_AT_ONCE_PAGES) if job.probing else (job.pages, None)
        job.deadline = parse_deadline_s(pages, self.timeout_s, self.timeout_per_page_s)
        for attempt in range(2):
            pool = self._running_pool()
            try:
                return pool.schedule(parse_one, (job.src, at_most), timeout=job.deadline)
            except RuntimeError:  # the pool broke between two documents: a fresh one
                if attempt:
                    raise
                self._discard_pool()
        raise AssertionError("unreachable")

    # -- results --
    def parse_many(self, sources: Iterable[SourceFile], *, ordered: bool = True,
                   largest_first: bool = True) -> Iterator[tuple[SourceFile, Result]]:
        """Every source with its result, in input order (ordered=True) or as they finish. The largest files
        are handed out first (a big one started last would leave the other workers idle at the end);
        at most 4 documents per worker are in flight, so a long input is not all queued at once."""
        jobs = [_Job(i, src) for i, src in enumerate(sources)]
        queue = deque(sorted(jobs, key=lambda j: -j.src.size) if largest_first else jobs)
        pending: dict[Future[Any], _Job] = {}
        finished: dict[int, tuple[SourceFile, Result]] = {}
        arrivals = itertools.count()  # wait() returns a set: yield what it returns in the order it came back
        next_out = 0
        orphaned: dict[Future[Any], float] = {}  # documents left running on a dead worker: since when
        last_done = next_check = time.monotonic()

        def track(future: Future[Any], job: _Job) -> None:
            future.add_done_callback(partial(_arrived, job, arrivals))
            pending[future] = job

        try:
            while queue or pending:
                while queue and len(pending) < 4 * self.workers:
                    job = queue.popleft()
                    track(self._schedule(job), job)
                in_pool = [j.deadline for j in pending.values() if not j.alone]  # alone: their own deadlines
                limit = max(max(in_pool) + STALL_GRACE_S, 1.0) if in_pool else math.inf
                wait(pending, timeout=max(min(ORPHAN_CHECK_S, last_done + limit - time.monotonic()), 0.0),
                     return_when=FIRST_COMPLETED)
                now = time.monotonic()
                done = {future for future in pending if future.done()}
                last_done = now if done else last_done
                suspects: list[_Job] = []
                broke: list[_Job] = []
                for future in sorted(done, key=lambda f: pending[f].arrival):
                    job = pending.pop(future)
                    orphaned.pop(future, None)
                    exc = CancelledError() if future.cancelled() else future.exception()
                    if not job.alone and isinstance(exc, (ProcessExpired, CancelledError, BrokenProcessPool)):
                        (broke if isinstance(exc, BrokenProcessPool) else suspects).append(job)
                        if isinstance(exc, ProcessExpired):
                            self._worker_died(exc.pid)
                        continue
                    outcome = self._outcome(job, future)
                    if outcome is None:
                        queue.appendleft(job)  # counted: now the parse itself
                    else:
                        finished[job.index] = (job.src, outcome)
                if suspects:
                    log.warning("parse pool: a parser process died; parsed alone, to find which document it died "
                                "on: %s", ", ".join(j.src.path for j in suspects))
                if now >= next_check and not broke:
                    self._cancel_orphans(pending, orphaned, now)
                    next_check = now + ORPHAN_CHECK_S
                if broke or now - last_done >= limit:
                    why = "the worker pool broke" if broke else f"no document finished in {limit:g} s"
                    suspects += self._requeue(pending, queue, why, broke)
                    orphaned.clear()
                    last_done = now
                for job in suspects:
                    track(self._schedule_alone(job), job)
                if ordered:
                    while next_out in finished:
                        yield finished.pop(next_out)
                        next_out += 1
                else:
                    for index in list(finished):
                        yield finished.pop(index)
        finally:
            for future in pending:
                future.cancel()

    def _cancel_orphans(self, pending: dict[Future[Any], _Job], orphaned: dict[Future[Any], float],
                        now: float) -> None:
        """Cancel the documents left running on a dead worker for ORPHAN_CHECK_S already (a worker that ended
        as it should, recycled, can look like it until its last result is read): they come back cancelled,
        to be parsed alone. `orphaned` keeps when each was first seen."""
        current = {f: pid for f, pid in (self._pool.orphans() if self._pool is not None else {}).items()
                   if f in pending}
        for future in set(orphaned) - current.keys():
            del orphaned[future]
        for future, pid in current.items():
            if now - orphaned.setdefault(future, now) >= ORPHAN_CHECK_S:
                log.warning("parse pool: %s was left running on a parser process that died", pending[future].src.path)
                self._worker_died(pid)
                future.cancel()

    def _worker_died(self, pid: int | None) -> None:
        """Count a worker pebble replaced after it died (once, however many documents the death concerns)."""
        if pid is None or pid not in self._dead_workers:
            self.restarts += 1
        if pid is not None:
            self._dead_workers.add(pid)

    def _requeue(self, pending: dict[Future[Any], _Job], queue: deque[_Job], why: str,
                 broke: list[_Job]) -> list[_Job]:
        """The pool broke or stalled: a fresh pool, and the documents that were in it back in the queue.
        Returns those to parse alone: in flight when this happened for the POOL_BREAKS_PER_FILE-th time."""
        in_pool = list(broke)
        for future, job in list(pending.items()):
            if not job.alone:
                in_pool.append(pending.pop(future))
        log.warning("parse pool: %s; %d document(s) in flight are parsed again in a fresh pool", why, len(in_pool))
        self._discard_pool()
        self.restarts += 1
        alone = []
        for job in sorted(in_pool, key=lambda j: -j.index):
            job.breaks += 1
            if job.breaks >= POOL_BREAKS_PER_FILE:
                alone.append(job)
            else:
                job.counted = job.counted and not job.probing
                queue.appendleft(job)
        return alone

    def _outcome(self, job: _Job, future: Future[Any]) -> Result | None:
        """The document's result, or None when it came back with its page count (the parse comes next)."""
        path = job.src.path
        exc = future.exception()
        if exc is None:
            problem, value = future.result()
            self._note_memory_limit(problem)
            if value[0] == "pages":
                job.pages = value[1]
                return None
            if value[0] == "ok":
                doc: ParsedDocument = pickle.loads(value[1])  # our own worker's bytes
                return doc
            return ParseError(path, value[1], value[2])
        if isinstance(exc, TimeoutError) and not job.alone:
            self.restarts += 1  # pebble replaced the worker
        if isinstance(exc, TimeoutError):
            pages = (f" ({self.timeout_s:g} s + {job.pages} pages x {self.timeout_per_page_s:g} s)" if job.pages else
                     f" ({self.timeout_s:g} s + {PARSE_AT_ONCE_PAGES} pages x {self.timeout_per_page_s:g} s, the "
                     f"allowance of a document of at most {PARSE_AT_ONCE_PAGES} pages)" if job.probing else "")
            return ParseError(path, "timeout", f"parsing took longer than {job.deadline:g} s{pages}; the worker was "
                              "stopped (raise CORPUSYNC_PARSE_TIMEOUT_S or CORPUSYNC_PARSE_TIMEOUT_PER_PAGE_S)")
        if isinstance(exc, ProcessExpired):
            code = exc.exitcode
            how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            hint = " (SIGKILL: possibly the kernel's out-of-memory killer)" if code == -signal.SIGKILL else ""
            return ParseError(path, "crashed", f"the parser process died ({how}) on this file{hint}")
        return ParseError(path, "parser-error", f"{type(exc).__name__}: {exc}")

    def _note_memory_limit(self, problem: str | None) -> None:
        """A worker's report on its memory limit: warned about once per pool, kept for the run."""
        if problem and self.memory_limit_problem is None:
            log.warning("parse worker: %s; it runs without one, so a parser that eats memory can exhaust the "
                        "machine (CORPUSYNC_PARSE_MEMORY_MB)", problem)
        self.memory_limit_problem = self.memory_limit_problem or problem

    def parse(self, src: SourceFile) -> ParsedDocument:
        """One document: its ParsedDocument, or raises its ParseError."""
        _, result = next(self.parse_many([src]))
        if isinstance(result, ParseError):
            raise result
        return result

    def close(self) -> None:
        self._discard_pool()
        if self._alone is not None:
            runs, warm_dir = self._alone
            runs.close()
            shutil.rmtree(warm_dir, ignore_errors=True)
            self._alone = None

    def __enter__(self) -> ParsePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ParseWorker(ParsePool):
    """One isolated worker, fixed deadline (the API before the pool; tests and tools use it)."""

    def __init__(self, options: ParseOptions, timeout_s: float, memory_mb: int,
                 parse: ParseFn = parse_document) -> None:
        super().__init__(options, workers=1, timeout_s=timeout_s, memory_mb=memory_mb, parse=parse)
