"""Fault injection for the parse worker (module-level, so it can be pickled into the worker process)."""

from __future__ import annotations

import os
import signal
import time

from schemas.records import ParsedDocument, SourceFile
from tasks.parse import ParseOptions, parse_document


def crashing_parser(src: SourceFile, options: ParseOptions) -> ParsedDocument:
    """Segfaults on files named *crash*, hangs on *hang*, allocates without bound on *hog*; else parses."""
    if "crash" in src.path:
        os.kill(os.getpid(), signal.SIGSEGV)
    if "hang" in src.path:
        time.sleep(3600)
    if "hog" in src.path:
        hog = [bytearray(64 * 1024 * 1024) for _ in range(1000)]  # 64 GiB: past any memory limit
        del hog
    return parse_document(src, options)
