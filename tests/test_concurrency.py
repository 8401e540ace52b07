"""Readers during a publish, and a refresh killed with SIGKILL mid-run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from corpusync import db
from tests.conftest import REPO, _db_url
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


def _kill_during_load(settings: Any, corpus: Path, api_url: str) -> bool:
    """Start a refresh in another process; SIGKILL it once its candidate generation exists."""
    env = dict(os.environ, PREFECT_API_URL=api_url, CORPUSYNC_DATABASE_URL=settings.database_dsn(),
               CORPUSYNC_HOME=str(settings.home), CORPUSYNC_CHUNK_MAX_TOKENS=str(settings.chunk_max_tokens),
               PREFECT_LOGGING_LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "flows.refresh", str(corpus), "--quiet"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed = False
    try:
        with db.connection(settings.database_dsn(), autocommit=True) as c:
            deadline = time.monotonic() + 240
            while proc.poll() is None and time.monotonic() < deadline:
                row = c.execute("SELECT count(*) FROM corpusync.generations WHERE status = 'candidate'").fetchone()
                if row and row[0]:
                    os.kill(proc.pid, signal.SIGKILL)
                    killed = True
                    break
                time.sleep(0.005)
    finally:
        if proc.poll() is None and not killed:
            proc.kill()
        proc.wait()
    return killed


def test_kill_9_mid_refresh_converges(prefect_harness, pg_server: str, settings, corpus: Path,  # type: ignore[no-untyped-def]
                                      conn: psycopg.Connection) -> None:
    from prefect.settings import PREFECT_API_URL

    run(settings, corpus)
    before = live(conn)
    killed = False
    for attempt in range(3):
        for p in sorted(corpus.rglob("*.txt")) + sorted(corpus.rglob("*.md")):
            p.write_text(p.read_text(encoding="utf-8") + f"\n\n第{attempt}次修改 edit {attempt}.\n", encoding="utf-8")
        killed = _kill_during_load(settings, corpus, PREFECT_API_URL.value())
        if killed:
            break
        run(settings, corpus)  # it finished before we could kill it: converge and try again
        before = live(conn)
    if not killed:
        pytest.skip("the refresh always finished before its candidate could be observed")
    assert live(conn) == before, "a killed refresh leaves the published generation intact"
    assert conn.execute("SELECT status FROM corpusync.runs ORDER BY id DESC LIMIT 1").fetchone() == ("running",)
    summary = run(settings, corpus)
    assert summary["published"]
    assert "recovered from an interrupted run" in summary["message"]
    crashed = conn.execute("SELECT count(*) FROM corpusync.runs WHERE status = 'crashed'").fetchone()
    assert crashed == (1,)
    converged = live(conn)
    # the same content as an uninterrupted refresh into a fresh index
    name = f"f_{uuid.uuid4().hex[:12]}"
    with db.connection(pg_server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE corpusync_template')  # generated name
    try:
        fresh = settings.model_copy(update={"database_url": _db_url(pg_server, name)})
        run(fresh, corpus)
        with db.connection(fresh.database_dsn(), autocommit=True) as fc:
            assert live(fc) == converged
    finally:
        with db.connection(pg_server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    orphans = conn.execute("SELECT count(*) FROM corpusync.document_versions WHERE gen_from > "
                           "corpusync.published_generation()").fetchone()
    assert orphans == (0,)
