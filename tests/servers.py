"""Real servers the tests start (Prefect's API): wait until one answers its health check; give a fresh Prefect
home a database that is already migrated."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx

# The database file of a Prefect home (Prefect's default PREFECT_SERVER_DATABASE_CONNECTION_URL)
PREFECT_DB = "prefect.db"


def migrated_prefect_db(folder: Path) -> Path:
    """A Prefect SQLite database migrated to this Prefect's head, made once in `folder` (shared by the pytest
    workers: the first makes it under a lock, the others wait and reuse it). A fresh Prefect server migrates
    its database as it starts: ~14 s of CPU on 2 cores, paid by every server the suite starts on a new home."""
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / PREFECT_DB
    with (folder / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "done").is_file():
            env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
            env |= {"PREFECT_HOME": str(folder), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
            proc = subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
                                  env=env, capture_output=True, text=True, timeout=600, check=False)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
            (folder / "done").touch()
    return db


def seed_prefect_db(template: Path, dest: Path) -> Path:
    """Copy the migrated database to `dest` (a Prefect home's prefect.db, or a harness's file): the server that
    starts on it finds it at head and migrates nothing. SQLite's backup API, so the copy is whole whatever the
    template's journal holds."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(template)) as src, closing(sqlite3.connect(dest)) as out:
        src.backup(out)
    return dest


def wait_for_health(server: subprocess.Popen[Any], url: str, log: Path, timeout_s: float) -> None:
    """Poll `url` until it answers 200; fail with the server's log when it exits or takes too long."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{url} did not answer in {timeout_s:.0f} s"
        time.sleep(0.5)
