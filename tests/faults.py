"""Fault injection for the parse worker (module-level, so it can be pickled into the worker process)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from schemas.records import ParsedDocument, SourceFile
from tasks.parse import ParseOptions, parse_document


def crashing_parser(src: SourceFile, options: ParseOptions) -> ParsedDocument:
    """Segfaults on files named *crash*, hangs on *hang*, allocates without bound on *hog*; else parses."""
    if "crash" in src.path:
        os.kill(os.getpid(), signal.SIGSEGV)
    if "hang" in src.path:
        time.sleep(3600)
    if "hog" in src.path:
        # 64 GiB of address space: past any memory limit. bytes() is calloc'd, so no page is touched: the
        # limit is on address space, and zero-filling 2 GiB took more than the test's 8 s deadline on a busy
        # machine (the hog then read as a timeout)
        hog = [bytes(64 * 1024 * 1024) for _ in range(1000)]
        del hog
    return parse_document(src, options)


def _arm_setrlimit_fault() -> SetrlimitRefused:
    """Runs where the parse function is unpickled, i.e. only inside a worker process: setrlimit fails there."""
    import resource

    def refuse(*args: object) -> None:
        raise ValueError("not allowed to raise maximum limit")

    resource.setrlimit = refuse  # type: ignore[assignment]
    return SetrlimitRefused()


class SetrlimitRefused:
    """A parse function that makes resource.setrlimit fail in the worker it is sent to (and crashes on
    *crash*, hangs on *hang*, like crashing_parser)."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _arm_setrlimit_fault, ()

    def __call__(self, src: SourceFile, options: ParseOptions) -> ParsedDocument:
        return crashing_parser(src, options)


def scramble_parses(monkeypatch: Any, spare: str | None = None) -> None:
    """Fault injection: a 'parser upgrade' that scrambles every document's characters (but `spare`'s), so
    the evaluation gate refuses the candidate. In-process: needs CORPUSYNC_PARSE_ISOLATION=false."""
    import random

    from tasks import parse as parse_stage

    original = parse_stage.parse_document

    def broken(src: SourceFile, options: ParseOptions) -> ParsedDocument:
        doc = original(src, options)
        if src.path == spare:
            return doc
        rnd = random.Random(src.sha256)
        blocks = []
        for b in doc.blocks:
            chars = list(b.text)
            rnd.shuffle(chars)
            blocks.append(type(b)(b.kind, "".join(chars), b.page, b.level))
        doc.blocks = blocks
        return doc

    monkeypatch.setattr(parse_stage, "parse_document", broken)
    monkeypatch.setattr(parse_stage, "parser_fingerprint", lambda *a: "scrambling-parser-2.0")


def exit_process(*_args: object) -> None:
    """A worker function that kills the process running it (a crashed worker, as the pool sees it)."""
    import os

    os._exit(3)


def rewriting_parser(src: SourceFile, options: ParseOptions) -> ParsedDocument:
    """Appends a sentence to files named *rewritten* before parsing them, as a user saving the file while the
    refresh runs would (after discover hashed it); else parses."""
    if "rewritten" in src.path:
        with src.abs_path.open("a", encoding="utf-8") as fh:
            fh.write("\n\nA sentence saved while the refresh ran.\n")
    return parse_document(src, options)
