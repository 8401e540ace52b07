"""Readers during a publish never see a half-updated corpus. (A refresh killed with SIGKILL mid-load, and its
convergence, is tests/test_fault_campaign.py's `load-mid` kill round.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from corpusync.store import db
from tests.test_refresh_flow import live, run

pytestmark = [pytest.mark.flow, pytest.mark.db, pytest.mark.slow]

SNAPSHOT = """SELECT source_path, version_id, count(*), min(gen_from)
              FROM corpusync.live_chunks GROUP BY source_path, version_id"""


def test_reader_never_sees_a_half_updated_corpus(prefect_harness, settings, corpus: Path, conn) -> None:  # type: ignore[no-untyped-def]
    run(settings, corpus)
    paths = set(live(conn))
    for p in corpus.rglob("*"):
        if p.is_file():
            p.write_text(p.read_text(encoding="utf-8") + "\n\n追加的段落 appended paragraph.\n", encoding="utf-8")
    stop = threading.Event()
    seen: list[tuple[int, ...]] = []
    errors: list[str] = []

    def reader() -> None:
        with db.connection(settings.database_dsn(), autocommit=True) as rc:
            while not stop.is_set():
                rows = rc.execute(SNAPSHOT).fetchall()
                by_path: dict[str, int] = {}
                for path, _version, _n, _gen in rows:
                    by_path[path] = by_path.get(path, 0) + 1
                mixed = [p for p, versions in by_path.items() if versions > 1]
                missing = paths - set(by_path)
                if mixed or missing:
                    errors.append(f"mixed={mixed} missing={missing}")
                seen.append(tuple(sorted({r[3] for r in rows})))

    t = threading.Thread(target=reader)
    t.start()
    try:
        summary = run(settings, corpus)
    finally:
        time.sleep(0.2)
        stop.set()
        t.join()
    assert summary["published"] and summary["documents"]["changed"] == len(paths)
    assert not errors, errors[:3]
    assert len(seen) > 10, "the reader should have run many snapshots during the refresh"
    assert seen[0] == (1,) and seen[-1] == (2,), "readers moved from generation 1 to 2 in one step"
