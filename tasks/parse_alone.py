"""Parse one document in a process of its own, started for it alone: the verdict on a document the pool
suspects. pebble's pool can blame a worker's death on the wrong document: its manager thread may see the
dead worker before its message thread has read that the worker finished one document and took the next, so
the death lands on the finished one and the next is left 'running' on a dead worker until its deadline
(pebble issue #153). A process that is given one document and nothing else has no such doubt: if it dies
before it answers, that document killed it, and its exit status says how.

The process runs the pool's initializer (memory limit, tied to the refresh's life, warm-up) and says when it
is ready; the document's clock starts then, as in the pool. It is multiprocessing's own Process and Pipe:
pebble's one-shot process (pebble.concurrent.process) starts its timeout before the warm-up.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from pebble import ProcessExpired

from schemas.records import SourceFile
from tasks.parse_in_worker import init_worker, parse_one

_READY = "ready"


def _alone(conn: Connection, initargs: tuple[Any, ...], src: SourceFile, pages_at_most: int | None) -> None:
    """The process: initialise as a pool worker would, say so, parse, answer."""
    init_worker(*initargs)
    conn.send(_READY)
    conn.send(parse_one(src, pages_at_most))
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
        """What parse_one returned in the process, as a pebble future would give it; raises ProcessExpired
        (with the exit status) when the process died before it answered, TimeoutError when it took longer
        than `deadline_s` after it was ready (or to get ready)."""
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
            for _ in range(2):  # ready (its clock starts), then the result
                if not reader.poll(deadline_s):
                    raise TimeoutError("Task timeout", deadline_s)
                answer: tuple[str | None, tuple[Any, ...]] = reader.recv()
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
