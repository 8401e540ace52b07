"""Parse documents in a separate process, so a parser that crashes (PyMuPDF can segfault on malformed
files), hangs or eats memory costs one document, not the run.

One long-lived worker serves a whole refresh (the OCR models load once); when it dies or times out it is
killed and a fresh one takes the next document. The memory limit is an address-space rlimit set inside
the worker (Linux/macOS).
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from corpusync.errors import ParseError
from schemas.records import ParsedDocument, SourceFile
from tasks.parse import ParseOptions, parse_document

ParseFn = Callable[[SourceFile, ParseOptions], ParsedDocument]


def _serve(conn: Connection, options: ParseOptions, memory_mb: int, parse: ParseFn) -> None:
    if memory_mb > 0:
        try:
            import resource

            limit = memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass  # not supported here: run without the limit
    from corpusync.offline import apply_offline_defaults

    apply_offline_defaults()
    while True:
        try:
            src = conn.recv()
        except EOFError:
            return
        if src is None:
            return
        try:
            conn.send(("ok", parse(src, options)))
        except ParseError as exc:
            conn.send(("err", (exc.reason, exc.detail)))
        except MemoryError:
            conn.send(("err", ("out-of-memory", f"parsing exceeded the worker's memory limit of {memory_mb} MiB")))


class ParseWorker:
    """`parse(src)` returns a ParsedDocument or raises ParseError (timeout / crashed / the parser's own)."""

    def __init__(self, options: ParseOptions, timeout_s: float, memory_mb: int,
                 parse: ParseFn = parse_document) -> None:
        """`parse` must be a module-level function (it is pickled into the worker); tests pass one that
        injects crashes and hangs."""
        self.options = options
        self.parse_fn = parse
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self._ctx = mp.get_context("spawn")  # never fork a process that holds threads and connections
        self._proc: Any = None
        self._conn: Connection | None = None
        self.restarts = 0

    def _start(self) -> Connection:
        if self._proc is None or not self._proc.is_alive():
            parent, child = self._ctx.Pipe()
            self._proc = self._ctx.Process(target=_serve, args=(child, self.options, self.memory_mb, self.parse_fn),
                                           name="corpusync-parse", daemon=True)
            self._proc.start()
            child.close()
            self._conn = parent
        assert self._conn is not None
        return self._conn

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
            self._proc = None
            self.restarts += 1
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def parse(self, src: SourceFile) -> ParsedDocument:
        conn = self._start()
        try:
            conn.send(src)
            if not conn.poll(self.timeout_s):
                self._kill()
                raise ParseError(src.path, "timeout", f"parsing took longer than {self.timeout_s:g} s; the "
                                 "worker was stopped (raise CORPUSYNC_PARSE_TIMEOUT_S for very large files)")
            status, payload = conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            code = None
            if self._proc is not None:
                self._proc.join(5)
                code = self._proc.exitcode
            self._kill()
            how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            raise ParseError(src.path, "crashed", f"the parser process died ({how}) on this file") from None
        if status == "ok":
            return payload
        reason, detail = payload
        raise ParseError(src.path, reason, detail)

    def close(self) -> None:
        if self._proc is not None and self._proc.is_alive() and self._conn is not None:
            try:
                self._conn.send(None)
                self._proc.join(5)
            except (BrokenPipeError, OSError):
                pass
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._proc = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> ParseWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
