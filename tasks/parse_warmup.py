"""Warm-up of the parse pool's workers: each parses a tiny sample of every format its batch holds before it
takes a document, so imports never count against a document's deadline. The samples go in a folder per
refresh, named after its pid; a pool about to start removes the folders of refreshes that are gone."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from schemas.records import SourceFile
from tasks.parse import ParseOptions, parse_document

WARM_DIR_PREFIX = "corpusync-warm-"  # + the refresh's pid: the folder of its pool's warm-up samples


def remove_orphaned_warm_dirs() -> None:
    """The warm-up folders of refreshes that are gone (SIGKILLed: no clean-up ran), this user's only."""
    for path in Path(tempfile.gettempdir()).glob(f"{WARM_DIR_PREFIX}*-*"):
        pid = path.name[len(WARM_DIR_PREFIX):].split("-", 1)[0]
        try:
            if not pid.isdigit() or path.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # alive under another user (PermissionError), or the folder just went
            continue


def new_warm_dir() -> str:
    """A pool's warm-up folder (its workers' samples go in subfolders), after the orphans are removed."""
    remove_orphaned_warm_dirs()
    return tempfile.mkdtemp(prefix=f"{WARM_DIR_PREFIX}{os.getpid()}-")


def warm_up(kinds: tuple[str, ...], folder: Path, options: ParseOptions) -> None:
    """Parse a tiny sample of each kind, so the parser modules (unstructured's ~3 s import, PyMuPDF) are
    loaded before the worker takes a document whose clock is running. The samples go in `folder`, under the
    pool's own temporary folder: the pool removes it as it stops, even when it kills a worker warming up."""
    import hashlib
    from datetime import UTC, datetime

    samples: dict[str, bytes] = {"txt": b"Warm-up.\n", "md": b"# Warm-up\n\nA paragraph.\n"}
    if "pdf" in kinds:
        import pymupdf

        pdf = pymupdf.open()
        pdf.new_page().insert_text((72, 72), "Warm-up.")
        samples["pdf"] = pdf.tobytes()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        for kind in ("txt", *kinds):
            path = folder / f"warm-up.{kind}"
            path.write_bytes(samples[kind])
            src = SourceFile(path.name, path, len(samples[kind]), datetime.now(UTC),
                             hashlib.sha256(samples[kind]).hexdigest())
            parse_document(src, options)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
