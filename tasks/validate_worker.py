"""The chunk suite in a process of its own, started (and great_expectations imported there) ahead of need.

Importing great_expectations costs about 1.6 s of CPU, under the interpreter lock of whatever process does it.
In the refresh process it competed with torch, the tokenizer and the embedding itself: 2.2 s of a one-percent
refresh's wall time on 2 cores. A worker spawned when the refresh knows there is work imports it on another
core; the stage sends plain rows and gets the suite's findings back. The worker only ever runs our own suite
over our own rows (no document input), so a dead worker is not a bad-input matter: the stage falls back to
running the suite in this process, and says why. An error of the suite itself is raised as it would be here.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from corpusync.core.lifetime import watch_parent
from tasks.validate import SuiteResult, Thresholds, run_suite

log = logging.getLogger("corpusync.validate")

_lock = threading.Lock()
_worker: _SuiteWorker | None = None
_idle: threading.Timer | None = None
# How long a released worker waits for the next refresh of the same process (a Python caller, a test session)
# before it exits: a new one costs ~4.5 s of CPU for great_expectations' import. The CLI stops it as its
# refresh command ends.
LINGER_S = 60.0


def _init_worker(parent: int) -> None:
    """The worker's initializer: tied to the refresh's life (corpusync/core/lifetime.py), then the imports the
    first suite would pay (not at a lower CPU priority: under load, a niced worker took seconds to die with
    its SIGKILLed refresh, tests/test_fault_campaign.py). Never raises (the pool would be broken); the suite reports
    a real import failure."""
    watch_parent(parent)  # not PR_SET_PDEATHSIG: that follows the thread that started the worker
    try:
        import great_expectations  # noqa: F401
        import pandas  # noqa: F401
    except Exception:
        pass


class _SuiteWorker:
    def __init__(self, target: Callable[[list[dict[str, Any]], Thresholds], SuiteResult] = run_suite) -> None:
        # concurrent.futures rather than pebble: its shutdown lets the worker exit on its own, running its
        # exit handlers (pebble terminates it, and the semaphores great_expectations made there leak)
        self.target = target  # run_suite; a test injects a fault here
        self.pool = ProcessPoolExecutor(max_workers=1, initializer=_init_worker,
                                        initargs=(os.getpid(),),
                                        mp_context=mp.get_context("spawn"))  # never fork a process with threads
        self.warm: Future[None] = self.pool.submit(_noop)  # the worker starts now, not at first use

    def run(self, rows: list[dict[str, Any]], t: Thresholds) -> SuiteResult:
        try:
            return self.pool.submit(self.target, rows, t).result()
        except BrokenProcessPool as exc:  # the worker, not the suite, failed
            log.warning("the validation worker failed (%s: %s); running the suite in this process",
                        type(exc).__name__, exc)
            return run_suite(rows, t)

    def close(self) -> None:
        """Ask the worker to exit and return: it exits while the run goes on (the pool's thread, joined
        at interpreter exit, waits for it)."""
        self.pool.shutdown(wait=False, cancel_futures=True)


def _noop() -> None:
    return None


def start() -> None:
    """Spawn the worker (once per process, or keep the one released); the next `suite()` uses it."""
    global _worker
    with _lock:
        _keep()
        if _worker is None:
            _worker = _SuiteWorker()
            atexit.register(stop)


def release(linger_s: float = LINGER_S) -> None:
    """The run needs the worker no more: it exits after `linger_s` unless a run starts it again by then."""
    global _idle
    if linger_s <= 0:
        stop()
        return
    with _lock:
        _keep()
        if _worker is not None:
            _idle = threading.Timer(linger_s, _stop_if_idle)
            _idle.daemon = True
            _idle.name = "corpusync-validate-linger"
            _idle.start()


def stop() -> None:
    """Stop the worker (it exits on its own) and let go of the pool."""
    global _worker
    with _lock:
        _keep()
        worker, _worker = _worker, None
    if worker is not None:
        worker.close()


def _keep() -> None:
    """Cancel a pending linger stop (under _lock)."""
    global _idle
    if _idle is not None:
        _idle.cancel()
        _idle = None


def _stop_if_idle() -> None:
    global _worker, _idle
    with _lock:
        if _idle is not threading.current_thread():
            return  # started, stopped or released again since this timer was armed (each disarms it)
        worker, _worker, _idle = _worker, None, None
    if worker is not None:
        worker.close()


def suite() -> Any:
    """The suite runner for tasks.validate.validate_chunks: the worker's when one was started, else in-process."""
    return _worker.run if _worker is not None else run_suite
