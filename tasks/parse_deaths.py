"""When a parse worker dies: the documents pebble loses track of, and a certain verdict on suspects.

pebble reads its workers' messages (a document taken, a result) in one thread and notices dead workers in
another. When the message thread is behind (a busy machine), the manager thread sees a worker dead before it
reads that the worker finished one document and took the next. It then blames the death on the finished
document (ProcessExpired), or, if it already read that result, on no document at all; and when it reads the
worker took the next one, that document is 'running' on a worker that is gone, until its deadline (pebble
issue #153). So:

- WatchedPool.orphans() names the documents pebble has running on a worker it no longer has;
- a document pebble blames, and an orphan, is parsed alone (AloneRuns): in a process started for it and
  nothing else, which, if it dies before it answers, that document killed, its exit status saying how.

The other workers go on meanwhile: a death costs the documents it concerns, not the work in flight.
A process parsing alone runs the pool's initializer (memory limit, tied to the refresh's life, warm-up) and
says when it is ready; the document's clock starts then, as in the pool. It is multiprocessing's own Process
and Pipe: pebble's one-shot process (pebble.concurrent.process) starts its timeout before the warm-up.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from pebble import ProcessExpired, ProcessPool

from schemas.records import SourceFile
from tasks.parse_in_worker import init_worker, parse_one

_READY = "ready"
READY_WITHIN_S = 300.0  # spawn, imports and warm-up of a process parsing alone: a busy machine takes long, a
# pool worker has no limit on it at all (only the pool's stall grace); past this the process is stuck

log = logging.getLogger(__name__)


def _snapshot(mapping: dict[Any, Any]) -> tuple[tuple[Any, Any], ...]:
    """A dict's items, read while pebble's threads change it (as pebble reads its own)."""
    while True:
        try:
            return tuple(mapping.items())
        except RuntimeError:  # changed size while read: again
            continue


class WatchedPool(ProcessPool):
    """pebble's ProcessPool that can name its orphans: the futures of documents it has running on a worker it
    no longer has. It reads pebble's own records of its tasks and workers (PoolManager.task_manager.tasks,
    worker_manager.workers); `watched` is False, with a warning, should a pebble release keep them elsewhere
    (an orphan then waits out its deadline, as in pebble)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        manager = getattr(self, "_pool_manager", None)
        self._records = (getattr(getattr(manager, "task_manager", None), "tasks", None),
                         getattr(getattr(manager, "worker_manager", None), "workers", None))
        self.watched = all(isinstance(r, dict) for r in self._records)
        if not self.watched:
            log.warning("parse pool: this pebble release keeps its tasks and workers elsewhere; a document left "
                        "running on a dead worker is found only at its deadline")

    def orphans(self) -> dict[Future[Any], int]:
        """The futures, not done, of documents pebble has taken by a worker that is no longer in its pool, with
        that worker's pid."""
        tasks, workers = self._records
        if not self.watched or not tasks:
            return {}
        taken = [task for _, task in _snapshot(tasks) if task.worker_id]
        alive = {pid for pid, _ in _snapshot(workers)}  # type: ignore[arg-type]  # after: a worker precedes its tasks
        return {task.future: task.worker_id for task in taken
                if task.worker_id not in alive and not task.future.done()}


def _alone(conn: Connection, initargs: tuple[Any, ...], src: SourceFile, pages_at_most: int | None) -> None:
    """The process: initialise as a pool worker would, say so, parse, answer. A parser's unexpected exception
    is the answer (as pebble hands it back from a pool worker), not a death."""
    init_worker(*initargs)
    conn.send(_READY)
    try:
        answer: object = parse_one(src, pages_at_most)
    except Exception as exc:
        answer = exc
    try:
        conn.send(answer)
    except Exception:  # a parser's exception that does not pickle: its type and message
        conn.send(RuntimeError(f"{type(answer).__name__}: {answer}"))
    conn.close()


class AloneRuns:
    """Parses documents alone (`submit`: in a daemon thread, so the caller goes on, and a run still going
    does not hold up the interpreter's exit) and stops the processes still running when the pool closes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[Any] = set()
        self._closed = False

    def submit(self, src: SourceFile, pages_at_most: int | None, deadline_s: float,
               initargs: tuple[Any, ...]) -> Future[tuple[str | None, tuple[Any, ...]]]:
        """`parse` in a thread of its own; its future."""
        future: Future[tuple[str | None, tuple[Any, ...]]] = Future()
        future.set_running_or_notify_cancel()

        def run() -> None:
            try:
                future.set_result(self.parse(src, pages_at_most, deadline_s, initargs))
            except BaseException as exc:  # the caller's to judge, as with a pebble future
                future.set_exception(exc)

        threading.Thread(target=run, name="corpusync-parse-alone", daemon=True).start()
        return future

    def parse(self, src: SourceFile, pages_at_most: int | None, deadline_s: float,
              initargs: tuple[Any, ...]) -> tuple[str | None, tuple[Any, ...]]:
        """What parse_one returned in the process, as a pebble future would give it; raises what the parser
        raised, ProcessExpired (with the exit status) when the process died before it answered, TimeoutError
        when it took longer than `deadline_s` after it was ready, or longer than READY_WITHIN_S to get ready
        (its warm-up is not the document's time: under load it can take longer than a short deadline)."""
        ctx = mp.get_context("spawn")  # never fork a process with threads
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_alone, args=(writer, initargs, src, pages_at_most), daemon=True,
                           name="corpusync-parse-alone")
        with self._lock:
            if self._closed:
                raise RuntimeError("the parse pool is closed")
            proc.start()
            self._running.add(proc)
        writer.close()  # the child holds the only write end: its death reads as EOF
        try:
            for wait_s in (max(deadline_s, READY_WITHIN_S), deadline_s):  # ready (its clock starts), the result
                if not reader.poll(wait_s):
                    raise TimeoutError("Task timeout", wait_s)
                answer = reader.recv()
            if isinstance(answer, BaseException):
                raise answer
            return answer
        except EOFError:
            proc.join()
            raise ProcessExpired("Abnormal termination", code=proc.exitcode, pid=proc.pid) from None
        finally:
            if proc.is_alive():
                proc.kill()
            proc.join()
            reader.close()
            with self._lock:
                self._running.discard(proc)

    def close(self) -> None:
        """Stop every process still running (its caller then sees it die)."""
        with self._lock:
            self._closed = True
            running = list(self._running)
        for proc in running:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=5)  # gone before its warm-up folder is removed
